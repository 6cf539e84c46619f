"""specdec-train: make training data with the base model, then train Medusa heads or an EAGLE-3 module on it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from .common import clean_errors, option

if TYPE_CHECKING:
    from ..train.prepare import PrepareConfig

TRAIN_EXTRA = ("torch", "transformers", "safetensors", "tqdm")  # pyproject.toml's [train] extra (matplotlib is optional)
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _require_train_extra() -> None:
    import importlib

    for name in TRAIN_EXTRA:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            sys.exit(f"error: specdec-train needs the train extra ({name} is not installed): pip install 'specdec[train]' "
                     "(pin torch, e.g. torch==2.13.0, or pip pulls CUDA wheels).")


def _ids(value: str | None) -> list[int] | None:
    if value is None or not value.strip():
        return None
    from ..train.errors import TrainConfigError

    try:
        return [int(x) for x in value.replace("[", "").replace("]", "").split(",") if x.strip()]
    except ValueError:
        raise TrainConfigError(f"--eagle_aux_layer_ids {value!r}: expected comma-separated layer indices, e.g. 1,2,3.") from None


@click.group(context_settings=CONTEXT)
def main() -> None:
    """Train draft heads on a frozen base model (NVIDIA ModelOpt's speculative-decoding workflow).

    \b
    1. specdec-train prepare-data   the base model answers your prompts -> data.jsonl
    2. specdec-train run            Medusa heads, an EAGLE-3 or a P-EAGLE module trained on data.jsonl

    The result is saved in ModelOpt's export layout (docs/train-heads.md); build it with
    specdec-build --speculative_decoding_mode medusa --medusa_dir OUT (or eagle --eagle_dir OUT, peagle --peagle_dir OUT).
    """


def _refuse_other_modes_flags(mode: str) -> None:
    """A flag of another mode than --mode's would be dropped without a word: refused, as specdec-build refuses --eagle_dir
    without --speculative_decoding_mode eagle. Only flags given: a default is no one's choice."""
    from ..train.errors import TrainConfigError
    from ..train.runs import RUNS, modes_of

    if mode not in RUNS:  # TrainConfig.validate names the modes
        return
    ctx = click.get_current_context()
    for name in ctx.params:
        owners = modes_of(name)
        if owners and mode not in owners and ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            raise TrainConfigError(f"--{name} is a setting of --mode {' or '.join(owners)}, not of --mode {mode}: drop it, or train with "
                                   f"--mode {owners[0]}.")


@main.command("prepare-data", context_settings=CONTEXT)
@option("data_path", required=True, type=click.Path(),
        help="Prompts: a .txt (one per line) or a .jsonl (\"prompt\"/\"text\" or a user turn in \"conversations\").")
@option("output_path", required=True, type=click.Path(),
        help="The .jsonl to write: one conversation with the base's answer and its token ids per prompt.")
@option("model_dir", type=click.Path(),
        help="The base model (HF checkpoint with tokenizer.json): generates with transformers. With --engine_dir it gives only the tokenizer "
             "(needed where the engine has no tokenizer.json) and must be the engine's model.")
@option("engine_dir", type=click.Path(),
        help="A specdec engine of the base model: generates with ONNX Runtime (much faster than transformers), in place of --model_dir.")
@option("max_token", type=int, default=512, show_default=True, help="Most new tokens per answer.")
@option("max_prompt_tokens", type=int, default=None,
        help="Cut prompts to this many tokens [default: the engine's max_input_len; with transformers 512 or what fits].")
@option("temperature", type=float, default=0.0, show_default=True,
        help="0 = greedy (the tokens greedy verification compares drafts against); > 0 samples, for heads that will serve sampled requests.")
@option("top_k", type=int, default=0, show_default=True, help="With --temperature > 0: keep the k most likely tokens (0 = off).")
@option("top_p", type=float, default=1.0, show_default=True, help="With --temperature > 0: nucleus sampling (1 = off).")
@option("seed", type=int, default=0, show_default=True, help="Sampling seed (prompt i uses seed + i).")
@option("limit", type=int, default=None, help="Only the first N prompts.")
@option("num_threads", type=int, default=None, help="CPU threads [default: all cores].")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@clean_errors
def prepare_data_cmd(quiet: bool, **kwargs) -> None:
    """The base model answers a dataset's prompts; the answers are what the heads learn to predict."""
    _require_train_extra()
    from ..train.prepare import PrepareConfig, prepare_data

    cfg = PrepareConfig(**kwargs)
    prepare_data(cfg, say=click.echo, progress_bar=not quiet, generator=EngineGenerator if cfg.engine_dir else None)


class EngineGenerator:
    """specdec-train prepare-data's generator on a specdec engine (train/prepare.py's Generator): the runtime answers
    the prompts. It lives here, where the CLI puts the runtime and the trainer together, since train/ imports nothing
    of runtime/."""

    def __init__(self, cfg: PrepareConfig):
        from ..formats.tokenizer import Tokenizer
        from ..runtime import GenerationConfig, load_orchestrator
        from ..train.prepare import tokenizer_dir

        self.tokenizer = Tokenizer(tokenizer_dir(cfg.model_dir or cfg.engine_dir))
        self.orch = load_orchestrator(cfg.engine_dir, num_threads=cfg.num_threads)
        engine = self.orch.engine
        if engine.target.engine.config.extra.get("lora"):  # the answers are the fine-tune's; heads learn from --model_dir's hidden states
            click.echo(f"note: {cfg.engine_dir} merged LoRA adapters (extra.lora): these answers are the fine-tune's. Heads for it train on the "
                       "merged model: pass peft's merge_and_unload().save_pretrained(DIR) as specdec-train run --model_dir.", err=True)
        self.prompt_limit = engine.max_input_len
        eos = self.tokenizer.eos_token_id
        ends = (eos,) if eos is not None else tuple(engine.target.engine.config.model.eos_token_id)
        self._config = lambda i: GenerationConfig(max_output_len=cfg.max_token, end_ids=ends, sampling=cfg.sampling(i))

    def answer(self, prompts: list[list[int]], first_index: int) -> list[list[int]]:
        outputs, _ = self.orch.generate(prompts, self._config(first_index))
        return [o.output_ids for o in outputs]


@main.command("run", context_settings=CONTEXT)
@option("mode", required=True, type=str, help="medusa, eagle (EAGLE-3) or peagle (P-EAGLE: EAGLE-3's module drafting a whole block in one pass).")
@option("model", "--model_dir", required=True, type=click.Path(), help="The base model (HF checkpoint, safetensors). It stays frozen.")
@option("data", "--data_path", required=True, type=click.Path(),
        help="The .jsonl prepare-data wrote (or conversations to tokenize with the model's tokenizer.json).")
@option("output_dir", required=True, type=click.Path(), help="Where the heads, checkpoints, loss curve and model card go.")
@option("num_epochs", type=int, default=1, show_default=True, help="Passes over the data (ignored with --max_steps).")
@option("max_steps", type=int, default=None, help="Train exactly this many steps (with --resume: in all, at least the checkpoint's step).")
@option("lr", type=float, default=1e-5, show_default=True, help="AdamW learning rate (the guide's 1e-5 suits large models; tiny ones want ~1e-3).")
@option("lr_scheduler", type=click.Choice(["constant", "cosine"]), default="constant", show_default=True,
        help="After --warmup_steps. cosine decays to 0 over the steps, or over --max_time / --max_cpu_time when the budget ends "
             "first (a --resume'd run's budget, and its decay, start again).")
@option("warmup_steps", type=int, default=0, show_default=True, help="Linear warmup steps.")
@option("batch_size", type=int, default=4, show_default=True, help="Sequences per step.")
@option("training_seq_len", type=int, default=512, show_default=True, help="Sequences are cut to this many tokens.")
@option("save_steps", type=int, default=1000, show_default=True, help="Write checkpoint-N every N steps (and at the end).")
@option("medusa_num_heads", type=int, default=2, show_default=True, help="Medusa: heads; head i predicts token t+2+i.")
@option("medusa_num_layers", type=int, default=1, show_default=True, help="Medusa: residual blocks x + SiLU(Wx + b) per head.")
@option("eagle_num_layers", type=int, default=1, show_default=True, help="EAGLE: decoder layers of the draft module.")
@option("eagle_aux_layer_ids", type=str, default=None,
        help="EAGLE: base decoder layers whose outputs are fused, e.g. 1,15,28 [default: ModelOpt's {1, L//2-1, L-4}, clamped to the base's layers].")
@option("eagle_ttt_steps", type=int, default=3, show_default=True,
        help="EAGLE: training-time-test steps (ModelOpt's eagle_ttt_steps): step j feeds the module its own outputs as drafting "
             "depth j does, so depths 2.. are trained too; the report gives top-1 per depth. 1 = depth 1 only.")
@option("eagle_loss_decay_factor", type=float, default=0.9, show_default=True,
        help="EAGLE: TTT step j's loss weighs this^(j-1) (ModelOpt's eagle_loss_decay_factor): depth 1 matters most, every later depth needs it.")
@option("peagle_depths", type=int, default=8, show_default=True,
        help="P-EAGLE: drafting positions trained (the real pair, then depths-1 placeholders): the longest chain it drafts well in one call.")
@option("peagle_mask_token_id", type=int, default=None,
        help="P-EAGLE: the token whose embedding placeholder rows read [default: the base's pad token, else its end-of-sequence token].")
@option("peagle_down_sample_ratio", type=float, default=0.7, show_default=True,
        help="P-EAGLE: placeholder depth d trains on max(ratio^d, ratio_min) of the anchors (COD sampling: K depths for the price of ~2.4).")
@option("peagle_down_sample_ratio_min", type=float, default=0.2, show_default=True, help="P-EAGLE: the floor of that share.")
@option("peagle_gate", type=click.Choice(["none", "greedy", "soft"]), default="none", show_default=True,
        help="P-EAGLE: weigh drafting position j's loss by whether (greedy) or how likely (soft) the module's guesses at "
             "positions 1..j-1 of the same block were the base's top-1: what a round accepts, since position j counts only after them.")
@option("peagle_placeholders", type=click.Choice(["anchored", "constant"]), default="anchored", show_default=True,
        help="P-EAGLE: anchored = one learned vector per drafting depth, added to the anchor's features; constant = vLLM's one "
             "placeholder vector in place of features (read by vLLM speculators' P-EAGLE).")
@option("peagle_refine", is_flag=True,
        help="P-EAGLE: train half the blocks with their placeholders reading the true tokens, so that drafting may refine a "
             "block with more module calls that read its drafts (specdec-run --peagle_refine N); it still drafts in one call.")
@option("eval_fraction", type=float, default=0.0, show_default=True,
        help="Hold out this share of the sequences to report top-1 accuracy on (0: report on the training data).")
@option("eval_data", type=click.Path(), default=None,
        help="A separate .jsonl (from prepare-data) to report top-1 accuracy on, instead of --eval_fraction.")
@option("max_time", type=float, default=None, help="Stop (and save) after the step that passes this many seconds of training.")
@option("max_cpu_time", type=float, default=None,
        help="The same in CPU seconds of this process (all threads): a budget that a shared, busy machine does not stretch.")
@option("seed", type=int, default=0, show_default=True, help="Initialisation and data order.")
@option("resume", is_flag=True, help="Continue from the latest checkpoint-N in --output_dir (heads, optimizer, step).")
@option("overwrite_output_dir", is_flag=True,
        help="Delete a previous run's --output_dir and start over (only a run's output: never the current directory, --model or --data).")
@option("num_threads", type=int, default=None, help="CPU threads [default: all cores].")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@clean_errors
def run_cmd(quiet: bool, eagle_aux_layer_ids: str | None, **kwargs) -> None:
    """Train Medusa heads, an EAGLE-3 or a P-EAGLE module with the base model frozen (ModelOpt's launch.sh flags).

    A flag of another mode (--peagle_depths with --mode eagle, --eagle_ttt_steps with --mode peagle, a --medusa_* flag with
    eagle or peagle) is refused, not ignored."""
    _require_train_extra()
    _refuse_other_modes_flags(kwargs["mode"])
    from ..train.trainer import TrainConfig, train

    cfg = TrainConfig(eagle_aux_layer_ids=_ids(eagle_aux_layer_ids), **kwargs)
    result = train(cfg, say=click.echo, progress_bar=not quiet)
    acc = ", ".join(f"{a:.3f}" for a in result.accuracy)
    click.echo(f"trained {cfg.mode} for {result.steps} steps in {result.seconds:.0f} s: loss {result.final_loss:.4f}, top-1 {acc}; "
               f"saved to {result.output_dir}")


if __name__ == "__main__":
    main()
