"""specdec's ground floor: the formats and the contract that every other folder stands on, with numpy only.

The engine directory's contract (what the builder writes and the runtime reads):

    engine_format.py   config.json's schema (ModelConfig, BuildConfig, EngineConfig), the engine directory, load_engine_dir
    typed_json.py      JSON into those dataclasses, every field type-checked
    file_stamps.py     the sha256 of every file, and the cache of verified stamps
    kv_layout.py       the KV cache's shape and size per layout
    tensorrt_plan.py   a TensorRT engine's file and optimization profile names
    config_strings.py  TensorRT-LLM's config strings ("[4,[0],[1],False]"), parsed without eval
    errors.py          specdec's exceptions: one line that says what was wrong and what to do

Inputs that several stages read:

    hf_config.py       a Hugging Face config.json's fields, checked
    safetensors_io.py  safetensors files read into numpy (bfloat16 widened, float8 as raw bits), no torch
    heads.py           the ModelOpt layout of Medusa heads and EAGLE-3 modules, and ``load_heads``
    tokenizer.py       a tokenizer.json (engine directories ship one), through ``tokenizers``
    jsonl.py           JSON-lines files (prompts, training data)

Nothing here imports another folder of specdec: builder/, runtime/, train/ and plugins/ import formats/ (and
hardware/, which stands on it), never each other's insides (tests/test_package_imports.py).
"""

__version__ = "0.1.0"  # specdec's version (pyproject.toml's; tests/test_package_metadata.py keeps the two equal)
