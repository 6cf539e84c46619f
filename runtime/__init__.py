"""specdec.runtime: load engine directories and run speculative decoding.

Imports nothing heavier than numpy, onnxruntime and tokenizers, so a host that
only runs engines needs neither torch nor transformers.
"""

__version__ = "0.1.0"

from .errors import SpecdecError  # noqa: E402,F401
