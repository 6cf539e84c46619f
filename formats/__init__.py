"""On-disk formats that the builder and the trainer both read, with numpy only.

    safetensors_io.py  safetensors files read into numpy (bfloat16 widened, float8 as raw bits), no torch
    heads.py           the ModelOpt layout of Medusa heads and EAGLE-3 modules, and ``load_heads``

They live here, not in ``builder/`` or ``train/``, so that neither of those
imports the other (tests/test_package_imports.py): the builder reads head
checkpoints that the trainer writes, and both read safetensors.
"""
