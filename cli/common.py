"""What the CLIs share: TensorRT-LLM flag spellings and one-line errors."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..formats.engine_format import VERIFY_MODES, EngineDir, check_decodes_alone
from ..formats.errors import RequestError, SpecdecError
from ..formats.tokenizer import Tokenizer
from ..hardware import cpu_kernels
from ..runtime.methods import method_names
from ..runtime.proposers.method import Flag, Method, get_method


def option(name: str, *more: str, **kwargs: Any) -> Callable:
    """A click option spelled the TensorRT-LLM way (``--max_seq_len``) with the dashed alias (``--max-seq-len``)."""
    flag = f"--{name}"
    names = [flag]
    if "_" in name:
        names.append(flag.replace("_", "-"))
    for extra in more:
        names.append(extra)
        if "_" in extra:
            names.append(extra.replace("_", "-"))
    return click.option(*names, name, **kwargs)


def drafting_methods() -> list[Method]:
    """The registered drafting methods (runtime/methods.py), each module imported."""
    return [get_method(name) for name in method_names()[1:]]


def method_options(fn: Callable) -> Callable:
    """Every registered method's flags (Method.flags), as options of a command: specdec-run and specdec-serve."""
    for flag in [f for m in drafting_methods() for f in m.flags][::-1]:  # click lists options in decorator order, last applied first
        fn = _click_option(flag)(fn)
    return fn


def _click_option(flag: Flag) -> Callable:
    if flag.type is bool:  # an on/off pair, as TensorRT-LLM's users know them: no dashed spelling (docs/cli-run.md)
        return click.option(f"--{flag.name}/--{flag.off}", flag.name, default=flag.default, show_default=True, help=flag.help)
    kind = click.Path() if flag.path else flag.type
    return option(flag.name, *(f"--{a}" for a in flag.aliases), type=kind, default=flag.default, show_default=flag.default is not None,
                  help=flag.help)


def method_configs(values: dict[str, Any]) -> list[tuple[Method, Any]]:
    """Pops every method's flags from a command's ``values``; the config of each method they asked for (registry order).
    A config's engine directories stay paths: load_engine opens them (with the command's --verify_engine)."""
    flags = {f.name: values.pop(f.name) for m in drafting_methods() for f in m.flags if f.name in values}
    configs = [(m, m.from_flags(flags)) for m in drafting_methods()]
    for m, c in configs:  # a setting of a method not asked for would be dropped without a word: refused
        if c is not None:
            continue
        stray = [f for f in m.flags[1:] if flags.get(f.name) is not None and flags[f.name] != f.default]
        if stray:
            shown = "--" + (stray[0].off if stray[0].type is bool and stray[0].off and not flags[stray[0].name] else stray[0].name)
            raise RequestError(f"{shown} is a setting of the {m.name!r} method, which is not asked for: add {m.flag}, or drop {shown}.")
    return [(m, c) for m, c in configs if c is not None]


def verify_engine_option(fn: Callable) -> Callable:
    """--verify_engine: how engine files are checked against config.json's sha256 (formats/file_stamps.py)."""
    return option("verify_engine", type=click.Choice(VERIFY_MODES), default="stamp", show_default=True,
                  help="How engine files are checked against the sha256 in config.json: stamp hashes a file once, then again only when its "
                       "size, times or inode change; full hashes every file on every load (docs/engine-format.md).")(fn)


def prefix_caching_options(fn: Callable) -> Callable:
    """--enable_prefix_caching/--no_enable_prefix_caching (vLLM's flag, dashed too) and --prefix_cache_slots."""
    fn = option("prefix_cache_slots", type=click.IntRange(min=1), default=None,
                help="Finished requests' sequences the prefix cache keeps (least recently used leave first); each costs one KV cache row "
                     "of the engine's full capacity [default: the target's max_batch_size].")(fn)
    return click.option("--enable_prefix_caching/--no_enable_prefix_caching", "--enable-prefix-caching/--no-enable-prefix-caching",
                        "enable_prefix_caching", default=None,
                        help="Prefix caching: a request copies the K/V of the longest prefix of its prompt that an earlier or running request "
                             "computed, and prefills the rest; exact (the same output as without it) [default: on, where the executor can "
                             "hold it].")(fn)


STEP_COSTS = {"auto": None, "on": True, "off": False}


def measure_step_costs_option(fn: Callable) -> Callable:
    """--measure_step_costs auto|on|off: the value for load_engine's measure_step_costs is STEP_COSTS[value]."""
    return option("measure_step_costs", type=click.Choice(list(STEP_COSTS)), default="auto", show_default=True,
                  help="Time the target's calls at each batch size and draft length at load, and a draft model's steps and catch-up "
                       "feeds, so that draft_len=auto prices its first rounds from them (not a prior) and a GPU executor captures "
                       "those CUDA graphs before the first request. "
                       "auto: on GPU executors when a drafter is loaded (a few seconds at load).")(fn)


def clean_errors(fn: Callable) -> Callable:
    """Our own errors become one line on stderr and exit status 1, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warnings.showwarning = _one_line_warning
        cpu_kernels.compile_note = _note  # a first use compiles specdec's CPU kernels: 10-20 s, said before it starts
        try:
            return fn(*args, **kwargs)
        except SpecdecError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)
        except BrokenPipeError:  # the reader left (| head): quiet, as other tools are (Python's docs' recipe: no flush error at exit)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except OSError as err:  # a file or folder we could not read or write: say which, in one line
            where = f": {err.filename}" if err.filename else ""
            click.echo(f"error: {err.strerror or err}{where}.", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def _note(text: str) -> None:
    click.echo(f"note: {text}", err=True)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our warnings (e.g. a draft with smaller limits) as one 'warning:' line, not Python's two-line format."""
    click.echo(f"warning: {message}", err=True)


def check_output_file(path: str | None, flag: str) -> None:
    """Refuse, before any work, an output file that cannot be written: a directory, or an unwritable folder."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise RequestError(f"{flag} {path} is a directory: give a file name.")
    _check_folder(p.parent, f"{flag} {path}")


def check_output_dir(path: str, flag: str) -> None:
    """Refuse, before any work, an output directory whose parent cannot be created or written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise RequestError(f"{flag} {path} exists and is not a directory.")
    # an existing directory is written into itself (builder/engine_dir.py), a new one beside it: where the build writes
    _check_folder(p.resolve() if p.is_dir() else p.parent, f"{flag} {path}")


def _check_folder(folder: Path, what: str) -> None:
    folder = folder if str(folder) else Path(".")
    for above in (folder, *folder.parents):
        if above.exists():
            if not above.is_dir():
                raise RequestError(f"{what} cannot be written: {above} is a file, not a folder.")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # the real test: permissions, read-only mounts, quotas
            pass
    except OSError as err:
        raise RequestError(f"{what} cannot be written: no file can be created in {folder} ({err.strerror or err}).") from None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def engine_tokenizer(engine: EngineDir, tokenizer_dir: str | None) -> Tokenizer | None:
    """--tokenizer_dir, else the tokenizer.json shipped in the engine, else None. Every CLI asks this first of the engine it
    decodes with, so an EAGLE module's own engine is refused here, before a tokenizer message could point elsewhere."""
    check_decodes_alone(engine)
    tok_dir = tokenizer_dir or (engine.path if engine.tokenizer_path else None)
    if not tok_dir:
        return None
    tok = Tokenizer(tok_dir)
    if tokenizer_dir:  # another tokenizer than the engine's own: its ids must be the model's
        vocab = engine.config.model.vocab_size
        used = max(tok.vocab().values(), default=-1) + 1
        if used > vocab:
            raise RequestError(f"--tokenizer_dir {tokenizer_dir} uses token ids up to {used - 1}, past the engine's vocabulary of {vocab}: "
                               "it is not this model's tokenizer (pass the checkpoint's directory, or leave it out for the engine's own).")
        if used < vocab // 2:
            click.echo(f"warning: --tokenizer_dir {tokenizer_dir} has {used} tokens for an engine of {vocab}: is it this model's "
                       "tokenizer? Text decodes wrong with another's.", err=True)
    return tok


def end_ids(end_id: int | None, tok: Tokenizer | None, engine: EngineDir) -> tuple[int, ...]:
    """--end_id (negative: none), else the tokenizer's EOS, else the checkpoint's eos_token_id(s)."""
    if end_id is not None:
        if end_id >= engine.config.model.vocab_size:  # it could never be generated: a request would never stop on it
            raise RequestError(f"--end_id {end_id} is outside the engine's vocabulary (0..{engine.config.model.vocab_size - 1}); "
                               "-1 never stops early.")
        return () if end_id < 0 else (end_id,)
    return (tok.eos_token_id,) if tok and tok.eos_token_id is not None else tuple(engine.config.model.eos_token_id)


def fmt_or_dash(value: float | None, spec: str) -> str:
    """A table cell: ``value`` formatted, or '-' when there is none."""
    return "-" if value is None else format(value, spec)


def yes_no_dash(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "NO"
