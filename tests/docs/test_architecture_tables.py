"""docs/architecture.md's and docs/backends.md's tables say what the registries hold: the backends per device kind (runtime) and per build
(builder), the lowerings, the drafting methods and the speculative decoding modes. A row added to a registry and
not to the page, or the other way round, fails here; so does a module, class, layout or default the page misnames."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import specdec.builder.backends as builder_backends
import specdec.plugins as plugins
import specdec.runtime.backends as runtime_backends
from specdec.builder.build import MODES
from specdec.formats.engine_format import TREE_MODES, BuildConfig, ModelConfig, extra_io
from specdec.plugins import LOWERINGS
from specdec.plugins.attention import AttentionLowering
from specdec.runtime.proposers.own import own_drafter
from specdec.runtime.request import METHODS

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = [DOCS / "architecture.md", DOCS / "backends.md"]  # the design page and its backends-and-lowerings page


def page_text() -> str:
    return "\n\n".join(p.read_text() for p in PAGES)
CODE = re.compile(r"`([^`]+)`")


def split_row(line: str) -> list[str]:
    """The cells of one markdown table row ('\\|' is a pipe inside a cell)."""
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def tables(text: str) -> list[list[list[str]]]:
    """Every table of the page: its rows of cells, the header first, the |---| line dropped."""
    found, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            if not re.fullmatch(r"\s*\|[\s:|-]+\|\s*", line):
                current.append(split_row(line))
        elif current:
            found.append(current)
            current = []
    return found


def table(header: list[str], text: str | None = None) -> list[dict[str, str]]:
    """The one table whose header row is ``header`` (exactly), as header -> cell per row."""
    matches = [t for t in tables(text if text is not None else page_text()) if t[0] == header]
    assert len(matches) == 1, f"{len(matches)} tables with the header {header} in {', '.join(p.name for p in PAGES)}"
    return [dict(zip(header, row, strict=True)) for row in matches[0][1:]]


def codes(cell: str) -> list[str]:
    return CODE.findall(cell)


def module_name(path: str) -> str:
    """runtime/backends/onnxruntime/cpu.py -> specdec.runtime.backends.onnxruntime.cpu"""
    return "specdec." + path.removesuffix(".py").replace("/", ".")


def test_the_parser_reads_a_table():
    text = "intro\n\n| a | b |\n|---|---|\n| `x` (`X`) | one \\| two |\n| `y` | |\n\nafter\n"
    assert table(["a", "b"], text) == [{"a": "`x` (`X`)", "b": "one | two"}, {"a": "`y`", "b": ""}]
    assert codes("`x` (`X`)") == ["x", "X"]
    with pytest.raises(AssertionError, match="0 tables"):
        table(["c"], text)


def test_runtime_backends_table_is_the_registry():
    rows = table(["backend", "device", "state", "what the engine holds", "executor module"])
    documented = {(codes(r["backend"])[0], codes(r["device"])[0]): r["executor module"] for r in rows}
    assert set(documented) == set(runtime_backends._REGISTRY), "backend x device rows differ from runtime/backends/__init__.py"
    for key, cell in documented.items():
        path, cls = codes(cell)[:2]
        assert module_name(path) == runtime_backends._REGISTRY[key], key
        assert hasattr(importlib.import_module(module_name(path)), cls), f"{path} has no {cls}"


def test_builder_backends_table_is_the_registry():
    rows = table(["backend", "builder module", "lowerings it compiles (the first is `--lowering auto`)", "its engines run on"])
    documented = {codes(r["backend"])[0]: r for r in rows}
    assert set(documented) == set(builder_backends._REGISTRY), "backend rows differ from builder/backends/__init__.py"
    for name, row in documented.items():
        module = builder_backends.backend_module(name)
        assert module_name(codes(row["builder module"])[0]) == builder_backends._REGISTRY[name]
        lowerings = tuple(codes(row["lowerings it compiles (the first is `--lowering auto`)"]))
        assert lowerings[0] == module.DEFAULT_LOWERING and set(lowerings) == set(module.LOWERINGS), name
        assert codes(row["its engines run on"])[0] == module.DEVICE, name


def lowering_columns() -> dict[str, dict[str, str]]:
    """The lowering table, column by column: lowering name -> {row label -> cell}."""
    matches = [t for t in tables(page_text()) if t[0][0] == "" and "(`plugins/attention.py`)" in t[0][1]]
    assert len(matches) == 1, "the lowering table (a column per lowering) is missing"
    header, *rows = matches[0]
    columns = {}
    for i, title in enumerate(header[1:], start=1):
        name, path = codes(title)[:2]
        if name in LOWERINGS:
            assert LOWERINGS[name].__module__ == module_name(path), f"{name} is not in {path}"
        columns[name] = {row[0]: row[i] for row in rows}
    return columns


def kv_layouts(name: str) -> set[str]:
    """The cache layouts lowering ``name`` builds: its class's, and those of the forms it has (ort_cuda: gqa, masked)."""
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for module in pkgutil.iter_modules(plugins.__path__):  # a lowering's other forms load lazily (ort_cuda_masked.py)
        importlib.import_module(f"{plugins.__name__}.{module.name}")
    forms = [c for c in subclasses(AttentionLowering) if c.name == name and "kv_layout" in vars(c)]
    return {c.kv_layout for c in [LOWERINGS[name], *forms]}


def test_lowering_table_is_the_registry():
    columns = lowering_columns()
    assert set(columns) == set(LOWERINGS), "lowering columns differ from plugins/__init__.py's LOWERINGS"
    for name, cells in columns.items():
        said = {c for c in codes(cells["KV cache (`kv_layout`)"]) if c in ("bnsh", "bsh")}
        assert said == kv_layouts(name), f"{name}: kv_layout {sorted(said)} on the page, {sorted(kv_layouts(name))} in plugins/"
        said = {c.removeprefix("--backend ") for c in codes(cells["default of"]) if c.startswith("--backend ")}
        defaults = {b for b in builder_backends._REGISTRY if builder_backends.backend_module(b).DEFAULT_LOWERING == name}
        assert said == defaults, f"{name} is said to be the default of {sorted(said)}, and is of {sorted(defaults)}"


def test_kv_layout_table_matches_the_lowerings():
    rows = table(["`kv_layout`", "lowering", "`past_*` / `present_*` shape"])
    listed: dict[str, set[str]] = {}
    for row in rows:
        for lowering in codes(row["lowering"]):
            if lowering in LOWERINGS:
                listed.setdefault(lowering, set()).add(codes(row["`kv_layout`"])[0])
    assert listed == {name: kv_layouts(name) for name in LOWERINGS}


def test_methods_table_is_the_engines_methods():
    rows = table(["method", "proposer", "module", "drafts from"])
    documented = {codes(r["method"])[0]: r for r in rows}
    assert set(documented) == set(METHODS) - {"none"}, "method rows differ from runtime/request.py's METHODS"
    for method, row in documented.items():
        cls = getattr(importlib.import_module(module_name(codes(row["module"])[0])), codes(row["proposer"])[0])
        assert cls.name == method


def test_modes_table_is_the_builders_modes_and_their_drafters():
    rows = table(["`speculative_decoding_mode`", "the target verifies", "its extra outputs", "its own drafter"])
    documented = {codes(r["`speculative_decoding_mode`"])[0]: r for r in rows}
    assert set(documented) == set(MODES), "mode rows differ from builder/build.py's MODES"
    model = ModelConfig("LlamaForCausalLM", 96, 64, 128, 2, 4, 2, 16, 1e-5, 10000.0, None, 128, True, False, False)
    for mode, row in documented.items():
        drafter = own_drafter(mode)
        assert codes(row["its own drafter"])[:1] == ([drafter.__name__] if drafter else []), mode
        _, outputs = extra_io(model, BuildConfig(speculative_decoding_mode=mode, medusa_num_heads=2))
        assert codes(row["its extra outputs"]) == [t.name for t in outputs], mode
        assert ("chains and trees" in row["the target verifies"]) == (mode in TREE_MODES), mode  # trees always, by the mode
