"""specdec-train run on a tiny base: the base stays bit-identical, the loss falls, checkpoints resume exactly,
and what is saved is ModelOpt's layout, read back identically by load_heads."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import load_hf
from safetensors.torch import load_file
from train_fixtures import repetitive_data, tiny_base  # noqa: F401 (fixtures)

from specdec.formats.heads import EAGLE_CONFIG_DEFAULTS, MASK_HIDDEN, eagle_tensor_names, medusa_tensor_names
from specdec.train import load_heads
from specdec.train.base import weights_sha256
from specdec.train.trainer import TrainConfig, train

QUIET = dict(say=lambda _: None, progress_bar=False)


def config(mode, base, data, out, **kw) -> TrainConfig:
    return TrainConfig(**({"mode": mode, "model": str(base), "data": str(data), "output_dir": str(out), "lr": 1e-2,
                           "batch_size": 4, "max_steps": 40, "save_steps": 20, "medusa_num_heads": 2, "medusa_num_layers": 1,
                           "eagle_ttt_steps": 3, "peagle_depths": 3} | kw))


@pytest.fixture(scope="module", params=["medusa", "eagle", "peagle"])
def trained(request, tmp_path_factory, tiny_base, repetitive_data):
    out = tmp_path_factory.mktemp(f"train-{request.param}") / "out"
    sha_before = weights_sha256(tiny_base)
    result = train(config(request.param, tiny_base, repetitive_data, out), **QUIET)
    return request.param, result, sha_before


def test_base_weights_are_bit_identical_after_training(trained, tiny_base):
    mode, result, sha_before = trained
    fresh = load_hf(tiny_base).state_dict()
    after = result.base.state_dict()
    assert set(after) == set(fresh)
    assert all(torch.equal(after[k], fresh[k]) for k in fresh), "a base weight changed in memory"
    assert weights_sha256(tiny_base) == sha_before, "the base checkpoint on disk changed"
    assert not any(p.requires_grad for p in result.base.parameters())


def test_loss_falls_by_a_real_margin(trained):
    mode, result, _ = trained
    first, last = np.mean(result.losses[:3]), np.mean(result.losses[-5:])
    assert result.steps == len(result.losses) == 40
    # the data is a 12-token cycle: two tokens ahead is fully determined, so the heads can learn it
    assert last < 0.5 * first, (mode, first, last)
    # top-1 (medusa: the token 2 and 3 ahead; eagle: the base's own choice at drafting depths 1, 2, 3) clearly up
    assert len(result.accuracy) == (2 if mode == "medusa" else 3)  # heads, TTT steps, or drafting positions
    assert all(a > b + 0.1 for a, b in zip(result.accuracy, result.accuracy_before, strict=False)), (result.accuracy_before, result.accuracy)


def test_saved_heads_follow_the_documented_layout(trained, tiny_base):
    mode, result, _ = trained
    out = result.output_dir
    saved = load_file(str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    if mode == "medusa":
        assert set(saved) == set(medusa_tensor_names(2, 1))
        assert cfg["medusa"] == {"num_medusa_heads": 2, "num_medusa_layers": 1}
        assert cfg["hidden_size"] == 64 and cfg["vocab_size"] == 96  # the base's own config, plus the block
    else:
        assert set(saved) == set(eagle_tensor_names(1)) | ({MASK_HIDDEN} if mode == "peagle" else set())
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
        if mode == "peagle":  # anchored (the default): [1, depths - 1, num_aux * hidden], a vector per placeholder depth; the placeholders' token
            assert saved[MASK_HIDDEN].shape == (1, 2, 2 * 64) and (cfg["ptd_token_id"], cfg["para_depths"], cfg["peagle_placeholders"]) == (0, 3,
                                                                                                                                            "anchored")
        assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1], **EAGLE_CONFIG_DEFAULTS}
        assert cfg["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == cfg["vocab_size"] == 96
        base_head = load_hf(tiny_base).lm_head.weight
        assert torch.equal(saved["lm_head.weight"], base_head)  # the base's LM head, frozen, exported as ModelOpt does
    assert cfg["specdec_train"]["base_model_sha256"] == weights_sha256(tiny_base)
    ckpt = load_heads(out, base_num_layers=4)
    own = result.heads.state_dict()
    assert set(ckpt.tensors) == set(own) and ckpt.mode == mode
    assert all(np.array_equal(ckpt.tensors[k], own[k].numpy().reshape(ckpt.tensors[k].shape)) for k in own)


def test_run_leaves_card_curve_log_and_checkpoints(trained):
    mode, result, _ = trained
    out = result.output_dir
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-20", "checkpoint-40"]
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    card = (out / "README.md").read_text()
    assert f"| mode | {mode}" in card and "| steps | 40 |" in card and weights_sha256(result.base.name_or_path) in card
    log = json.loads((out / "training_log.json").read_text())
    assert log["losses"] == result.losses and log["steps"] == 40
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "a temporary file was left behind"


@pytest.mark.parametrize("mode", ["medusa", "eagle", "peagle"])
def test_resume_continues_where_it_stopped(tmp_path, tiny_base, repetitive_data, mode):
    straight = train(config(mode, tiny_base, repetitive_data, tmp_path / "a", max_steps=12, save_steps=4), **QUIET)
    train(config(mode, tiny_base, repetitive_data, tmp_path / "b", max_steps=8, save_steps=4), **QUIET)  # "interrupted" at 8
    state = json.loads((tmp_path / "b" / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["step"] == 8 and len(state["losses"]) == 8
    resumed = train(config(mode, tiny_base, repetitive_data, tmp_path / "b", max_steps=12, save_steps=4, resume=True), **QUIET)
    assert resumed.steps == 12 and resumed.losses == straight.losses  # the same batches, the same updates
    a, b = straight.heads.state_dict(), resumed.heads.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    opt_a = load_file(str(tmp_path / "a" / "checkpoint-12" / "optimizer.safetensors"))
    opt_b = load_file(str(tmp_path / "b" / "checkpoint-12" / "optimizer.safetensors"))
    assert set(opt_a) == set(opt_b) and any(k.endswith(".exp_avg_sq") for k in opt_a)
    assert all(torch.equal(opt_a[k], opt_b[k]) for k in opt_a)  # moments and step counts carried over
    assert float(opt_b[next(k for k in opt_b if k.endswith(".step"))]) == 12


def test_resume_refuses_other_heads(tmp_path, tiny_base, repetitive_data):
    from specdec.train.errors import TrainConfigError

    train(config("medusa", tiny_base, repetitive_data, tmp_path / "o", max_steps=2, save_steps=2), **QUIET)
    with pytest.raises(TrainConfigError, match="do not match"):
        train(config("medusa", tiny_base, repetitive_data, tmp_path / "o", max_steps=4, medusa_num_heads=3, resume=True), **QUIET)
    # another seed or batch size would draw other batches: not a continuation of this run
    with pytest.raises(TrainConfigError, match="--seed 0 \\(now 7\\)"):
        train(config("medusa", tiny_base, repetitive_data, tmp_path / "o", max_steps=4, seed=7, resume=True), **QUIET)
    # nor other data or sequences (they were accepted, and the card described a run that never happened)
    with pytest.raises(TrainConfigError, match="--training_seq_len .* \\(now 8\\)"):
        train(config("medusa", tiny_base, repetitive_data, tmp_path / "o", max_steps=4, training_seq_len=8, resume=True), **QUIET)
    other = tmp_path / "other.jsonl"
    other.write_text(Path(repetitive_data).read_text())
    with pytest.raises(TrainConfigError, match="--data .*other.jsonl\\)"):
        train(config("medusa", tiny_base, str(other), tmp_path / "o", max_steps=4, resume=True), **QUIET)


def _before_row(out: Path) -> str:
    return next(line for line in (out / "README.md").read_text().splitlines() if line.startswith("| same, before training |"))


def test_a_resumed_run_keeps_the_before_training_row(tmp_path, tiny_base, repetitive_data):
    """The top-1 before training was measured only at step 0 and not saved: a resumed run's card showed '-' there."""
    from specdec.train.errors import TrainConfigError

    straight = train(config("medusa", tiny_base, repetitive_data, tmp_path / "a", max_steps=4, save_steps=2), **QUIET)
    train(config("medusa", tiny_base, repetitive_data, tmp_path / "b", max_steps=2, save_steps=2), **QUIET)  # "interrupted" at 2
    resumed = train(config("medusa", tiny_base, repetitive_data, tmp_path / "b", max_steps=4, save_steps=2, resume=True), **QUIET)
    assert resumed.accuracy_before == straight.accuracy_before and len(straight.accuracy_before) == 2
    assert _before_row(tmp_path / "b") == _before_row(tmp_path / "a") == (
        f"| same, before training | {', '.join(f'{a:.3f}' for a in straight.accuracy_before)} |")
    assert json.loads((tmp_path / "b" / "training_log.json").read_text())["accuracy_before"] == straight.accuracy_before
    # another evaluation set would change the training set too (what is held out is not trained on): refused
    with pytest.raises(TrainConfigError, match="it was trained with --eval_fraction"):
        train(config("medusa", tiny_base, repetitive_data, tmp_path / "b", max_steps=6, save_steps=2, eval_fraction=0.25, resume=True), **QUIET)
    # a checkpoint without the figures (written before they were saved): said, not a number
    state = tmp_path / "a" / "checkpoint-4" / "trainer_state.json"
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if not k.startswith("accuracy_before")}))
    train(config("medusa", tiny_base, repetitive_data, tmp_path / "a", max_steps=6, save_steps=2, resume=True), **QUIET)
    assert _before_row(tmp_path / "a") == "| same, before training | not available: checkpoint-4, which this run resumed from, does not record it |"


def test_overwrite_deletes_only_a_previous_run(tmp_path, tiny_base, repetitive_data, monkeypatch):
    """--overwrite_output_dir deleted whatever it was pointed at: the current directory, the base model, the data's folder."""
    from specdec.train.errors import TrainConfigError

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(TrainConfigError, match="not a specdec-train run's output"):
        train(config("medusa", tiny_base, repetitive_data, mine, max_steps=1, overwrite_output_dir=True), **QUIET)
    with pytest.raises(TrainConfigError, match="is or holds --model"):
        train(config("medusa", tiny_base, repetitive_data, Path(tiny_base), max_steps=1, overwrite_output_dir=True), **QUIET)
    with pytest.raises(TrainConfigError, match="is or holds --data"):
        train(config("medusa", tiny_base, repetitive_data, Path(repetitive_data).parent, max_steps=1, overwrite_output_dir=True), **QUIET)
    monkeypatch.chdir(mine)
    with pytest.raises(TrainConfigError, match="is the current directory or holds it"):
        train(config("medusa", tiny_base, repetitive_data, Path("."), max_steps=1, overwrite_output_dir=True), **QUIET)
    assert (mine / "notes.txt").read_text() == "keep" and any(Path(tiny_base).glob("*.safetensors")) and Path(repetitive_data).is_file()
    run = tmp_path / "run"  # a previous run's output: replaced
    train(config("medusa", tiny_base, repetitive_data, run, max_steps=1), **QUIET)
    assert train(config("medusa", tiny_base, repetitive_data, run, max_steps=2, overwrite_output_dir=True), **QUIET).steps == 2


def test_max_time_stops_and_saves_and_eval_data_is_reported_on(tmp_path, tiny_base, repetitive_data):
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"input_ids": [9, 10, 11, 12, 13, 14, 15, 16, 5, 6], "prompt_len": 0}) + "\n")
    r = train(config("medusa", tiny_base, repetitive_data, tmp_path / "t", max_steps=1000, save_steps=500, max_time=1e-6, eval_data=str(held)),
              **QUIET)
    assert r.steps == 1 and (tmp_path / "t" / "checkpoint-1").is_dir()  # the step that passed the budget was saved
    log = json.loads((tmp_path / "t" / "training_log.json").read_text())
    assert log["held_out"] is True
    # 10 tokens: head 0 is counted at 8 positions, head 1 at 7; the accuracies are fractions of those
    assert [round(a * n) / n for a, n in zip(r.accuracy, (8, 7), strict=True)] == r.accuracy


def test_max_cpu_time_stops_on_this_process_cpu_time(tmp_path, tiny_base, repetitive_data):
    r = train(config("peagle", tiny_base, repetitive_data, tmp_path / "t", max_steps=1000, save_steps=500, max_cpu_time=1e-6), **QUIET)
    assert r.steps == 1 and (tmp_path / "t" / "checkpoint-1").is_dir() and r.cpu_seconds > 0
    log = json.loads((tmp_path / "t" / "training_log.json").read_text())
    assert log["cpu_seconds"] == r.cpu_seconds and "max_cpu_time 1e-06 CPU s" in (tmp_path / "t" / "README.md").read_text()


def test_a_peagle_module_trained_on_the_true_tokens_says_so_and_is_refused_as_a_drafter(tmp_path, tiny_base, repetitive_data):
    """--peagle_truth_tokens (examples/train_heads.py --peagle-truth-tokens) trains a bound whose placeholders read the true
    tokens: its config.json records it, so that the replay reads it so and no build drafts with it."""
    from specdec.formats.errors import CheckpointError

    train(config("peagle", tiny_base, repetitive_data, tmp_path / "bound", max_steps=1, peagle_truth_tokens=True), **QUIET)
    cfg = json.loads((tmp_path / "bound" / "config.json").read_text())
    assert cfg["specdec_train"]["peagle_truth_tokens"] is True
    with pytest.raises(CheckpointError, match="reading the true tokens .* it cannot draft"):
        load_heads(tmp_path / "bound")
    train(config("peagle", tiny_base, repetitive_data, tmp_path / "blind", max_steps=1), **QUIET)
    assert "peagle_truth_tokens" not in json.loads((tmp_path / "blind" / "config.json").read_text())["specdec_train"]
    assert load_heads(tmp_path / "blind").mode == "peagle"


def test_a_peagle_module_trained_to_refine_says_so_and_still_drafts(tmp_path, tiny_base, repetitive_data):
    """--peagle_refine (examples/train_heads.py --peagle-refine): half its blocks read the true tokens; config.json
    records it (the replay's --refine reads it), the builder loads it as any P-EAGLE module (it drafts blind too), and
    it resumes only as such. Asked together with the bound, the run is refused before it trains."""
    from specdec.train.errors import TrainConfigError

    train(config("peagle", tiny_base, repetitive_data, tmp_path / "refine", max_steps=1, peagle_refine=True), **QUIET)
    cfg = json.loads((tmp_path / "refine" / "config.json").read_text())
    assert cfg["specdec_train"]["peagle_refine"] is True
    assert load_heads(tmp_path / "refine").mode == "peagle"
    with pytest.raises(TrainConfigError, match="--peagle_refine .* \\(now False\\)"):
        train(config("peagle", tiny_base, repetitive_data, tmp_path / "refine", max_steps=2, resume=True), **QUIET)
    with pytest.raises(TrainConfigError, match="--peagle_refine trains a drafter .* give one"):
        train(config("peagle", tiny_base, repetitive_data, tmp_path / "both", max_steps=1, peagle_refine=True, peagle_truth_tokens=True), **QUIET)
    assert not (tmp_path / "both").exists()


def test_cosine_decays_over_a_time_budget(tmp_path, tiny_base, repetitive_data, monkeypatch):
    """Under --max_time the step count is unknown: cosine must reach ~0 as the budget runs out, not stay near --lr because the
    epochs' step count is far away (as it did: the schedule read steps only)."""
    from specdec.train import trainer

    lrs = []
    real = trainer._lr_at
    monkeypatch.setattr(trainer, "_lr_at", lambda *a, **kw: lrs.append(real(*a, **kw)) or lrs[-1])
    r = train(config("medusa", tiny_base, repetitive_data, tmp_path / "t", max_steps=None, num_epochs=10_000, max_time=3.0,
                     lr_scheduler="cosine", warmup_steps=2, save_steps=100_000), **QUIET)
    assert r.steps == len(lrs) >= 6
    assert lrs[:2] == pytest.approx([5e-3, 1e-2])  # warmup, then the decay starts from --lr
    assert lrs[2] == pytest.approx(1e-2, rel=0.05)
    # the last step starts past two thirds of the budget on any machine where a step takes under a second (lr 0.25 there)
    assert lrs[-1] < 0.25 * 1e-2
    assert all(b <= a for a, b in zip(lrs[1:], lrs[2:], strict=False))


def test_cosine_follows_whichever_of_steps_and_budget_ends_first():
    from specdec.train.trainer import _budget_done, _lr_at

    cfg = TrainConfig(mode="medusa", model="m", data="d", output_dir="o", lr=1.0, lr_scheduler="cosine", max_time=10.0, max_cpu_time=20.0)
    assert _budget_done(cfg, wall_s=5.0, cpu_s=4.0) == 0.5 and _budget_done(cfg, wall_s=1.0, cpu_s=15.0) == 0.75
    assert _budget_done(TrainConfig(mode="medusa", model="m", data="d", output_dir="o"), 5.0, 5.0) is None
    assert _lr_at(cfg, step=50, total=100, budget_done=0.1) == pytest.approx(0.5)  # the steps are further along
    assert _lr_at(cfg, step=10, total=100, budget_done=0.5) == pytest.approx(0.5)  # the budget is
    assert _lr_at(cfg, step=10, total=100, budget_done=1.3) == pytest.approx(0.0)
    constant = TrainConfig(mode="medusa", model="m", data="d", output_dir="o", lr=1.0, max_time=10.0)
    assert _lr_at(constant, step=99, total=100, budget_done=0.99) == 1.0


def test_an_epoch_visits_every_sequence_once(tmp_path, tiny_base, repetitive_data):
    from specdec.train.data import Sequence
    from specdec.train.trainer import _batch_for_step

    seqs = [Sequence([i, i, i]) for i in range(10)]
    for epoch in range(2):
        seen = [s.ids[0] for k in range(3) for s in _batch_for_step(epoch * 3 + k, seqs, 4, seed=0)]  # batches of 4, 4, 2
        assert sorted(seen) == list(range(10))
    r = train(config("eagle", tiny_base, repetitive_data, tmp_path / "e", max_steps=None, num_epochs=2, batch_size=10), **QUIET)
    assert r.steps == 2 * 3  # 24 sequences in batches of 10, twice


def test_saved_files_are_readable_by_others(trained):
    # heads are shipped and shared: no 0600 files or 0700 folders from mkdtemp/safetensors
    _, result, _ = trained
    for f in [result.output_dir / "model.safetensors", result.output_dir / "checkpoint-40",
              result.output_dir / "checkpoint-40" / "optimizer.safetensors"]:
        assert f.stat().st_mode & 0o044 == 0o044, f


def test_eagle_ttt_is_recorded_and_one_step_is_the_depth_1_training(trained, tiny_base, repetitive_data):
    from specdec.train.base import load_base, run_base
    from specdec.train.data import read_sequences
    from specdec.train.eagle import eagle_inputs, eagle_loss
    from specdec.train.runs import collate
    from specdec.train.trainer import make_run

    mode, result, _ = trained
    if mode != "eagle":
        return
    cfg = json.loads((result.output_dir / "config.json").read_text())
    log = json.loads((result.output_dir / "training_log.json").read_text())
    assert cfg["specdec_train"]["eagle_ttt_steps"] == log["provenance"]["eagle_ttt_steps"] == log["config"]["eagle_ttt_steps"] == 3
    assert "--eagle_ttt_steps 3" in (result.output_dir / "README.md").read_text()
    # N=1: the loss and hits are exactly the depth-1 pass (module.hidden + eagle_loss), as before TTT existed
    seqs = read_sequences(repetitive_data, None, 512, 96)[:4]
    base = load_base(tiny_base)
    run = make_run(config("eagle", tiny_base, repetitive_data, "unused", eagle_ttt_steps=1), base)
    run.heads.load_state_dict(result.heads.state_dict())
    seqs[1].ids[-5:] = []  # a shorter sequence: padding in the batch
    loss, hits = run.forward(seqs)
    ids, attn, loss_mask = collate(seqs)
    out = run_base(base, ids, attn, run.aux_ids)
    aux, nxt = eagle_inputs(ids, out.aux_hidden, base.get_input_embeddings())
    expected, expected_hits = eagle_loss(run.heads, run.heads.hidden(aux, nxt, attn[:, :-1]), out.last_hidden,
                                         base.get_output_embeddings(), loss_mask)
    assert torch.equal(loss, expected) and hits == [expected_hits]
    three_loss, three_hits = make_run(config("eagle", tiny_base, repetitive_data, "unused"), base).forward(seqs)
    assert len(three_hits) == 3 and three_hits[1][1] < three_hits[0][1]  # depth 2 has one row fewer per sequence


def test_the_loop_trains_whatever_mode_the_table_holds(tiny_base, repetitive_data, tmp_path, monkeypatch):
    """trainer.py branches on no mode: a mode is a class in runs.RUNS. A toy one (a linear next-token head on the
    base's last hidden state) is trained, checkpointed, exported and described by the same loop."""
    import torch.nn.functional as F
    from torch import nn

    from specdec.train.base import run_base
    from specdec.train.runs import RUNS, Run, collate

    class NextTokenRun(Run):
        mode = "next_token"

        @staticmethod
        def counts(cfg):
            return {}

        def __init__(self, cfg, base):
            super().__init__(cfg, base)
            self.heads = nn.Linear(base.config.hidden_size, base.config.vocab_size, bias=False)

        def forward(self, seqs):
            ids, attn, loss_mask = collate(seqs)
            hidden = run_base(self.base, ids, attn).last_hidden[:, :-1]  # [batch, seq - 1, hidden]
            scored = loss_mask[:, 1:]
            logits, wanted = self.heads(hidden)[scored], ids[:, 1:][scored]  # [n, vocab], [n]
            return F.cross_entropy(logits, wanted), [(int((logits.argmax(-1) == wanted).sum()), len(wanted))]

        def export_config(self, base_cfg, provenance):
            return {"toy_head": True, "specdec_train": provenance}

        def loss_description(self):
            return "CE of the next token"

        def card(self):
            return "a linear next-token head", "top-1 of the next token", "(no flags)"

    monkeypatch.setitem(RUNS, "next_token", NextTokenRun)
    result = train(config("next_token", tiny_base, repetitive_data, tmp_path / "o", max_steps=6, save_steps=3), **QUIET)
    assert result.steps == 6 and isinstance(result.heads, nn.Linear) and len(result.accuracy) == 1
    saved = json.loads((tmp_path / "o" / "config.json").read_text())
    assert saved["toy_head"] and saved["specdec_train"]["mode"] == "next_token"
    assert (tmp_path / "o" / "checkpoint-6").is_dir() and "a linear next-token head" in (tmp_path / "o" / "README.md").read_text()
