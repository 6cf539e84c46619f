"""Which attributes a module's source uses on an API (read with ``ast``), and whether a real module has them: how the
tests check TensorRT and cuda-python calls that no GPU here can run (tests/runtime/test_trt_host.py,
tests/builder/test_tensorrt_backend.py)."""

from __future__ import annotations

import ast
from pathlib import Path


def used_attributes(path: Path, roots: dict[str, str]) -> dict[str, set[tuple[str, ...]]]:
    """Dotted attribute chains used in ``path`` on the names in ``roots`` (source text -> API kind)."""
    found: dict[str, set[tuple[str, ...]]] = {kind: set() for kind in roots.values()}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        chain, base = [], node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        chain.reverse()
        text = ast.unparse(base) if not isinstance(base, ast.Call) else ast.unparse(base.func) + "()"
        head = text.split(".") + chain
        for prefix, kind in roots.items():  # self._plan.x, plan.x, trt.x.y, rt.x ...
            root = prefix.split(".")
            if head[: len(root)] == root and len(head) > len(root):
                found[kind].add(tuple(head[len(root):]))
    return found


def resolve(obj, chain: tuple[str, ...]) -> bool:
    for name in chain:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True
