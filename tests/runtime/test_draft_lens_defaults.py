"""The default drafts per round, defined once: a draft model without --draft_target_model_config, and each loaded
method's default for a request that names the method but no length (what specdec-serve offers)."""

from conftest import spec_pair

from specdec.formats.config_strings import DraftTargetConfig, NGramConfig
from specdec.formats.engine_format import TREE_MODES
from specdec.runtime.loading import load_engine, method_draft_lens
from specdec.runtime.proposers.own import OWN_DRAFTERS, own_drafter


def test_a_draft_model_defaults_to_four_drafts_at_most_the_targets_limit():
    assert [DraftTargetConfig.default_for(m).draft_len for m in (0, 1, 3, 4, 8)] == [1, 1, 3, 4, 4]
    assert DraftTargetConfig.default_for(8) == DraftTargetConfig(4, [0], [0], False)


def test_every_tree_mode_has_its_drafter_in_the_table():
    assert set(OWN_DRAFTERS) == set(TREE_MODES)
    assert all(own_drafter(mode).name == mode for mode in TREE_MODES)


def test_each_loaded_method_gets_its_own_default(tmp_path):
    pair = spec_pair(tmp_path, max_draft_len=3)
    target, draft = pair["target"].engine, pair["draft"].engine
    # the default method (draft) gets the engine's draft_len; n-gram its config's, capped at the target's limit
    engine = load_engine(target, draft, ngram=NGramConfig(10, 2, [0]), method="draft", num_threads=1)
    assert engine.speculation.draft_len == 3
    assert method_draft_lens(engine, None, NGramConfig(10, 2, [0])) == {"draft": 3, "ngram": 3}
    # --draft_len is the default method's only; the draft keeps its config's length when n-gram is the default
    engine = load_engine(target, draft, DraftTargetConfig(2, [0], [0], False), NGramConfig(3, 2, [0]), method="ngram", draft_len="auto",
                         num_threads=1)
    assert method_draft_lens(engine, DraftTargetConfig(2, [0], [0], False), NGramConfig(3, 2, [0])) == {"draft": 2, "ngram": "auto"}


def test_suffix_decoding_gets_its_configs_length_capped_at_the_targets(tmp_path):
    from specdec.runtime.proposers.suffix import SuffixConfig

    pair = spec_pair(tmp_path, max_draft_len=3)
    engine = load_engine(pair["target"].engine, pair["draft"].engine, suffix=SuffixConfig(max_draft_len=8, global_cache=False), num_threads=1)
    assert engine.speculation.method == "draft" and method_draft_lens(engine) == {"draft": 3, "suffix": 3}


def test_step_costs_are_measured_at_load_when_asked_and_by_default_only_on_a_gpu(tmp_path):
    """measure_step_costs=True times the target's calls before the first request and gives auto every batch size's line
    (no prior left); the default (None) measures on a GPU executor only, so a CPU engine here starts from the prior."""
    pair = spec_pair(tmp_path, max_draft_len=3)
    target, draft = pair["target"].engine, pair["draft"].engine
    measured = load_engine(target, draft, draft_len="auto", num_threads=1, measure_step_costs=True)
    lines = [line for line in measured.auto.verify if line.measured]
    assert lines and measured.auto.verify[1].measured and measured.auto.verify[1].slope is not None  # widths 1..4 timed at 1 row
    assert not measured.has_unfinished() and int(measured.cache.lengths.max()) == 0  # the cache is left as it was
    default = load_engine(target, draft, draft_len="auto", num_threads=1)
    assert default.target.device == "cpu" and not any(line.measured for line in default.auto.verify)
    # and the measured engine decodes as the unmeasured one does (greedy: the same tokens)
    from specdec.runtime.orchestrator import GenerationConfig, Orchestrator

    cfg = GenerationConfig(max_output_len=12, end_ids=())
    a = Orchestrator.from_engine(measured).generate([[5, 6, 7, 8]], cfg)[0][0].output_ids
    b = Orchestrator.from_engine(default).generate([[5, 6, 7, 8]], cfg)[0][0].output_ids
    assert a == b and len(a) == 12


def test_drafts_asked_for_with_nothing_to_draft_them_are_refused(tmp_path):
    """A draft length for a target-only default is an error saying what would draft, never a silent target-only run."""
    import pytest

    from specdec.formats.errors import RequestError

    pair = spec_pair(tmp_path, max_draft_len=3)
    target, draft = pair["target"].engine, pair["draft"].engine
    for k in (2, "auto"):
        with pytest.raises(RequestError, match=f"draft_len={k} but no drafting method is loaded.*ngram: --ngram_config"):
            load_engine(target, draft_len=k, num_threads=1)
    with pytest.raises(RequestError, match="draft_len=2 is the default method's, and that is 'none'.*choose a method that drafts \\(draft\\)"):
        load_engine(target, draft, method="none", draft_len=2, num_threads=1)
    assert load_engine(target, draft_len=0, num_threads=1).speculation.method == "none"  # 0 drafts is target-only, as asked
