"""Training Medusa heads and EAGLE-3 modules on a frozen base model (the [train] extra: torch, transformers).

``load_heads`` lives in ``formats/heads.py`` (numpy only; the builder reads head checkpoints with it) and is
re-exported here, where specdec-train's model cards tell users to find it.
"""

from ..formats.heads import HeadCheckpoint, default_eagle_aux_layer_ids, load_heads  # noqa: F401
