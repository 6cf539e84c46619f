"""The builder asks its backend, never its name: a backend is a module in builder/backends/ named in the registry, and
build_engine builds with any module that declares what the BuildBackend protocol asks for (here a toy one, added the
way a new backend would be)."""

from __future__ import annotations

import ast
import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import spec_build

import specdec.builder.backends as registry
from specdec.builder.backends import BACKENDS, backend_module
from specdec.builder.backends.base import BuildBackend, Compiled
from specdec.builder.build import build_engine
from specdec.formats.errors import BuildConfigError

BUILDER = Path(__file__).resolve().parents[2] / "builder"
NAME_FREE = ("build.py", "validation.py", "awq.py", "calibration.py", "network_file.py", "network_writers.py", "engine_dir.py", "heads.py")


def backend_names_used(path: Path) -> list[str]:
    """Where ``path`` compares with a backend's name (== / != / in) or imports a backend module by name."""
    names = set(BACKENDS[1:])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            for const in ast.walk(node):
                if isinstance(const, ast.Constant) and const.value in names:
                    found.append(f"line {node.lineno}: compares with {const.value!r}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            hits = [n for n in names if module.endswith(f"backends.{n}") or (module.endswith("backends") and any(a.name == n for a in node.names))]
            found += [f"line {node.lineno}: imports the {n} backend" for n in hits]
    return found


def test_the_check_finds_a_name_branch(tmp_path):
    path = tmp_path / "branchy.py"
    path.write_text('from .backends import tensorrt\nif build.backend == "tensorrt":\n    pass\n')
    assert backend_names_used(path) == ["line 1: imports the tensorrt backend", "line 2: compares with 'tensorrt'"]


@pytest.mark.parametrize("name", NAME_FREE)
def test_the_builder_branches_on_no_backend_name(name):
    assert backend_names_used(BUILDER / name) == []


@pytest.mark.parametrize("name", BACKENDS[1:])
def test_every_registered_backend_implements_the_protocol(name):
    module = backend_module(name)
    assert isinstance(module, BuildBackend)
    assert module.DEFAULT_LOWERING in module.LOWERINGS and module.DEVICE in ("cpu", "cuda")


@pytest.fixture
def toy_backend(monkeypatch):
    """A backend registered as a new one would be: it compiles the portable graph only, refuses asymmetric weight-only
    weights and trees, and leaves a record of its own in config.json."""
    module = types.ModuleType("toy_backend")
    onnxruntime = backend_module("onnxruntime")

    def check_build(build, options):
        if build.quantization == "fp8":
            raise BuildConfigError("the toy backend has no fp8 GEMM: build it with --qformat none.")

    def compile_engine(out_dir, network_file, build, model, options, say):
        onnxruntime.compile_engine(out_dir, network_file, build, model, options, say)  # the graph still loads
        return Compiled(network_file, {"toy": "0.1"}, {"toy": {"lowering": build.lowering}})

    module.__dict__.update(
        TITLE="Toy", DEVICE="cpu", DEFAULT_LOWERING="portable", LOWERINGS=("portable",), TREE_ATTENTION=False, NETWORK="onnx", KV_LAYOUT=None,
        OPTIONS={}, NOTICE="toy is a test",
        host_problem=lambda: None, auto_note=lambda: "toy could build here", check_options=lambda options: None,
        refusals=lambda build: [] if build.symmetric else ["the toy backend takes symmetric weights only"],
        check_build=check_build, compile_engine=compile_engine)
    monkeypatch.setitem(sys.modules, "toy_backend", module)
    monkeypatch.setitem(registry._REGISTRY, "toy", "toy_backend")
    monkeypatch.setattr(registry, "BACKENDS", (*registry.BACKENDS, "toy"))
    monkeypatch.setattr("specdec.builder.build.BACKENDS", registry.BACKENDS)
    return module


def test_a_new_backend_builds_through_the_same_code(toy_backend, llama_ckpt, tmp_path):
    said = []
    result = build_engine(llama_ckpt, tmp_path / "e", spec_build(backend="toy"), say=said.append)
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    assert config["build"]["backend"] == "toy" and config["build"]["lowering"] == "portable"  # its default lowering
    assert config["versions"]["toy"] == "0.1" and config["extra"]["toy"] == {"lowering": "portable"}
    assert result.config.network_file == "model.onnx" and "warning: toy is a test" in said


def test_a_new_backend_is_asked_what_it_refuses(toy_backend, llama_ckpt, tmp_path):
    with pytest.raises(BuildConfigError, match=r"the toy backend parses the portable lowering only, not 'ort_cpu'"):
        build_engine(llama_ckpt, tmp_path / "a", spec_build(backend="toy", lowering="ort_cpu"), say=lambda _: None)
    with pytest.raises(BuildConfigError, match=r"tree attention is not verified on Toy\): use --backend onnxruntime"):
        build_engine(llama_ckpt, tmp_path / "b", spec_build(8, backend="toy", speculative_decoding_mode="medusa"), say=lambda _: None,
                     medusa_dir=tmp_path)
    weight_only = replace(spec_build(backend="toy"), quantization="int4_wo", symmetric=False)
    with pytest.raises(BuildConfigError, match=r"invalid build configuration: the toy backend takes symmetric weights only\."):
        build_engine(llama_ckpt, tmp_path / "c", weight_only, say=lambda _: None)
    with pytest.raises(BuildConfigError, match=r"the toy backend has no fp8 GEMM"):
        build_engine(llama_ckpt, tmp_path / "e", spec_build(backend="toy", quantization="fp8"), say=lambda _: None)
    with pytest.raises(BuildConfigError, match=r"--trt_version_compatible only applies to --backend tensorrt \(this build uses toy\)"):
        build_engine(llama_ckpt, tmp_path / "d", spec_build(backend="toy"), say=lambda _: None, trt_version_compatible=True)
    assert list(tmp_path.iterdir()) == []  # each refused before anything was written


def test_auto_names_what_the_other_backends_could_do(toy_backend):
    said = []
    assert registry.resolve_backend("auto", said.append) == "onnxruntime"
    assert said[0].startswith("backend: auto -> onnxruntime (") and "toy could build here" in said[0]
