"""What a round watches besides tokens (runtime/guards.py): logits that are not numbers stop that request with an
error, and drafts the target rejects round after round are reported once (and, with draft_len=auto, dropped).

Real engines, no mocks: a target built (--allow_nonfinite) from a checkpoint with one NaN embedding row, whose
logits turn NaN only once that token is in a request's context; and a draft whose LM head is rolled by one row,
so it always proposes the token after the target's choice: ids that "mean something else", which no tokenizer
check can see (both share one tokenizer.json).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from checkpoints import add_word_tokenizer, make_checkpoint
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from specdec.builder.build import build_engine
from specdec.cli.run import main as run_main
from specdec.formats.config_strings import DraftTargetConfig
from specdec.formats.engine_format import BuildConfig
from specdec.runtime import GenerationConfig, load_engine, load_orchestrator
from specdec.runtime.guards import SILENT_DRAFT_ROUNDS
from specdec.runtime.sampling import SamplingConfig

PROMPTS = [[1, 40, 41, 42, 43], [1, 70, 71, 72, 73, 74]]
OUT = 24


def limits(max_draft_len: int, max_seq_len: int = 96) -> BuildConfig:
    mode = "draft_tokens_external" if max_draft_len else "none"
    return BuildConfig(max_batch_size=2, max_input_len=16, max_seq_len=max_seq_len, max_draft_len=max_draft_len, speculative_decoding_mode=mode)


def rewrite(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def greedy(engine_dir, prompts, n=OUT):
    outputs, _ = load_orchestrator(engine_dir, num_threads=1).generate(prompts, GenerationConfig(max_output_len=n, end_ids=()))
    return [o.output_ids for o in outputs]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("guards")
    ckpt = add_word_tokenizer(make_checkpoint(d / "ckpt", tie_word_embeddings=False, max_position_embeddings=1024))
    build_engine(ckpt, d / "target", limits(4, 900), say=lambda _: None)
    build_engine(ckpt, d / "draft", limits(0, 900), say=lambda _: None)
    clean = greedy(d / "target", PROMPTS)
    # the poison: a token the first request's greedy output reaches (at position j), that appears nowhere in the second's
    j, poison = next((j, t) for j, t in enumerate(clean[0]) if j >= 2 and t not in clean[0][:j] and t not in PROMPTS[0] + PROMPTS[1] + clean[1])
    nan = rewrite(ckpt, d / "ckpt-nan", lambda t: t["model.embed_tokens.weight"].__setitem__(poison, np.nan))
    with pytest.warns(UserWarning, match="building with non-finite weights"):
        build_engine(nan, d / "target-nan", limits(4), say=lambda _: None, allow_nonfinite=True)
    rolled = rewrite(ckpt, d / "ckpt-rolled", lambda t: t.__setitem__("lm_head.weight", np.roll(t["lm_head.weight"], 1, axis=0)))
    build_engine(rolled, d / "draft-rolled", limits(0, 900), say=lambda _: None)
    return {"dir": d, "clean": clean, "poison": poison, "at": j}


# -- non-finite logits ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["none", "draft"])
def test_nonfinite_logits_stop_that_request_with_an_error_and_no_token(pair, method):
    d = pair["dir"]
    draft = (d / "draft", DraftTargetConfig(3, [0], [0], False)) if method == "draft" else (None, None)
    orch = load_orchestrator(d / "target-nan", *draft, num_threads=1)
    poisoned = PROMPTS[1][:2] + [pair["poison"]]  # NaN from the prompt on: stopped at prefill, before its first token
    outputs, metrics = orch.generate(PROMPTS + [poisoned], GenerationConfig(max_output_len=OUT, end_ids=()))
    first, second, third = outputs
    # target-only: the first request emitted the poison (its logits were still finite), then its next logits were NaN: it
    # stops there with the tokens so far. With drafts it may stop sooner, never later: a drafted poison's NaN keys reach the
    # other rows of its call through masked attention (runtime/guards.py). Every token it kept is target-only greedy's.
    assert first.finish_reason == "error" and "logits are not finite (NaN or Inf) at output position" in first.error
    at = pair["at"] + 1
    if method == "none":
        assert first.output_ids == pair["clean"][0][:at]
    else:
        assert first.output_ids == pair["clean"][0][: len(first.output_ids)] and len(first.output_ids) <= at
    assert second.finish_reason == "length" and second.output_ids == pair["clean"][1] and not second.error  # its neighbour is untouched
    assert third.finish_reason == "error" and third.output_ids == [] and "at output position 0" in third.error
    assert metrics.requests == 3


@pytest.mark.parametrize("method", ["none", "draft"])
def test_nonfinite_logits_stop_a_sampled_request_and_the_engine_serves_on(pair, method):
    """A sampled request turns its rows into probabilities (top-k, min-p and top-p on the tokens still possible) before
    the non-finite check reads them: a NaN row must end that request with the error, as for a greedy one, not raise out
    of the round. The poison token is forced by a logit bias; the next generate on the same engine is served."""
    d = pair["dir"]
    draft = (d / "draft", DraftTargetConfig(3, [0], [0], False)) if method == "draft" else (None, None)
    orch = load_orchestrator(d / "target-nan", *draft, num_threads=1)
    sampled = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9, min_p=0.01, random_seed=1, logit_bias=((pair["poison"], 100.0),))
    (out,), _ = orch.generate([PROMPTS[0]], GenerationConfig(max_output_len=OUT, end_ids=(), sampling=sampled))
    assert out.finish_reason == "error" and "logits are not finite (NaN or Inf) at output position" in out.error
    assert pair["poison"] in out.output_ids  # it emitted the poison, then its next row was NaN
    (after,), _ = orch.generate([PROMPTS[1]], GenerationConfig(max_output_len=OUT, end_ids=()))
    assert after.finish_reason == "length" and after.output_ids == pair["clean"][1]


def test_a_lone_request_stops_on_nonfinite_logits_as_in_a_batch(pair, monkeypatch):
    """Alone, a plain greedy request runs the short round (SpeculativeRound.decode_plain): the same stop, tokens and error."""
    from specdec.runtime.round import SpeculativeRound

    taken, plain = [], SpeculativeRound.decode_plain
    monkeypatch.setattr(SpeculativeRound, "decode_plain", lambda self, reqs, new: taken.append(1) or plain(self, reqs, new))
    outputs, _ = load_orchestrator(pair["dir"] / "target-nan", num_threads=1).generate([PROMPTS[0]], GenerationConfig(max_output_len=OUT, end_ids=()))
    assert len(taken) == pair["at"] + 1  # every round of it was the short one, the last stopping on NaN
    (first,) = outputs
    assert first.finish_reason == "error" and first.error_cause == "nonfinite_logits"
    assert "logits are not finite (NaN or Inf) at output position" in first.error
    assert first.output_ids == pair["clean"][0][: pair["at"] + 1]


def test_a_slot_that_held_nan_is_clean_for_the_next_request(pair):
    """A request that ended on NaN leaves NaN keys and values in its slot. Masked positions past a slot's length are
    still read when a longer neighbour sets the call's length, and a zero weight times NaN is NaN: the next request in
    that slot must not inherit them (found in review: it ended on "error" where a fresh engine gives its output)."""
    d = pair["dir"]
    engine = load_engine(d / "target-nan", num_threads=1)
    runner, poisoned, late = PROMPTS[1], PROMPTS[1] + [pair["poison"]], [1, 40]  # late: shorter than poisoned's NaN rows
    engine.add_request(runner, GenerationConfig(max_output_len=OUT, end_ids=()), request_id="runner")
    engine.add_request(poisoned, GenerationConfig(max_output_len=OUT, end_ids=()), request_id="poisoned")
    done = {o.request_id: o for o in engine.step() if o.finished}
    assert done["poisoned"].finish_reason == "error"  # NaN from its prompt on: its slot's rows 0..6 hold NaN
    for _ in range(4):  # the runner grows past the poisoned request's rows, so calls with both read them
        engine.step()
    engine.add_request(late, GenerationConfig(max_output_len=8, end_ids=()), request_id="late")
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done["late"].finish_reason == "length" and done["late"].output_ids == greedy(d / "target", [late], 8)[0]
    assert done["runner"].finish_reason == "length" and done["runner"].output_ids == pair["clean"][1]


def test_specdec_run_prints_what_it_can_and_fails_in_one_line(pair, tmp_path):
    d = pair["dir"]
    (tmp_path / "p.csv").write_text("\n".join(",".join(map(str, p)) for p in PROMPTS) + "\n")
    r = CliRunner().invoke(run_main, [str(a) for a in ("--engine_dir", d / "target-nan", "--input_file", tmp_path / "p.csv", "--end_id", -1,
                                                      "--max_output_len", OUT, "--num_threads", 1, "--output_json", tmp_path / "o.json")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert r.stderr.splitlines() == [line for line in r.stderr.splitlines() if line.startswith("error: request 0 stopped: the target's logits")]
    assert len(r.stderr.splitlines()) == 1
    report = json.loads((tmp_path / "o.json").read_text())["requests"]
    assert report[0]["finish_reason"] == "error" and "not finite" in report[0]["error"]
    assert report[1]["output_ids"] == pair["clean"][1] and "error" not in report[1]


# -- drafts that never land -------------------------------------------------------------------------


def drive(engine, prompt, n):
    """Step one request to its end: (final output, [(tokens so far, drafted so far, warning)] for the steps with a warning)."""
    engine.add_request(prompt, GenerationConfig(max_output_len=n, end_ids=()))
    warned, last = [], None
    while engine.has_unfinished():
        for out in engine.step():
            if out.warning:
                warned.append((len(out.output_ids), out.metrics.drafted, out.warning))
            last = out
    return last, warned


def test_a_draft_that_never_lands_is_reported_once(pair):
    d = pair["dir"]
    out, warned = drive(load_engine(d / "target", d / "draft-rolled", draft_len=3, num_threads=1), PROMPTS[0], 80)
    assert out.metrics.accepted == 0 and out.metrics.silent_drafts == 1
    assert len(warned) == 1  # once, at the round that made SILENT_DRAFT_ROUNDS in a row
    tokens, drafted, message = warned[0]
    assert drafted == 3 * SILENT_DRAFT_ROUNDS and tokens == 1 + SILENT_DRAFT_ROUNDS
    assert message.startswith(f"the target rejected every draft-model draft of the last {SILENT_DRAFT_ROUNDS} drafting rounds")
    assert out.metrics.drafted > drafted + 3 * 20  # a fixed draft_len keeps drafting: the user asked for it
    assert out.output_ids == greedy(d / "target", [PROMPTS[0]], 80)[0]  # and the output is still exactly the target's


def test_draft_len_auto_stops_drafting_once_it_is_reported(pair):
    d = pair["dir"]
    engine = load_engine(d / "target", d / "draft-rolled", draft_len="auto", num_threads=1)
    # costs at which a perfect drafter would pay (else auto never drafts at all: AutoDraftLen.pays_at), fixed, not timed
    engine.auto.verify_cost = lambda rows, width: 1.0 + 0.05 * width
    engine.auto.draft_cost = lambda method, rows, default: 0.1
    out, warned = drive(engine, PROMPTS[0], 880)
    # auto soon drafts 0 and probes every PROBE_EVERY rounds: the evidence is the drafting rounds, however spread out
    assert len(warned) == 1 and warned[0][2].endswith("draft_len=auto stopped drafting for it.")
    tokens, drafted, _ = warned[0]
    assert out.metrics.drafted == drafted  # not one draft after it
    assert out.metrics.silent_drafts == 1 and len(out.output_ids) == 880


def test_a_working_draft_is_never_reported(pair):
    d = pair["dir"]
    out, warned = drive(load_engine(d / "target", d / "draft", draft_len=3, num_threads=1), PROMPTS[0], 200)
    assert not warned and out.metrics.silent_drafts == 0 and out.metrics.accepted > 0


def test_specdec_run_warns_once_for_the_run(pair):
    d = pair["dir"]
    r = CliRunner().invoke(run_main, [str(a) for a in ("--engine_dir", d / "target", "--draft_engine_dir", d / "draft-rolled",
                                                       "--draft_target_model_config",
                                                      "[2,[0],[0],False]", "--input_text", "w40 w41 w42 w43", "--input_text", "w70 w71 w72",
                                                       "--end_id", -1,
                                                      "--max_output_len", 64, "--num_threads", 1)])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == [f"warning: 2 of 2 requests: the target rejected every draft-model draft of the last {SILENT_DRAFT_ROUNDS} "
                                     "drafting "
                                     "rounds: the draft's token ids may mean something else to the target (another tokenizer or vocabulary), "
                                     "or it was trained for another model."]


def test_the_greedy_rounds_argmax_check_finds_what_the_reduction_finds():
    """first_nonfinite_of_argmax (a plain greedy round's check, from the rows' argmaxes and an argmin) and first_nonfinite
    (a sum, then the exact check) name the same first bad row: NaN, +Inf or -Inf in any row and column, several at once,
    and finite rows whose sum overflows float32 (which a sum alone would take for Inf)."""
    from specdec.runtime.guards import first_nonfinite, first_nonfinite_of_argmax

    base = np.random.default_rng(0).standard_normal((4, 50)).astype(np.float32)
    cases = [base, np.full((4, 50), 3e38, np.float32), np.full((4, 50), -3e38, np.float32)]
    for bad in (np.nan, np.inf, -np.inf):
        for row in range(4):
            for col in (0, 17, 49):
                rows = base.copy()
                rows[row, col] = bad
                cases.append(rows)
    mixed = base.copy()
    mixed[2, 3], mixed[2, 40], mixed[3, 0] = -np.inf, np.nan, np.inf  # a NaN after a -Inf in one row, an Inf in the next
    cases.append(mixed)
    for rows in cases:
        tops = rows.argmax(axis=-1).tolist()
        assert first_nonfinite_of_argmax(rows, tops) == first_nonfinite(rows)
        assert first_nonfinite_of_argmax(rows[:2], tops) == first_nonfinite(rows[:2])  # the rows read: fewer than were argmax'd
    assert first_nonfinite_of_argmax(cases[4], cases[4].argmax(axis=-1).tolist()) == 0  # (a case that is bad: the check can fail)
