"""Triton, imported and applied only when a kernel first launches (kernels/__init__.py says why)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class LazyKernel:
    """A Triton kernel's Python source, compiled with ``triton.jit`` at its first launch: ``kernel[grid](...)``."""

    def __init__(self, fn: Callable, do_not_specialize: Sequence[str] = ()):
        self.fn, self.do_not_specialize, self._jitted = fn, tuple(do_not_specialize), None

    def __getitem__(self, grid: Any):
        if self._jitted is None:
            import triton
            import triton.language

            self.fn.__globals__["tl"] = triton.language  # the kernel module's ``tl``, which its source names
            self._jitted = triton.jit(self.fn, do_not_specialize=list(self.do_not_specialize))
        return self._jitted[grid]


def kernel(*, do_not_specialize: Sequence[str] = ()) -> Callable[[Callable], LazyKernel]:
    """Decorator: a LazyKernel. do_not_specialize: integer arguments Triton must not compile a variant for per value
    (the row count of a GEMM: one binary for every row count is what keeps a row's result independent of it)."""
    return lambda fn: LazyKernel(fn, do_not_specialize)


def triton_problem() -> str | None:
    """Why Triton's kernels cannot run here, or None."""
    try:
        import triton  # noqa: F401  (torch's CUDA wheels bring it)
    except ImportError as err:
        return f"Triton is not installed ({err}); torch's CUDA wheels bring it (pip install triton)"
    return None


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
