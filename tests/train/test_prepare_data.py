"""prepare-data: the base model's own greedy answers, with transformers and with a specdec engine (the same tokens)."""

import json
from pathlib import Path

import pytest
import torch
from checkpoints import add_word_tokenizer, load_hf, make_checkpoint
from click.testing import CliRunner
from conftest import spec_build
from train_fixtures import tiny_base  # noqa: F401 (fixture)

from specdec.builder.build import build_engine
from specdec.cli.train import EngineGenerator, main
from specdec.formats.tokenizer import Tokenizer
from specdec.train.errors import TrainConfigError
from specdec.train.prepare import PrepareConfig, prepare_data

PROMPTS = ["w5 w6 w7", "w20 w21 w22 w23", "w40"]
QUIET = dict(say=lambda _: None, progress_bar=False)


def hf_greedy(model, ids: list[int], n: int, eos: int = 2) -> list[int]:
    """The reference: argmax of a plain transformers forward pass, one token at a time, stopping after EOS."""
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
    return out


@pytest.fixture(scope="module")
def prompts_txt(tmp_path_factory):
    p = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    p.write_text("\n".join(PROMPTS[:2]) + "\n\n" + PROMPTS[2] + "\n")  # blank lines are skipped
    return p


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_transformers_path_writes_the_bases_greedy_answers(tmp_path, tiny_base, prompts_txt):
    out = tmp_path / "data" / "data.jsonl"
    assert prepare_data(PrepareConfig(str(prompts_txt), str(out), model_dir=str(tiny_base), max_token=6), **QUIET) == 3
    records = read_jsonl(out)
    tok, model = Tokenizer(tiny_base), load_hf(tiny_base)
    for i, (rec, prompt) in enumerate(zip(records, PROMPTS, strict=True)):
        prompt_ids = tok.encode(prompt)
        answer = hf_greedy(model, prompt_ids, 6)
        assert rec["conversation_id"] == i and rec["prompt_len"] == len(prompt_ids)
        assert rec["input_ids"] == prompt_ids + answer
        assert rec["conversations"] == [{"role": "user", "content": prompt}, {"role": "assistant", "content": tok.decode(answer)}]
    assert [p.name for p in out.parent.iterdir()] == ["data.jsonl"]  # no temporary file left


def test_engine_path_gives_the_same_tokens(tmp_path, tiny_base, prompts_txt):
    engine = tmp_path / "engine"
    build_engine(tiny_base, engine, spec_build(0, max_batch_size=2, max_input_len=16, max_seq_len=32), say=lambda _: None)
    via_hf, via_engine = tmp_path / "hf.jsonl", tmp_path / "engine.jsonl"
    prepare_data(PrepareConfig(str(prompts_txt), str(via_hf), model_dir=str(tiny_base), max_token=6), **QUIET)
    prepare_data(PrepareConfig(str(prompts_txt), str(via_engine), engine_dir=str(engine), max_token=6, num_threads=1, batch=2), **QUIET,
                 generator=EngineGenerator)
    assert read_jsonl(via_engine) == read_jsonl(via_hf)


def test_engine_dir_and_model_dir_must_be_the_same_model(tmp_path, tiny_base, prompts_txt):
    """With both, the engine generated and --model_dir's tokenizer encoded the prompts, whatever model it was: now refused."""
    engine = tmp_path / "engine"
    build_engine(tiny_base, engine, spec_build(0, max_batch_size=2, max_input_len=16, max_seq_len=32), say=lambda _: None)
    other = add_word_tokenizer(make_checkpoint(tmp_path / "other", "LlamaForCausalLM", num_hidden_layers=2, tie_word_embeddings=True))
    out = tmp_path / "o.jsonl"
    args = ["prepare-data", "--engine_dir", engine, "--data_path", prompts_txt, "--output_path", out, "--max_token", 2, "-q", "--num_threads", 1]
    r = CliRunner().invoke(main, [str(a) for a in [*args, "--model_dir", other]])
    assert r.exit_code == 1, r.output
    assert r.output.strip() == (f"error: --model_dir {other} is not the model of --engine_dir {engine} (num_hidden_layers 2 vs 4; the engine "
                                f"was built from {Path(tiny_base).resolve()}): leave out --model_dir (the engine generates and has its own "
                                "tokenizer), or pass the checkpoint the engine was built from."), r.output
    assert not out.exists()
    r = CliRunner().invoke(main, [str(a) for a in [*args, "--model_dir", tiny_base]])  # the engine's own model: as before
    assert r.exit_code == 0 and len(read_jsonl(out)) == 3, r.output


def test_jsonl_prompts_in_modelopt_conversation_format(tmp_path, tiny_base):
    src = tmp_path / "in.jsonl"
    rows = [{"conversations": [{"from": "human", "value": "w9 w8"}, {"from": "gpt", "value": "ignored"}]},
            {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "w30 w31"}]},
            {"prompt": "w50"}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out.jsonl"
    prepare_data(PrepareConfig(str(src), str(out), model_dir=str(tiny_base), max_token=2, limit=2), **QUIET)
    assert [r["conversations"][0]["content"] for r in read_jsonl(out)] == ["w9 w8", "w30 w31"]  # --limit 2


def test_bad_prompt_files(tmp_path, tiny_base):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(TrainConfigError, match="holds no prompts"):
        prepare_data(PrepareConfig(str(empty), str(tmp_path / "o.jsonl"), model_dir=str(tiny_base)), **QUIET)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "w5"}\n{"prompt": \n')
    with pytest.raises(TrainConfigError, match="line 2 is not JSON"):
        prepare_data(PrepareConfig(str(broken), str(tmp_path / "o.jsonl"), model_dir=str(tiny_base)), **QUIET)
    assert not (tmp_path / "o.jsonl").exists()
    with pytest.raises(TrainConfigError, match="the answers are JSON lines, which `run` reads from a .jsonl"):  # run refused the .txt after
        prepare_data(PrepareConfig(str(broken), str(tmp_path / "answers.txt"), model_dir=str(tiny_base)), **QUIET)
    assert not (tmp_path / "answers.txt").exists()
    # answers as long as the model's positions: prompts were cut to one token and the answer ran past the positions
    positions = json.loads((tiny_base / "config.json").read_text())["max_position_embeddings"]
    good = tmp_path / "good.txt"
    good.write_text("w5 w6\n")
    with pytest.raises(TrainConfigError, match=f"--max_token {positions} leaves no room in the model's {positions} positions"):
        prepare_data(PrepareConfig(str(good), str(tmp_path / "o.jsonl"), model_dir=str(tiny_base), max_token=positions), **QUIET)
    assert not (tmp_path / "o.jsonl").exists()


def test_long_prompts_are_cut_and_the_record_says_so(tmp_path, tiny_base, prompts_txt):
    out = tmp_path / "cut.jsonl"
    said = []
    prepare_data(PrepareConfig(str(prompts_txt), str(out), model_dir=str(tiny_base), max_token=2, max_prompt_tokens=3), say=said.append,
                 progress_bar=False)
    records = read_jsonl(out)
    assert [r["prompt_len"] for r in records] == [3, 3, 2]  # <s> w5 w6 | <s> w20 w21 | <s> w40
    assert records[1]["conversations"][0]["content"] == "w20 w21" and records[2]["conversations"][0]["content"] == "w40"
    assert said[0] == "2 of 3 prompts cut to 3 tokens"


def test_a_multi_turn_conversation_trains_each_answer_on_the_turns_before_it(tmp_path, tiny_base):
    """Turn order is kept (the user turns were joined first, the rest after, and a system prompt trained on as answer text):
    one sequence per assistant turn, its prompt every turn before it, never a user's or system's text trained on."""
    from specdec.train.data import read_sequences

    tok = Tokenizer(tiny_base)
    turns = [("system", "w1 "), ("user", "w2 w3 "), ("assistant", "w4 w5 "), ("user", "w6 "), ("assistant", "w7 w8 w9")]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]}) + "\n")
    first, second = read_sequences(path, tok, vocab_size=96)
    for seq, prompt, answer in ((first, "w1 w2 w3 ", "w4 w5 "), (second, "w1 w2 w3 w4 w5 w6 ", "w7 w8 w9")):
        assert seq.ids[: seq.prompt_len] == tok.encode(prompt)
        assert tok.decode(seq.ids[seq.prompt_len :]).split() == answer.split()
