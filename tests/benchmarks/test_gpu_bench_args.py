"""The GPU benchmarks' choices that run before any GPU is touched: bench_torch.py's --compare and bench_gemm.py's row tiles."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_gemm  # noqa: E402
import bench_torch  # noqa: E402

from specdec.runtime.backends.torch.host import DENSE  # noqa: E402
from specdec.runtime.backends.torch.kernels import gemm  # noqa: E402


def test_compare_takes_the_dense_choices_and_refuses_others(monkeypatch):
    assert set(bench_torch.DENSE_COMPARED) == set(DENSE) - {"stable"}  # every choice but the default it compares against
    monkeypatch.setattr(sys, "argv", ["bench_torch.py", "--target", "t", "--draft", "d", "--work", "w", "--compare", "unfused,fast"])
    with pytest.raises(SystemExit, match=r"--compare 'unfused,fast': choose among unfused, shape, fixed, cublas"):
        bench_torch.main()


@pytest.mark.parametrize("bits", [0, 4])
def test_row_tiles_change_the_row_tile_only(bits):
    """--tiles rows: tile_for's tile first, then the same reduction (BLOCK_K, parts), columns and stages on each other
    BLOCK_M, so that a same-bits check compares row tiles alone; then the 16-row tile with deeper pipelines, nothing
    else changed, and no tile twice."""
    chosen = gemm.tile_for(4096, 4096, bits)
    tiles = bench_gemm.row_tiles(gemm, 4096, 4096, bits)
    same_stages = [t for t in tiles if t.num_stages == chosen.num_stages]
    assert tiles[0] == chosen and sorted(t.block_m for t in same_stages) == [16, 32, 64, 128]
    keep = lambda t: (t.block_n, t.block_k, t.split, t.num_warps)  # noqa: E731
    assert all(keep(t) == keep(chosen) for t in tiles) and len(set(tiles)) == len(tiles)
    deeper = [t for t in tiles if t.num_stages != chosen.num_stages]
    assert {(t.block_m, t.num_stages) for t in deeper} == {(16, s) for s in (4, 5) if s != chosen.num_stages}


def test_a_compared_engine_opens_with_its_dense_choice(tmp_path):
    """--compare opens the target again with TorchExecutor's own ``dense`` (no environment variable set and unset)."""
    from checkpoints import make_checkpoint
    from conftest import spec_build

    from specdec.builder.build import build_engine

    build_engine(make_checkpoint(tmp_path / "ckpt"), tmp_path / "eng", spec_build(0, backend="torch"), say=lambda _: None)
    assert bench_torch.open_engine(tmp_path / "eng", "cpu", dense="unfused").dense == "unfused"
    assert bench_torch.open_engine(tmp_path / "eng", "cpu").dense == "stable"


def test_steps_are_timed_up_to_each_engines_widest_step():
    """bench_torch's steps: the draft at 1 token, every other engine up to its max_draft_len + 1 tokens (a wider call is
    a prompt's, run without CUDA graphs), so an engine built for k = 4 has no 9-token figure."""
    from types import SimpleNamespace

    class Engine:
        def __init__(self, k):
            self.build, self.widths = SimpleNamespace(max_draft_len=k), set()

        def new_cache(self, batch):
            return None

        def forward(self, cache, tokens, all_logits, advance=None):
            self.widths.add(len(tokens[0]))

    engines = {"target": (Engine(8), None), "draft": (Engine(0), None), "int4": (Engine(4), None), "target_unfused": (Engine(4), None)}
    got = bench_torch.timed_steps(engines, [1, 2], [1, 3, 5, 9], repeats=1, reps=1)
    assert [sorted(got[name][2]) for name in engines] == [[1, 3, 5, 9], [1], [1, 3, 5], [1, 3, 5]]
    assert engines["int4"][0].widths == {1, 3, 5, 100}  # 100: the cache's prompt


DEMO_HEADS = Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "heads"


def test_peagle_refine_settings_are_checked_before_anything_is_built():
    """--peagle_refine: numbers of calls and auto, for a module trained to read its drafts; the blind module, a bad value and
    a missing --peagle stop the run before its builds (a GPU call would find out after them)."""
    assert bench_torch.peagle_refine_settings("", None) == ()
    assert bench_torch.peagle_refine_settings("1,auto", str(DEMO_HEADS / "peagle-refine")) == (1, "auto")
    with pytest.raises(SystemExit, match="not trained to read its drafts"):
        bench_torch.peagle_refine_settings("1", str(DEMO_HEADS / "peagle"))
    with pytest.raises(SystemExit, match="give a whole number of calls from 0 to 7, or auto"):
        bench_torch.peagle_refine_settings("1,9", str(DEMO_HEADS / "peagle-refine"))
    with pytest.raises(SystemExit, match="give --peagle too"):
        bench_torch.peagle_refine_settings("auto", None)
    assert bench_torch.peagle_refine_settings("1,,1,", str(DEMO_HEADS / "peagle-refine")) == (1,)  # each once, empty entries ignored
    with pytest.raises(SystemExit, match="no config.json there"):
        bench_torch.peagle_refine_settings("1", str(DEMO_HEADS))


def test_a_refining_module_builds_into_its_own_folder():
    """The blind and the refining module build P-EAGLE targets in different folders of --work, so a reused engine is always
    built from the kind of module asked for (a refining setting on a blind module's engine would fail after the builds)."""
    args = bench_torch.argparse.Namespace(dtype="float32", batch_list=[1], target="t", draft="d", eagle=None, int4=False, medusa=None, ort=False,
                                          peagle=str(DEMO_HEADS / "peagle"))
    assert "peagle" in bench_torch.plan_builds(args, 4, 8)
    args.peagle = str(DEMO_HEADS / "peagle-refine")
    plan = bench_torch.plan_builds(args, 4, 8)
    assert bench_torch.PEAGLE_REFINING in plan and "peagle" not in plan
