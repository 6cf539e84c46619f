"""What the CLIs share: TensorRT-LLM flag spellings and one-line errors."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click

from ..runtime.engine_format import EngineDir
from ..runtime.errors import SpecdecError
from ..runtime.tokenizer import Tokenizer


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


def clean_errors(fn: Callable) -> Callable:
    """Our own errors become one line on stderr and exit status 1, not a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecdecError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def engine_tokenizer(engine: EngineDir, tokenizer_dir: str | None) -> Tokenizer | None:
    """--tokenizer_dir, else the tokenizer.json shipped in the engine, else None."""
    tok_dir = tokenizer_dir or (engine.path if engine.tokenizer_path else None)
    return Tokenizer(tok_dir) if tok_dir else None


def end_ids(end_id: int | None, tok: Tokenizer | None, engine: EngineDir) -> tuple[int, ...]:
    """--end_id (negative: none), else the tokenizer's EOS, else the checkpoint's eos_token_id(s)."""
    if end_id is not None:
        return () if end_id < 0 else (end_id,)
    return (tok.eos_token_id,) if tok and tok.eos_token_id is not None else tuple(engine.config.model.eos_token_id)


def fmt_or_dash(value: float | None, spec: str) -> str:
    """A table cell: ``value`` formatted, or '-' when there is none."""
    return "-" if value is None else format(value, spec)


def yes_no_dash(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "NO"
