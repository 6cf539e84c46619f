"""What differs between training Medusa heads and an EAGLE-3 module, one class per mode.

The loop in trainer.py is mode-blind: it asks ``RUNS[cfg.mode]`` to check the
mode's flags and the base, then drives the run's ``forward`` (loss and top-1
hits per head or depth) and asks it how to export, log and describe what it
trained. Adding a mode is a class here and a line in ``RUNS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from ..formats.heads import PLACEHOLDER_FORMS, REFINE_KEY, TRUTH_TOKENS_KEY, default_eagle_aux_layer_ids
from .base import decoder_layers, run_base
from .data import Sequence
from .eagle import Eagle3Module, eagle_inputs, eagle_llama_config, eagle_loss, eagle_targets
from .errors import TrainConfigError
from .export import eagle_config, medusa_config, peagle_config
from .medusa import DECAY_COEFFICIENT, HEADS_COEFFICIENT, MedusaHeads, medusa_loss
from .peagle import GATES, PEagleModule, batch_generator, parallel_layout, peagle_loss, reading_blocks

if TYPE_CHECKING:
    from .trainer import TrainConfig


def collate(seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and loss mask (real tokens after the prompt), each [batch, longest]."""
    t = max(len(s.ids) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    attn = torch.zeros(len(seqs), t, dtype=torch.bool)
    for r, s in enumerate(seqs):
        ids[r, : len(s.ids)] = torch.tensor(s.ids)
        attn[r, : len(s.ids)] = True
    loss_mask = attn & (torch.arange(t).unsqueeze(0) >= torch.tensor([s.prompt_len for s in seqs]).unsqueeze(1))
    return ids, attn, loss_mask


class Run:
    """The heads of one mode on a frozen base: their loss, accuracy, export and description."""

    mode: ClassVar[str]
    flags: ClassVar[tuple[str, ...]]  # the mode's own settings (TrainConfig fields, run's flags): refused with another mode
    aux_ids: list[int] | None = None  # the base layers whose outputs the heads read (None: the last hidden state)
    heads: nn.Module

    @staticmethod
    def counts(cfg: TrainConfig) -> dict[str, int]:
        """This mode's flags that must be >= 1, by name."""
        raise NotImplementedError

    @staticmethod
    def check_config(cfg: TrainConfig) -> None:
        """Refuse this mode's other flags that no file is needed to judge."""

    @staticmethod
    def check_base(cfg: TrainConfig, base_cfg: dict) -> None:
        """Refuse flags that do not fit the base's config.json (read before the base's weights load)."""

    def __init__(self, cfg: TrainConfig, base: nn.Module):
        self.cfg, self.base = cfg, base

    @property
    def params(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.heads.named_parameters() if p.requires_grad]

    def forward(self, seqs: list[Sequence]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Loss of one batch, and (correct, counted) top-1 per head or drafting depth."""
        raise NotImplementedError

    @torch.no_grad()
    def accuracy(self, seqs: list[Sequence], batch_size: int) -> list[float]:
        totals: list[list[int]] | None = None
        for i in range(0, len(seqs), batch_size):
            _, hits = self.forward(seqs[i : i + batch_size])
            totals = [[a + c, b + n] for (a, b), (c, n) in zip(totals, hits, strict=True)] if totals else [list(h) for h in hits]
        return [c / n if n else float("nan") for c, n in totals or []]

    def export_config(self, base_cfg: dict, provenance: dict) -> dict:
        """The config.json saved beside the heads (ModelOpt's layout)."""
        raise NotImplementedError

    def provenance(self) -> dict:
        """This mode's entries in the run's provenance (config.json's specdec_train, training_log.json)."""
        return {"eagle_aux_hidden_state_layer_ids": self.aux_ids}  # in every provenance: null for Medusa

    def loss_description(self) -> str:
        """The loss, in words, for the loss curve's title."""
        raise NotImplementedError

    def card(self) -> tuple[str, str, str]:
        """For the model card: what was trained, what the accuracy figures are, and the flags that shaped it."""
        raise NotImplementedError


class MedusaRun(Run):
    mode = "medusa"
    flags = ("medusa_num_heads", "medusa_num_layers")

    @staticmethod
    def counts(cfg: TrainConfig) -> dict[str, int]:
        return {"medusa_num_heads": cfg.medusa_num_heads}

    @staticmethod
    def check_config(cfg: TrainConfig) -> None:
        if cfg.medusa_num_layers < 0:
            raise TrainConfigError(f"--medusa_num_layers {cfg.medusa_num_layers} must be >= 0.")

    def __init__(self, cfg: TrainConfig, base: nn.Module):
        super().__init__(cfg, base)
        torch.manual_seed(cfg.seed)
        lm_head = base.get_output_embeddings().weight
        self.heads = MedusaHeads(base.config.hidden_size, base.config.vocab_size, cfg.medusa_num_heads, cfg.medusa_num_layers, lm_head)

    def forward(self, seqs: list[Sequence]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        ids, attn, loss_mask = collate(seqs)
        out = run_base(self.base, ids, attn, None)
        return medusa_loss(self.heads, out.last_hidden, ids, loss_mask, HEADS_COEFFICIENT, DECAY_COEFFICIENT)

    def export_config(self, base_cfg: dict, provenance: dict) -> dict:
        return medusa_config(base_cfg, self.cfg.medusa_num_heads, self.cfg.medusa_num_layers, provenance)

    def loss_description(self) -> str:
        return "sum of 0.2 x 0.8^i x CE of head i"

    def card(self) -> tuple[str, str, str]:
        cfg = self.cfg
        what = (f"{cfg.medusa_num_heads} Medusa heads of {cfg.medusa_num_layers} residual block(s) each; head i predicts "
                f"token t+2+i from the base's last hidden state")
        return what, "top-1 per head (head 0 = t+2)", f"--medusa_num_heads {cfg.medusa_num_heads} --medusa_num_layers {cfg.medusa_num_layers}"


class EagleRun(Run):
    mode = "eagle"
    flags = ("eagle_num_layers", "eagle_aux_layer_ids", "eagle_ttt_steps", "eagle_loss_decay_factor")

    @staticmethod
    def counts(cfg: TrainConfig) -> dict[str, int]:
        return {"eagle_num_layers": cfg.eagle_num_layers, "eagle_ttt_steps": cfg.eagle_ttt_steps}

    @staticmethod
    def check_config(cfg: TrainConfig) -> None:
        if not 0 < cfg.eagle_loss_decay_factor <= 1:
            raise TrainConfigError(f"--eagle_loss_decay_factor {cfg.eagle_loss_decay_factor} must be in (0, 1] (1: every TTT step weighs the same).")

    @staticmethod
    def check_base(cfg: TrainConfig, base_cfg: dict) -> None:
        num_layers = base_cfg.get("num_hidden_layers")
        if cfg.eagle_aux_layer_ids and num_layers and max(cfg.eagle_aux_layer_ids) >= num_layers:
            raise TrainConfigError(f"--eagle_aux_layer_ids {sorted(set(cfg.eagle_aux_layer_ids))}: the base model has layers 0..{num_layers - 1} "
                                   "only.")

    @staticmethod
    def aux_layer_ids(cfg: TrainConfig, base: nn.Module) -> list[int]:
        """The base layers whose outputs feed the module: the ones asked for, else EAGLE-3's default three."""
        n_layers = len(decoder_layers(base))
        aux_ids = sorted(set(cfg.eagle_aux_layer_ids)) if cfg.eagle_aux_layer_ids else default_eagle_aux_layer_ids(n_layers)
        if max(aux_ids) >= n_layers:
            raise TrainConfigError(f"--eagle_aux_layer_ids {aux_ids}: the base model has layers 0..{n_layers - 1} only.")
        return aux_ids

    def __init__(self, cfg: TrainConfig, base: nn.Module):
        super().__init__(cfg, base)
        torch.manual_seed(cfg.seed)
        self.aux_ids = self.aux_layer_ids(cfg, base)
        self.eagle_cfg = eagle_llama_config(base.config, cfg.eagle_num_layers)
        self.heads = Eagle3Module(self.eagle_cfg, len(self.aux_ids), base.get_output_embeddings().weight)

    def forward(self, seqs: list[Sequence]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        ids, attn, loss_mask = collate(seqs)
        out = run_base(self.base, ids, attn, self.aux_ids)
        aux, next_embeds = eagle_inputs(ids, out.aux_hidden, self.base.get_input_embeddings())
        steps = self.heads.ttt_hidden(aux, next_embeds, attn[:, :-1], self.cfg.eagle_ttt_steps)  # each [batch, seq-1, hidden]
        targets = eagle_targets(out.last_hidden, self.base.get_output_embeddings(), loss_mask)
        losses, hits = [], []
        for j, hidden in enumerate(steps, start=1):  # every step against the same base distributions
            loss, h = eagle_loss(self.heads, hidden, out.last_hidden, self.base.get_output_embeddings(), loss_mask, step=j, targets=targets)
            losses.append(loss)
            hits.append(h)
        weights = torch.tensor([self.cfg.eagle_loss_decay_factor ** j for j in range(len(losses))])
        return (torch.stack(losses) * weights).sum() / weights.sum(), hits  # a weighted mean: one step = today's loss

    def export_config(self, base_cfg: dict, provenance: dict) -> dict:
        return eagle_config(base_cfg, self.eagle_cfg, self.aux_ids, provenance)

    def provenance(self) -> dict:
        return {**super().provenance(), "eagle_ttt_steps": self.cfg.eagle_ttt_steps, "eagle_loss_decay_factor": self.cfg.eagle_loss_decay_factor}

    def loss_description(self) -> str:
        return f"KL(base || EAGLE), mean of {self.cfg.eagle_ttt_steps} TTT step(s) weighted {self.cfg.eagle_loss_decay_factor}^(step - 1)"

    def card(self) -> tuple[str, str, str]:
        cfg = self.cfg
        what = (f"an EAGLE-3 module of {cfg.eagle_num_layers} decoder layer(s) over the base's layers "
                f"{self.aux_ids} and the next token's embedding; LM head = the base's, frozen"
                f"; trained with {cfg.eagle_ttt_steps} training-time-test step(s): step j feeds the module its own "
                f"step j-1 outputs as drafting depth j does, loss = the steps' mean weighted {cfg.eagle_loss_decay_factor}^(j-1)")
        acc_label = f"top-1 agreement with the base, per drafting depth 1..{cfg.eagle_ttt_steps} (TTT step j = depth j)"
        return what, acc_label, f"--eagle_num_layers {cfg.eagle_num_layers} --eagle_ttt_steps {cfg.eagle_ttt_steps}"


class PEagleRun(EagleRun):
    """P-EAGLE (train/peagle.py): EAGLE-3's module and features, ``peagle_depths`` positions drafted in one pass."""

    mode = "peagle"
    # no TTT: its depths are drafted in one pass
    flags = ("eagle_num_layers", "eagle_aux_layer_ids", "eagle_loss_decay_factor", "peagle_depths", "peagle_mask_token_id",
             "peagle_down_sample_ratio", "peagle_down_sample_ratio_min", "peagle_placeholders", "peagle_gate", "peagle_truth_tokens",
             "peagle_refine")

    @staticmethod
    def counts(cfg: TrainConfig) -> dict[str, int]:
        return {"eagle_num_layers": cfg.eagle_num_layers}  # (peagle_depths: at least 2, check_config)

    @staticmethod
    def check_config(cfg: TrainConfig) -> None:
        EagleRun.check_config(cfg)
        if cfg.peagle_depths < 2:
            raise TrainConfigError(f"--peagle_depths {cfg.peagle_depths} must be >= 2, the positions one call drafts (1 trains no placeholder: "
                                   "an EAGLE-3 module of one step, --mode eagle).")
        if not 0 < cfg.peagle_down_sample_ratio <= 1:
            raise TrainConfigError(f"--peagle_down_sample_ratio {cfg.peagle_down_sample_ratio} must be in (0, 1] (1: every anchor at every depth).")
        if not 0 <= cfg.peagle_down_sample_ratio_min <= 1:
            raise TrainConfigError(f"--peagle_down_sample_ratio_min {cfg.peagle_down_sample_ratio_min} must be in [0, 1].")
        if cfg.peagle_gate not in GATES:
            raise TrainConfigError(f"--peagle_gate {cfg.peagle_gate!r} is not one of {', '.join(GATES)}.")
        if cfg.peagle_placeholders not in PLACEHOLDER_FORMS:
            raise TrainConfigError(f"--peagle_placeholders {cfg.peagle_placeholders!r} is not one of {', '.join(PLACEHOLDER_FORMS)}.")
        if cfg.peagle_refine and cfg.peagle_truth_tokens:
            raise TrainConfigError("--peagle_refine trains a drafter (half its blocks reading the true tokens); --peagle_truth_tokens a bound "
                                   "whose blocks always read them: give one.")
        if cfg.peagle_mask_token_id is not None and cfg.peagle_mask_token_id < 0:
            raise TrainConfigError(f"--peagle_mask_token_id {cfg.peagle_mask_token_id} must be a token id >= 0.")

    @staticmethod
    def check_base(cfg: TrainConfig, base_cfg: dict) -> None:
        EagleRun.check_base(cfg, base_cfg)
        mask_token_id(cfg, base_cfg)

    def __init__(self, cfg: TrainConfig, base: nn.Module):
        Run.__init__(self, cfg, base)
        torch.manual_seed(cfg.seed)
        self.aux_ids = self.aux_layer_ids(cfg, base)
        self.mask_token_id = mask_token_id(cfg, base.config.to_dict())
        self.eagle_cfg = eagle_llama_config(base.config, cfg.eagle_num_layers)
        mask_embedding = base.get_input_embeddings().weight[self.mask_token_id]
        self.heads = PEagleModule(self.eagle_cfg, len(self.aux_ids), base.get_output_embeddings().weight, mask_embedding,
                                  anchored=cfg.peagle_placeholders == "anchored", placeholders=max(cfg.peagle_depths - 1, 1),
                                  reads_true_tokens=cfg.peagle_truth_tokens, refines=cfg.peagle_refine)

    def forward(self, seqs: list[Sequence]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        cfg = self.cfg
        ids, attn, loss_mask = collate(seqs)
        out = run_base(self.base, ids, attn, self.aux_ids)
        aux, next_embeds = eagle_inputs(ids, out.aux_hidden, self.base.get_input_embeddings())
        sampled = batch_generator(ids, cfg.seed) if torch.is_grad_enabled() else None  # the report keeps every anchor
        layout = parallel_layout(attn[:, :-1], loss_mask, cfg.peagle_depths, cfg.peagle_down_sample_ratio, cfg.peagle_down_sample_ratio_min, sampled)
        if cfg.peagle_refine and sampled is not None:  # (the report: every block blind, as a first call drafts)
            layout.reads = reading_blocks(layout, sampled)
        hidden = self.heads.parallel_hidden(aux, next_embeds, layout)  # [batch, T' + M, hidden]
        return peagle_loss(self.heads, hidden, layout, out.last_hidden, self.base.get_output_embeddings(), loss_mask,
                           cfg.peagle_depths, cfg.eagle_loss_decay_factor, cfg.peagle_gate)

    def export_config(self, base_cfg: dict, provenance: dict) -> dict:
        return peagle_config(base_cfg, self.eagle_cfg, self.aux_ids, self.mask_token_id, self.cfg.peagle_depths, provenance,
                             self.cfg.peagle_placeholders)

    def provenance(self) -> dict:
        cfg = self.cfg
        return {**Run.provenance(self), "peagle_depths": cfg.peagle_depths, "ptd_token_id": self.mask_token_id,
                "peagle_down_sample_ratio": cfg.peagle_down_sample_ratio, "peagle_down_sample_ratio_min": cfg.peagle_down_sample_ratio_min,
                "eagle_loss_decay_factor": cfg.eagle_loss_decay_factor, "peagle_gate": cfg.peagle_gate,
                **({TRUTH_TOKENS_KEY: True} if cfg.peagle_truth_tokens else {}),  # the builder refuses such a module
                **({REFINE_KEY: True} if cfg.peagle_refine else {})}  # --peagle_refine at run time requires it

    def loss_description(self) -> str:
        gated = "" if self.cfg.peagle_gate == "none" else f", each row gated ({self.cfg.peagle_gate}) by its block's earlier positions"
        gated += "; half the blocks' placeholders read the true tokens (--peagle_refine)" if self.cfg.peagle_refine else ""
        return (f"KL(base || P-EAGLE), mean of {self.cfg.peagle_depths} drafting positions weighted {self.cfg.eagle_loss_decay_factor}^(position - 1)"
                + gated)

    def card(self) -> tuple[str, str, str]:
        cfg = self.cfg
        what = (f"a P-EAGLE module (parallel drafting) of {cfg.eagle_num_layers} decoder layer(s) over the base's layers {self.aux_ids}: "
                f"EAGLE-3's module plus a learned placeholder (mask_hidden, with the embedding of token {self.mask_token_id}) that drafts "
                f"{cfg.peagle_depths} positions in one pass; placeholder anchors sampled per depth (ratio {cfg.peagle_down_sample_ratio:g}, "
                f"floor {cfg.peagle_down_sample_ratio_min:g}, nested); LM head = the base's, frozen")
        acc_label = f"top-1 agreement with the base, per drafting position 1..{cfg.peagle_depths} (every anchor)"
        gate = ("" if cfg.peagle_gate == "none" else f" --peagle_gate {cfg.peagle_gate}") + (" --peagle_refine" if cfg.peagle_refine else "")
        return what, acc_label, f"--eagle_num_layers {cfg.eagle_num_layers} --peagle_depths {cfg.peagle_depths}{gate}"


def mask_token_id(cfg: TrainConfig, base_cfg: dict) -> int:
    """The token whose (frozen) embedding placeholders read: --peagle_mask_token_id, else the base's pad token, else
    its first end-of-sequence token (a token the module rarely sees as a real next token)."""
    vocab = base_cfg.get("vocab_size")
    chosen = cfg.peagle_mask_token_id
    if chosen is None:
        eos = base_cfg.get("eos_token_id")
        chosen = next((c for c in (base_cfg.get("pad_token_id"), eos[0] if isinstance(eos, list) and eos else eos) if isinstance(c, int)), None)
        if chosen is None:
            raise TrainConfigError("the base model's config.json names no pad_token_id or eos_token_id: choose the placeholders' token with "
                                   "--peagle_mask_token_id.")
    if isinstance(vocab, int) and not 0 <= chosen < vocab:
        raise TrainConfigError(f"--peagle_mask_token_id {chosen} is outside the base model's vocabulary (0..{vocab - 1}).")
    return int(chosen)


RUNS: dict[str, type[Run]] = {run.mode: run for run in (MedusaRun, EagleRun, PEagleRun)}


def modes_of(flag: str) -> list[str]:
    """The modes whose run reads ``flag`` (a TrainConfig field); [] for the flags every mode reads."""
    return [mode for mode, run in RUNS.items() if flag in run.flags]
