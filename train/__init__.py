"""Training Medusa heads and EAGLE-3 modules on a frozen base model (the [train] extra: torch, transformers).

``load_heads`` (layout.py) needs numpy only: the builder uses it to read head checkpoints.
"""

from .layout import HeadCheckpoint, default_eagle_aux_layer_ids, load_heads  # noqa: F401
