"""What the CLIs share: TensorRT-LLM flag spellings and one-line errors."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click

from ..runtime.errors import SpecdecError


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
