"""TensorRT-LLM run.py command lines, pasted as they are.

run.py takes several prompts after one ``--input_text`` (argparse nargs="+"),
and has flags that tune things specdec does not have (a C++ or Python session,
a paged KV cache sized from free GPU memory). Such flags are accepted with a
one-line note saying why they do nothing here; beam search is refused in
words, since speculative decoding decodes one sequence per request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click

from ..formats.errors import RequestError

STATIC_CACHE = "the KV cache is static here (max_batch_size x max_seq_len, fixed at build time)"

# run.py flag -> (click type, or None for a flag without a value; why it does nothing here)
IGNORED: dict[str, tuple[Any, str]] = {
    "use_py_session": (None, "there is one runtime (no C++ / Python session to choose)"),
    "kv_cache_enable_block_reuse": (None, "prefix caching, its equivalent here, is on by default (--enable_prefix_caching / "
                                          "--no_enable_prefix_caching)"),
    "streaming_interval": (int, "--streaming prints after every verification round"),
    "run_profiling": (None, "time runs with --baseline --repeat N, or specdec-bench"),
    "debug_mode": (None, "specdec has no debug mode for engines"),
    "output_generation_logits": (None, "logits are not written out (--output_logits_npy is not supported)"),
    "kv_cache_free_gpu_memory_fraction": (float, STATIC_CACHE),
    "max_tokens_in_paged_kv_cache": (int, STATIC_CACHE),
    "enable_chunked_context": (None, "prompts are prefilled whole (up to the engine's max_input_len)"),
    "enable_context_fmha_fp32_acc": (None, "attention accumulates in float32 already"),
    "cuda_graph_mode": (None, "no CUDA graphs on this path"),
    "use_gpu_direct_storage": (None, "engines are read with ordinary file I/O"),
    "gpu_weights_percent": (float, "weights are loaded whole"),
    "no_prompt_template": (None, "no prompt template is ever applied: prompts are used as given"),
    "log_level": (str, "specdec prints errors and warnings only"),
}


def run_py_options(fn: Callable) -> Callable:
    """The ignored run.py flags and --num_beams, as hidden options of specdec-run."""
    for name, (kind, why) in IGNORED.items():
        flag = f"--{name}"
        if kind is None:
            fn = click.option(flag, name, is_flag=True, hidden=True, help=f"Ignored (TensorRT-LLM run.py): {why}.")(fn)
        else:
            fn = click.option(flag, name, type=kind, default=None, hidden=True, help=f"Ignored (TensorRT-LLM run.py): {why}.")(fn)
    return click.option("--num_beams", "num_beams", type=int, default=1, show_default=True,
                        help="Beam width: only 1 (speculative decoding decodes one sequence per request; no beam search).")(fn)


def check_run_py_options(kwargs: dict[str, Any]) -> None:
    """Pops the run.py-only options from ``kwargs``: a note per ignored flag given, an error for beams."""
    beams = kwargs.pop("num_beams", 1)
    for name, (_kind, why) in IGNORED.items():
        value = kwargs.pop(name, None)
        if value not in (None, False):
            click.echo(f"note: --{name} is ignored: {why}.", err=True)
    if beams != 1:
        raise RequestError(f"--num_beams {beams}: beam search is not supported. Speculative decoding (and specdec) decodes one "
                           "sequence per request, greedy or sampled; use --num_beams 1 (or leave it out).")


# run.py's options that take several values after one flag (argparse nargs="+"): click takes one value per flag
MANY_VALUES = ("input_text", "stop_words", "bad_words")
_NUMBER = re.compile(r"-\d+$|-\d*\.\d+$")  # argparse reads these as values, not options, and any argument with a space


def spread_many_values(args: list[str], names: tuple[str, ...] = MANY_VALUES) -> list[str]:
    """run.py's ``--stop_words " London" " chef"`` as click's ``--stop_words " London" --stop_words " chef"``: each bare
    value after one of these flags (up to the next option) gets the flag again, as argparse's nargs="+" reads them. A value
    after any other flag is left as it is (click refuses a stray one)."""
    flags = {f"--{n}" for n in names} | {f"--{n.replace('_', '-')}" for n in names}
    out: list[str] = []
    flag, first = None, False  # the many-values flag being read; whether its first value (click's own) is next
    for i, a in enumerate(args):
        if a == "--":
            return out + args[i:]
        if first:  # the flag's own value, whatever it looks like (click reads it so too)
            out.append(a)
            first = False
        elif a.startswith("-") and len(a) > 1 and not _NUMBER.match(a) and " " not in a:
            flag, first = (a, True) if a in flags else (None, False)  # --flag=value: one value, as argparse takes it
            out.append(a)
        elif flag is not None:
            out += [flag, a]
        else:
            out.append(a)
    return out


class RunPyCommand(click.Command):
    """A click command that reads run.py's several-values options as argparse does (``spread_many_values``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_many_values(list(args)))
