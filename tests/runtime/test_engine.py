"""The request-level engine: requests join and leave a running batch, each as if alone.

Every test compares against the same request decoded alone (its solo
reference), so any leak between slots, any stale cache row after a move, or
any RNG shared across the batch shows up as a token difference.
"""

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from checkpoints import make_checkpoint
from conftest import build_and_load, spec_build, spec_pair
from hypothesis import HealthCheck, given, settings, strategies as st

from specdec.formats.engine_format import load_engine_dir, sha256_file
from specdec.formats.errors import EngineError, RequestError
from specdec.runtime.draft_len import PROBE_EVERY
from specdec.runtime.engine import Engine, SpeculationConfig
from specdec.runtime.orchestrator import Orchestrator
from specdec.runtime.pairing import PairWarning, check_pair
from specdec.runtime.proposers.draft_model import DraftModelProposer
from specdec.runtime.proposers.ngram import NGramProposer
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig

MAX_DRAFT = 4
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30], [40, 41, 42, 40, 41, 42, 40], [7, 8], [50, 51, 52, 53]]


@pytest.fixture(scope="module")
def ex(tmp_path_factory):
    return spec_pair(tmp_path_factory.mktemp("engine"), MAX_DRAFT)


def make_engine(ex, method="draft", draft_len=3, draft="draft"):
    proposers = [DraftModelProposer(ex[draft], use_logits=True), NGramProposer(MAX_DRAFT, 2)]
    return Engine(ex["target"], proposers, SpeculationConfig(method, draft_len))


def drain(engine, outputs=None, max_steps=10_000):
    """Step until every request ends; {request id: output ids}, checking each ends exactly once."""
    outputs = {} if outputs is None else outputs
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outputs
        for o in engine.step():
            assert o.request_id not in outputs, f"{o.request_id} reported after it finished"
            if o.finished:
                outputs[o.request_id] = o
    raise AssertionError("the engine did not finish")


@pytest.fixture(scope="module")
def solo(ex):
    """Each prompt decoded alone, target-only, greedy: the reference every interleaving must meet."""
    cfg = GenerationConfig(max_output_len=24)
    out, _ = Orchestrator(ex["target"]).generate([PROMPTS[0]], cfg)  # warm
    return {i: Orchestrator(ex["target"]).generate([p], cfg)[0][0].output_ids for i, p in enumerate(PROMPTS)}


@pytest.mark.parametrize("method", ["none", "draft", "ngram"])
def test_requests_joining_mid_decode_decode_as_alone(ex, solo, method):
    engine = make_engine(ex, method)
    cfg = GenerationConfig(max_output_len=24)
    ids = {engine.add_request(PROMPTS[0], cfg): 0}
    done = {}
    for step in range(200):
        if step in (2, 3, 7):  # join while request 0 (and later others) are mid-decode
            i = len(ids)
            ids[engine.add_request(PROMPTS[i], cfg)] = i
        if step == 7:
            for i in (4, 5):  # more at once than the free slots: they queue
                ids[engine.add_request(PROMPTS[i], cfg)] = i
        if not engine.has_unfinished() and step > 7:
            break
        for o in engine.step():
            if o.finished:
                done[ids[o.request_id]] = o.output_ids
        assert len(engine.running) <= engine.max_batch
        assert [r.slot for r in engine.running] == list(range(len(engine.running)))
    assert done == {i: solo[i] for i in range(len(PROMPTS))}


def test_per_request_speculation_in_one_batch(ex, solo):
    engine = make_engine(ex, "draft")
    cfgs = [GenerationConfig(max_output_len=24, method=m, draft_len=k) for m, k in (("none", None), ("draft", 2), ("ngram", 3), ("draft", "auto"))]
    ids = {engine.add_request(PROMPTS[i], c): i for i, c in enumerate(cfgs)}
    out = drain(engine)
    assert {ids[rid]: o.output_ids for rid, o in out.items()} == {i: solo[i] for i in range(4)}
    m = {ids[rid]: o.metrics for rid, o in out.items()}
    assert m[0].drafted == 0 and m[1].drafted > 0 and m[3].drafted > 0
    assert max(len(m[1].drafted_at), 0) <= 2  # its own draft length, not the engine's


def test_seeded_sampling_does_not_depend_on_the_batch(ex):
    sampled = GenerationConfig(max_output_len=20, sampling=SamplingConfig(temperature=1.0, top_k=20, random_seed=7))
    alone = make_engine(ex, "draft")
    rid = alone.add_request(PROMPTS[2], sampled)
    want = drain(alone)[rid].output_ids
    busy = make_engine(ex, "draft")
    busy.add_request(PROMPTS[0], GenerationConfig(max_output_len=30, sampling=SamplingConfig(temperature=0.7, random_seed=1)))
    busy.step()
    busy.add_request(PROMPTS[1], GenerationConfig(max_output_len=5))
    rid = busy.add_request(PROMPTS[2], sampled)
    busy.add_request(PROMPTS[3], GenerationConfig(max_output_len=25, method="ngram"))
    assert drain(busy)[rid].output_ids == want


@pytest.mark.parametrize("method,draft_len", [("draft", 3), ("draft", "auto"), ("ngram", 1), ("ngram", 3), ("ngram", "auto")])
def test_a_seeded_sample_verified_by_token_compare_is_target_onlys(ex, method, draft_len):
    """Drafts without probabilities (n-gram; a draft model without use_logits) are verified by token compare, and the
    target draws each position's token with that position's own number: the sampled output is target-only's with the
    same seed, token for token, whatever the draft length, under auto, and beside other requests."""
    sampling = SamplingConfig(temperature=0.2, random_seed=5)
    cfg = GenerationConfig(max_output_len=24, sampling=sampling)
    want = [o.output_ids for o in Orchestrator(ex["target"]).generate(PROMPTS, cfg)[0]]
    engine = Engine(ex["target"], [DraftModelProposer(ex["identity"]), NGramProposer(MAX_DRAFT, 2)], SpeculationConfig(method, draft_len))
    ids = {engine.add_request(p, cfg, seed_stream=i): i for i, p in enumerate(PROMPTS)}  # the streams generate() gives them
    out = drain(engine)
    assert [out[rid].output_ids for rid in ids] == want
    if draft_len == 3:  # drafts were kept, so rounds emitted several tokens
        assert sum(out[rid].metrics.accepted for rid in ids) > 0


def test_rejection_sampling_keeps_a_seeded_sample_at_a_fixed_draft_length(ex):
    """Drafts sampled from the draft's distribution (use_logits) are verified by rejection sampling, whose output follows
    the drafts: the same seed and draft length give the same tokens again."""
    cfg = GenerationConfig(max_output_len=24, sampling=SamplingConfig(temperature=0.7, random_seed=5))

    def run() -> list[list[int]]:
        engine = Engine(ex["target"], [DraftModelProposer(ex["draft"], use_logits=True)], SpeculationConfig("draft", 3))
        ids = [engine.add_request(p, cfg, seed_stream=i) for i, p in enumerate(PROMPTS)]
        out = drain(engine)
        return [out[rid].output_ids for rid in ids]

    first = run()
    assert run() == first


def test_abort_frees_the_slot_and_leaves_the_others_alone(ex, solo):
    engine = make_engine(ex, "draft")
    cfg = GenerationConfig(max_output_len=24)
    ids = [engine.add_request(p, cfg) for p in PROMPTS[:4]]  # max_batch_size is 4: every slot taken
    queued = engine.add_request(PROMPTS[4], cfg)
    engine.step()
    engine.step()
    assert len(engine.running) == 4 and len(engine.waiting) == 1
    final = engine.abort(ids[1])  # a running one, in the middle: the last slot moves into its place
    assert final.finished and final.finish_reason == "abort" and final.metrics.output_tokens == len(final.output_ids) > 0
    assert len(engine.running) == 3 and all(r.request_id != ids[1] for r in engine.running)
    out = drain(engine)
    assert out[ids[1]].finish_reason == "abort"
    assert {i: out[ids[i]].output_ids for i in (0, 2, 3)} == {i: solo[i] for i in (0, 2, 3)}
    assert out[queued].output_ids == solo[4]  # the freed slot admitted the queued request
    assert engine.abort("no-such-request") is None and engine.abort(ids[0]) is None  # unknown or finished: nothing happens


def test_abort_a_queued_request(ex):
    engine = make_engine(ex, "none")
    rid = engine.add_request(PROMPTS[0], GenerationConfig(max_output_len=4))
    engine.abort(rid)
    out = drain(engine)
    assert out[rid].finish_reason == "abort" and out[rid].output_ids == []


@pytest.mark.parametrize("method,where", [("draft", "target"), ("draft", "draft"), ("ngram", "target")])
def test_an_interrupted_prefill_raises_its_own_error_and_the_engine_serves_on(ex, solo, method, where, monkeypatch):
    """Ctrl-C (or any error) inside a prompt's prefill, the target's or the draft model's, reaches generate's caller as
    itself; its clean-up aborts the request, the proposer lets go of whatever of it it took (nothing, when the target's
    prefill stopped: a request joins its proposer after it), and the engine decodes the next prompt as alone. (Aborting
    it called the proposer's remove for a request it never had: a KeyError hid the interrupt.)"""
    engine = make_engine(ex, method)
    orch = Orchestrator.from_engine(engine)
    forward = ex[where].forward

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ex[where], "forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        orch.generate([PROMPTS[0]], GenerationConfig(max_output_len=24))
    monkeypatch.setattr(ex[where], "forward", forward)
    assert not engine.running and not engine.waiting  # the aborted request left its slot
    draft, ngram = engine.proposers["draft"], engine.proposers["ngram"]
    assert not draft.slot_of and not draft.order and not draft.pending and not ngram.pools  # and its proposer
    outs, _ = orch.generate([PROMPTS[2]], GenerationConfig(max_output_len=24))
    assert outs[0].output_ids == solo[2] and not draft.order and not ngram.pools


def test_per_request_metrics(ex):
    engine = make_engine(ex, "draft")
    rid = engine.add_request(PROMPTS[0], GenerationConfig(max_output_len=16))
    m = drain(engine)[rid].metrics
    assert m.output_tokens == 16 and m.prompt_tokens == len(PROMPTS[0])
    assert len(m.ttft_s) == len(m.queue_s) == len(m.tpot_s) == 1 and m.ttft_s[0] >= m.queue_s[0] >= 0 and m.tpot_s[0] > 0
    assert m.rounds > 0 and m.drafted > 0 and len(m.per_position_acceptance) == 3
    assert engine.stats.requests == 1 and engine.stats.output_tokens == 16


def test_request_errors(ex):
    engine = make_engine(ex, "draft")
    with pytest.raises(RequestError, match=r"draft_len=9 is larger than the target engine's max_draft_len=4"):
        engine.add_request(PROMPTS[0], GenerationConfig(draft_len=9))
    with pytest.raises(RequestError, match="is empty"):
        engine.add_request([], GenerationConfig())
    with pytest.raises(RequestError, match="unknown speculation method 'lookahead'"):
        GenerationConfig(method="lookahead")
    target_only = Engine(ex["target"])
    with pytest.raises(RequestError, match="'ngram' is not loaded"):
        target_only.add_request(PROMPTS[0], GenerationConfig(method="ngram"))
    rid = engine.add_request(PROMPTS[0], GenerationConfig(), request_id="mine")
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request(PROMPTS[0], GenerationConfig(), request_id=rid)


def test_max_draft_len_is_enforced_where_the_loop_is_built(ex):
    with pytest.raises(EngineError, match="max_draft_len=4"):
        Orchestrator(ex["target"], NGramProposer(8, 2), draft_len=8)
    with pytest.raises(EngineError, match="cannot verify drafts"):
        Orchestrator(ex["identity"], DraftModelProposer(ex["draft"]), draft_len=2)  # built without draft mode


# -- draft_len=auto ----------------------------------------------------------------------
def with_costs(orch, verify, draft):
    """Fix the step costs draft_len=auto sees, so the test checks the engine's decisions,
    not this machine's timing: verify(width) seconds per target call, draft seconds per draft step."""
    auto = orch.engine.auto
    auto.verify_cost = lambda rows, width: verify(width)
    auto.draft_cost = lambda method, rows, default: draft
    return orch


def test_auto_draft_len_is_exact_and_follows_acceptance(ex, solo):
    cfg = GenerationConfig(max_output_len=24)
    prompts = PROMPTS[:4]
    for proposer in (DraftModelProposer(ex["identity"]), DraftModelProposer(ex["draft"]), NGramProposer(MAX_DRAFT, 2)):
        out, m = Orchestrator(ex["target"], proposer, "auto").generate(prompts, cfg)  # measured costs, whatever they are
        assert [o.output_ids for o in out] == [solo[i] for i in range(4)], proposer.name
    # n-gram drafts cost nothing, verification is flat (a memory-bound target) and a repetitive
    # text accepts the drafts: auto drafts the longest it can
    rep = [[7, 8, 9] * 5]
    # (the oldest occurrence: the newest one of a 3-token period leaves only 2 tokens to copy)
    orch = with_costs(Orchestrator(ex["target"], NGramProposer(MAX_DRAFT, 2, is_use_oldest=True), "auto"), lambda w: 1.0 + 0.01 * w, 0.0)
    out, m = orch.generate(rep, GenerationConfig(max_output_len=40))
    base, _ = Orchestrator(ex["target"]).generate(rep, GenerationConfig(max_output_len=40))
    assert out[0].output_ids == base[0].output_ids
    assert m.per_token_acceptance > 0.8 and len(m.drafted_at) == MAX_DRAFT
    # a draft step as costly as a target step (the identity draft) never pays for itself, even if every draft were
    # accepted (AutoDraftLen.pays_at): auto does not draft at all, not even in its probe rounds
    drafted = []
    for batch in (prompts[:1], prompts):
        orch = with_costs(Orchestrator(ex["target"], DraftModelProposer(ex["identity"]), "auto"), lambda w: 1.0 + 0.05 * w, 1.0)
        out, m_auto = orch.generate(batch, cfg)
        assert [o.output_ids for o in out] == [solo[i] for i in range(len(batch))]
        assert m_auto.drafted <= m_auto.rounds / (PROBE_EVERY * len(batch)) + len(batch)
        drafted.append(m_auto.drafted)
    assert drafted == [0, 0]


def test_auto_policy_picks_zero_when_drafts_do_not_pay():
    from specdec.runtime.draft_len import AutoDraftLen

    auto = AutoDraftLen(8, max_batch=4)
    for w in range(1, 10):
        auto.record_verify(1, w, 5.0)  # the first call of a shape is ONNX Runtime's set-up, not a step: not timed
        auto.record_verify(1, w, 0.010 * w)  # verification cost grows with every token (a compute-bound CPU)
    auto.record_draft("draft", 1, 1, 5.0)
    auto.record_draft("draft", 1, 1, 0.004)
    assert auto.choose("draft", accepted=1, rejected=20, limit=8) == 0  # 5% acceptance: never worth it
    auto2 = AutoDraftLen(8, max_batch=4)
    for w in range(1, 10):
        for _ in range(2):
            auto2.record_verify(1, w, 0.010 + 0.0001 * w)  # flat verification at batch 1 (memory-bound): long drafts pay
            auto2.record_verify(4, w, 0.010 * w)  # at batch 4 the same GEMMs are compute-bound: drafts do not pay
    for _ in range(2):
        auto2.record_draft("ngram", 1, 1, 0.00001)
    auto2.record_verify(1, 2, 0.5)  # one stall is clipped, not believed
    assert auto2.verify_cost(1, 2) < 0.04
    assert auto2.choose("ngram", accepted=95, rejected=5, limit=8) == 8
    assert auto2.choose("ngram", accepted=95, rejected=5, limit=3) == 3
    assert auto2.choose("ngram", accepted=60, rejected=40, limit=8, rows=4) == 0
    assert auto2.choose("ngram", accepted=60, rejected=40, limit=8, rows=3) == 0  # unmeasured batch size: the nearest one


def test_auto_draft_len_prices_an_even_row_engine_by_the_rows_it_computes():
    """An engine that pads a step to even rows (an int4 target, weight_only["even_rows"]) computes k + 2 tokens
    for an even k at batch 1: k costs what k + 1 costs, so auto never picks an even k when k + 1 is allowed."""
    from specdec.runtime.draft_len import AutoDraftLen

    for even_rows in (True, False):
        auto = AutoDraftLen(8, max_batch=1, even_rows=even_rows)
        computed = (lambda w: w + w % 2) if even_rows else (lambda w: w)
        for w in range(1, 10):
            for _ in range(3):  # the first call of a shape is not timed
                auto.record_verify(1, w, 0.010 + 0.004 * computed(w))  # int4 on one thread: 0.4 of a step per row
        auto.record_draft("ngram", 1, 1, 0.0)
        auto.record_draft("ngram", 1, 1, 0.0)
        assert (auto.verify_cost(1, 5) == auto.verify_cost(1, 6)) == even_rows
        chosen = {auto.choose("ngram", accepted=a, rejected=100 - a, limit=8) for a in range(40, 100, 5)}
        if even_rows:
            assert all(k % 2 == 1 or k in (0, 8) for k in chosen), chosen
        assert len(chosen) > 1  # the acceptance moves the choice


# -- draft and target checked against each other ------------------------------------------
def _with_tokenizer(src, dst, words, special=None):
    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(src, dst)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(dst / "tokenizer.json"))
    if special:
        (dst / "tokenizer_config.json").write_text(json.dumps(special))
    cfg = json.loads((dst / "config.json").read_text())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (dst / name).is_file():
            cfg["files"][name] = sha256_file(dst / name)
    (dst / "config.json").write_text(json.dumps(cfg))
    return load_engine_dir(dst)


def test_pairing_refuses_another_tokenizer_unless_allowed(ex, tmp_path):
    t = _with_tokenizer(ex["target"].engine.path, tmp_path / "t", ["<unk>", "a", "b"])
    d = _with_tokenizer(ex["draft"].engine.path, tmp_path / "d", ["<unk>", "x", "y"])
    with pytest.raises(EngineError, match="different tokenizers"):
        check_pair(t, d)
    with pytest.warns(PairWarning, match="different tokenizers"):
        check_pair(t, d, allow_mismatch=True)
    same = _with_tokenizer(ex["draft"].engine.path, tmp_path / "s", ["<unk>", "a", "b"], {"eos_token": "b"})
    with pytest.raises(EngineError, match="different special token ids"):
        check_pair(t, same)
    ok = _with_tokenizer(ex["draft"].engine.path, tmp_path / "ok", ["<unk>", "a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_pair(t, ok) is None


def test_pairing_warns_about_a_draft_with_smaller_limits(ex, tmp_path):
    ckpt = make_checkpoint(tmp_path / "small", num_hidden_layers=1, hidden_size=32, intermediate_size=64, seed=0)
    small = build_and_load(ckpt, tmp_path / "se", spec_build(0, max_seq_len=64))
    with pytest.warns(PairWarning, match="max_seq_len 64 < 96"):
        Orchestrator(ex["target"], DraftModelProposer(small), 2)


# -- the runtime stays light -----------------------------------------------------------------
def test_decoding_imports_no_builder_torch_or_onnx(ex):
    code = f"""
import sys
from specdec.runtime import load_orchestrator, GenerationConfig, NGramConfig
from specdec.runtime import DraftTargetConfig
for orch in (load_orchestrator({str(ex['target'].engine.path)!r}, ngram=NGramConfig(3, 2, [0])),
             load_orchestrator({str(ex['target'].engine.path)!r}, {str(ex['draft'].engine.path)!r}, DraftTargetConfig(3, [0], [0], False),
                               draft_len="auto")):
    out, m = orch.generate([[5, 6, 7, 5, 6, 7]], GenerationConfig(max_output_len=8))
    assert len(out[0].output_ids) == 8
heavy = [m for m in ("torch", "transformers", "onnx", "specdec.builder", "specdec.plugins") if m in sys.modules]
print("HEAVY", heavy)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout, r.stdout


# -- random interleavings ---------------------------------------------------------------------
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["add", "step", "step", "abort"]), st.integers(0, len(PROMPTS) - 1),
                          st.sampled_from(["none", "draft", "ngram"])), min_size=1, max_size=30))
def test_random_add_step_abort_sequences(ex, solo, ops):
    engine = make_engine(ex, "draft")
    cfg = {m: GenerationConfig(max_output_len=24, method=m) for m in ("none", "draft", "ngram")}
    prompt_of, aborted, outputs = {}, set(), {}
    for op, i, method in ops:
        if op == "add":
            prompt_of[engine.add_request(PROMPTS[i], cfg[method])] = i
        elif op == "abort" and prompt_of:
            rid = sorted(prompt_of)[i % len(prompt_of)]
            if rid not in outputs:
                aborted.add(rid)
            engine.abort(rid)
        else:
            for o in engine.step():
                assert o.request_id not in outputs
                if o.finished:
                    outputs[o.request_id] = o
        slots = [r.slot for r in engine.running]
        assert slots == list(range(len(slots))) and len(slots) <= engine.max_batch  # no slot used twice
    drain(engine, outputs)
    assert set(outputs) == set(prompt_of)  # every request ended exactly once
    for rid, o in outputs.items():
        if rid in aborted:
            assert o.finish_reason == "abort" and o.output_ids == solo[prompt_of[rid]][: len(o.output_ids)]
        else:
            assert o.output_ids == solo[prompt_of[rid]]


def test_auto_expected_tokens_follow_the_measured_positions():
    from specdec.runtime.draft_len import AutoDraftLen

    auto = AutoDraftLen(4)
    a = 0.5
    geometric = (1 - a ** (np.arange(5) + 1)) / (1 - a)
    np.testing.assert_allclose(auto.expected_tokens("ngram", a, 4), geometric)  # nothing measured: the standard formula
    for _ in range(200):  # all-or-nothing drafts: half the rounds keep all 4, half lose the first
        auto.record_round("ngram", 4, 4)
        auto.record_round("ngram", 4, 0)
    e = auto.expected_tokens("ngram", auto.accepted["ngram"] / auto.reached["ngram"], 4)
    # after a first accepted token the rest survive: each extra draft is worth almost as much as the first
    assert e[4] - e[3] > 0.4 and e[4] > geometric[4] + 0.2


def test_auto_keeps_its_draft_length_unless_another_is_clearly_faster():
    from specdec.runtime.draft_len import AutoDraftLen

    auto = AutoDraftLen(8)
    auto.verify_cost = lambda rows, width: 1.0 + 0.02 * width
    auto.draft_cost = lambda method, rows, default: 0.05
    best = auto.choose("ngram", accepted=60, rejected=40, limit=8)
    assert best > 0
    # a neighbour of the best is within a few percent: kept, so the call width does not churn
    assert auto.choose("ngram", accepted=60, rejected=40, limit=8, current=best + 1) == best + 1
    assert auto.choose("ngram", accepted=60, rejected=40, limit=8, current=0) == best  # k = 0 is far slower: left


def test_an_auto_request_prefills_the_draft_only_when_it_first_drafts(ex, solo, monkeypatch):
    """draft_len=auto: the draft model joins a request with its prompt pending (no draft call at admission); the
    first round that drafts feeds that backlog in a call of its own, and the output is still target-only's.
    A fixed draft_len prefills the draft at admission, as before."""
    calls = []
    real = ex["draft"].forward
    monkeypatch.setattr(ex["draft"], "forward", lambda cache, feed, *a, **kw: (calls.append([len(f) for f in feed]), real(cache, feed, *a, **kw))[1])
    lazy = DraftModelProposer(ex["draft"])
    engine = Engine(ex["target"], [lazy], SpeculationConfig("draft", "auto"))
    engine.auto.verify_cost = lambda rows, width: 1.0 + 0.01 * width  # drafting pays: the request drafts at once
    engine.auto.draft_cost = lambda method, rows, default: 0.0
    rid = engine.add_request(PROMPTS[2], GenerationConfig(max_output_len=24))
    engine.step()  # the target's prefill and first token
    assert calls == [] and lazy.backlog(engine.requests[rid]) == len(PROMPTS[2])
    out = drain(engine)
    assert out[rid].output_ids == solo[2]
    assert calls[0] == [len(PROMPTS[2])]  # the catch-up: the prompt and the first token, but the last one
    assert out[rid].metrics.drafted > 0
    calls.clear()
    fixed = DraftModelProposer(ex["draft"])
    engine = Engine(ex["target"], [fixed], SpeculationConfig("draft", 3))
    rid = engine.add_request(PROMPTS[2], GenerationConfig(max_output_len=24))
    engine.step()
    assert calls == [[len(PROMPTS[2])]] and fixed.backlog(engine.requests[rid]) == 0
    assert drain(engine)[rid].output_ids == solo[2]


def test_catch_up_feeds_each_run_of_adjacent_slots_once(ex, monkeypatch):
    from specdec.runtime.request import AUTO, Request

    p = DraftModelProposer(ex["draft"])
    reqs = [Request(f"r{i}", list(range(20 + i, 40 + i)), GenerationConfig(max_output_len=8), "draft", AUTO,
                    np.random.default_rng(0), output_ids=[3]) for i in range(4)]
    reqs[1].draft_len = 2  # a fixed draft length: prefilled at admission, no backlog
    p.add(reqs)
    assert [p.backlog(r) for r in reqs] == [20, 0, 20, 20]
    seen = []
    real = ex["draft"].forward
    monkeypatch.setattr(ex["draft"], "forward", lambda cache, feed, *a,
                        **kw: (seen.append((kw.get("first_slot"), [len(f) for f in feed])), real(cache, feed, *a, **kw))[1])
    assert p.catch_up(reqs) == 60
    assert seen == [(0, [20]), (2, [20, 20])]  # slot 1 has nothing to feed: two runs, no row rides along
    assert [p.backlog(r) for r in reqs] == [0, 0, 0, 0] and p.catch_up(reqs) == 0
    assert [int(p.cache.lengths[s]) for s in range(4)] == [20, 20, 20, 20]


def test_auto_weighs_the_catch_up_before_a_request_first_drafts():
    from specdec.runtime.draft_len import AutoDraftLen

    auto = AutoDraftLen(8, max_batch=8)
    auto.verify_cost = lambda rows, width: 1.0 + (0.02 if rows == 1 else 0.3) * (width - 1)
    auto.draft_cost = lambda method, rows, default: 0.05
    auto.record_round("draft", 4, 3)
    # a good draft at one row pays for its prompt's prefill (a step's worth) many times over
    assert auto.choose("draft", 30, 10, 8, rows=1, catch_up_s=1.0, left=32) > 0
    # at 8 rows k = 2 gains 25% without a catch-up (2.35 tokens for 1.7 of a call); when every row first pays a step
    # for a prefill spread over 32 tokens, the round costs 2.29 and no k gains the 10% drafting must promise
    assert auto.choose("draft", 30, 10, 8, rows=8, catch_up_s=0.0, left=32) == 2
    assert auto.choose("draft", 30, 10, 8, rows=8, catch_up_s=1.0, left=32) == 0
    assert auto.choose("draft", 30, 10, 8, rows=8, catch_up_s=1.0, left=10_000) == 2  # spread over HORIZON tokens
    # measured: seconds per fed token from the catch-up calls (the first, ONNX Runtime's set-up for the shape, is not)
    auto.record_catch_up("draft", 100, 9.0)
    auto.record_catch_up("draft", 100, 0.2)
    assert auto.catch_up_cost("draft", 50) == pytest.approx(0.1)
    assert auto.catch_up_cost("draft", 0) == 0.0


@pytest.mark.parametrize("method_rounds", [0, "explored"])
def test_a_probe_does_not_prefill_the_draft(ex, method_rounds):
    """A request at k = 0 whose draft never read its prompt is not probed once its method has been explored: the
    probe would cost the prompt's prefill on the draft (more than PROBE_BACKLOG tokens), for one draft token. A short
    prompt is probed. While the method has drafted in fewer than EXPLORE_ROUNDS rounds, a long prompt is probed too:
    otherwise a draft model behind long prompts never drafts, and auto never learns whether it pays."""
    from specdec.runtime.draft_len import EXPLORE_ROUNDS, PROBE_BACKLOG

    drafted = {}
    for n in (6, PROBE_BACKLOG + 8):
        # a draft step at 45% of a target step: a perfect drafter would pay (2 tokens for 1.55 steps), the prior
        # acceptance (0.5) would not: k = 0, with probes
        orch = with_costs(Orchestrator(ex["target"], DraftModelProposer(ex["identity"]), "auto"), lambda w: 1.0 + 0.05 * w, 0.45)
        if method_rounds == "explored":
            orch.engine.auto.drafting_rounds["draft"] = EXPLORE_ROUNDS
        _, m = orch.generate([list(range(40, 40 + n))], GenerationConfig(max_output_len=3 * PROBE_EVERY))
        drafted[n] = m.drafted
    assert drafted[6] >= 2, drafted
    assert (drafted[PROBE_BACKLOG + 8] == 0) == (method_rounds == "explored"), drafted


@pytest.mark.parametrize("max_output_len", [PROBE_EVERY + 2, 3 * PROBE_EVERY])
def test_an_exploring_probe_needs_tokens_left_to_repay_the_prefill(ex, max_output_len):
    """While its method is still exploring, a request behind a long prompt is probed only if a perfect drafter could
    repay the prompt's prefill on the draft in the tokens the request has left: at the first probe round (round 16) a
    request of 18 tokens has 2 left, and the prefill of its ~56-token backlog costs ~3 target steps."""
    from specdec.runtime.draft_len import PROBE_BACKLOG

    orch = with_costs(Orchestrator(ex["target"], DraftModelProposer(ex["identity"]), "auto"), lambda w: 1.0 + 0.05 * w, 0.45)
    out, m = orch.generate([list(range(40, 48 + PROBE_BACKLOG))], GenerationConfig(max_output_len=max_output_len))
    assert len(out[0].output_ids) == max_output_len
    assert (m.drafted == 0) == (max_output_len == PROBE_EVERY + 2), m.drafted


def test_catch_up_cuts_a_backlog_to_the_engines_input_limit(ex, monkeypatch):
    """A backlog is the prompt and every token emitted while the request did not draft: it can be longer than the
    engine's max_input_len. It is fed in pieces, one slot at a time (no row pads out to another's long feed)."""
    from specdec.runtime.request import AUTO, Request

    p = DraftModelProposer(ex["draft"])
    limit = ex["draft"].build.max_input_len  # 48
    cfg = GenerationConfig(max_output_len=8)
    reqs = [Request("long", [(5 + i) % 90 for i in range(limit)], cfg, "draft", AUTO, np.random.default_rng(0), output_ids=list(range(30, 42))),
            Request("short", list(range(20, 40)), cfg, "draft", AUTO, np.random.default_rng(0), output_ids=[3])]
    p.add(reqs)
    seen = []
    real = ex["draft"].forward
    monkeypatch.setattr(ex["draft"], "forward", lambda cache, feed, *a,
                        **kw: (seen.append((kw.get("first_slot"), [len(f) for f in feed])), real(cache, feed, *a, **kw))[1])
    assert p.catch_up(reqs) == limit + 11 + 20
    assert seen == [(0, [limit]), (0, [11]), (1, [20])]
    assert [int(p.cache.lengths[s]) for s in range(2)] == [limit + 11, 20] and p.pending["long"] == [41]


def test_a_draft_cut_after_drafting_leaves_the_draft_cache_as_fed(ex):
    """draft_len=auto's batch-width cap may cut a chain after the draft model fed it: the draft's cache must drop
    what it fed beyond the kept drafts (not what the cut draft says), and feed nothing twice."""
    from specdec.runtime.proposers.base import Draft, TargetOutput
    from specdec.runtime.request import Request

    p = DraftModelProposer(ex["draft"])
    r = Request("r", [5, 6, 7, 8, 9, 10], GenerationConfig(max_output_len=16), "draft", 3, np.random.default_rng(0), output_ids=[11])
    p.add([r])
    assert int(p.cache.lengths[0]) == 6 and p.pending["r"] == [11]
    d = p.propose([r], [3])[0]  # fed 11 and the first two drafts: the cache holds 9
    assert len(d) == 3 and int(p.cache.lengths[0]) == 9
    p.observe(r, Draft.empty(), TargetOutput(None, 0, [12], [0]))  # the round cut all three; the target emitted 12
    assert int(p.cache.lengths[0]) == 7 and p.pending["r"] == [12]  # prompt + 11 fed, 12 pending
    d = p.propose([r], [3])[0]
    p.observe(r, d.prefix(1), TargetOutput(None, 1, [int(d.tokens[0]), 40], [0, 1]))  # cut to one draft, accepted
    assert int(p.cache.lengths[0]) == 9 and p.pending["r"] == [40]  # + 12 and the kept draft


def test_a_batch_where_no_chain_pays_costs_one_check_not_a_choice_per_request(ex, solo):
    """may_draft: a draft step at 45% of a target step, the method's prior acceptance (0.5): a perfect drafter would
    pay, this one would not, at any request's acceptance. Outside probe rounds no request is priced one by one."""
    orch = with_costs(Orchestrator(ex["target"], DraftModelProposer(ex["draft"]), "auto"), lambda w: 1.0 + 0.05 * w, 0.45)
    calls = []
    real = orch.engine.auto.choose
    orch.engine.auto.choose = lambda *a, **k: calls.append(a) or real(*a, **k)
    out, m = orch.generate(PROMPTS[:4], GenerationConfig(max_output_len=24))  # 23 rounds of 4 rows: no probe round (64)
    assert [o.output_ids for o in out] == [solo[i] for i in range(4)]
    assert calls == [] and m.drafted == 0


def test_rows_without_drafts_take_the_batched_greedy_path_with_the_same_outcome(ex, solo, monkeypatch):
    """SpeculativeRound.plain_picks: a batch's greedy rows without drafts take their argmax in one call over the batch
    (accept_plain). Outputs, metrics and auto's learning are what the per-row accept gives; a NaN, +Inf or -Inf row
    is left to accept (which stops that request), as is a row with drafts, a sampled one or one with log-probabilities."""
    from types import SimpleNamespace

    from specdec.runtime.proposers.base import Draft
    from specdec.runtime.round import SpeculativeRound

    def run(batched: bool):
        if not batched:
            monkeypatch.setattr(SpeculativeRound, "plain_picks", lambda self, reqs, drafts, step: {})
        orch = Orchestrator(ex["target"], DraftModelProposer(ex["draft"]), "auto")
        auto = orch.engine.auto  # fixed costs: auto's choices must not follow the two runs' timings (they did, on a busy CI host)
        auto.verify_cost = lambda rows, width: 1.0 + 0.02 * width
        auto.draft_cost = lambda method, rows, default: 0.1
        auto.catch_up_cost = lambda method, tokens, rows=1: 0.01 * tokens
        out, m = orch.generate(PROMPTS, GenerationConfig(max_output_len=24))
        return [o.output_ids for o in out], (m.rounds, m.drafted, m.accepted), auto.describe("draft", len(PROMPTS))["drafting_rounds"]

    plain_picks = SpeculativeRound.plain_picks
    calls = []
    real = SpeculativeRound.accept_plain
    monkeypatch.setattr(SpeculativeRound, "accept_plain", lambda self, *a: calls.append(1) or real(self, *a))
    batched = run(True)
    assert calls and batched[0] == [solo[i] for i in range(len(PROMPTS))]
    assert run(False) == batched and batched[1][1] > 0  # outputs, metrics and auto's drafting rounds; drafting and plain rows
    logits = np.random.default_rng(0).standard_normal((5, 1, 16)).astype(np.float32)
    logits[1, 0, 3], logits[2, 0, 7], logits[3, 0, 0] = np.nan, np.inf, -np.inf
    greedy = SimpleNamespace(logprobs=None, sampling=SamplingConfig())
    reqs = [SimpleNamespace(slot=i, config=greedy, processor=None) for i in range(5)]
    round_ = SimpleNamespace(vocab_limit=None)
    picks = plain_picks(round_, reqs, [Draft.empty()] * 5, SimpleNamespace(logits=logits))
    assert picks == {0: int(logits[0, 0].argmax()), 4: int(logits[4, 0].argmax())}  # the non-finite rows go to accept
    sampled = SimpleNamespace(logprobs=None, sampling=SamplingConfig(temperature=0.7))
    reqs[4] = SimpleNamespace(slot=4, config=sampled, processor=None)
    assert plain_picks(round_, reqs, [Draft.empty()] * 5, SimpleNamespace(logits=logits)) == {0: int(logits[0, 0].argmax())}
    reqs[1:4] = [SimpleNamespace(slot=i, config=sampled, processor=None) for i in (1, 2, 3)]
    assert plain_picks(round_, reqs, [Draft.empty()] * 5, SimpleNamespace(logits=logits)) == {}  # one plain row: per row


def test_kept_rows_copies_a_chains_prefix_and_a_trees_path():
    from specdec.runtime.proposers.base import kept_rows

    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    for rows in ([0], [0, 1, 2], [0, 2, 5], [0, 1, 3]):
        got = kept_rows(a, rows)
        np.testing.assert_array_equal(got, a[rows])
        assert not np.shares_memory(got, a)  # a copy: the step's buffer is reused by the next call
