"""specdec-run's streaming and stop strings (cli/stops.py over runtime/text.py), on a model whose output is known.

The checkpoint is a real Llama whose attention and MLP write nothing, so the
residual stream is the current token's embedding, and whose LM head scores
each token by the embedding of its predecessor in a cycle: greedy decoding
walks the cycle. Its tokenizer gives one token per UTF-8 byte, and the cycle
spells "é東🙂 a", so every round of one token ends inside a multi-byte
character but the last.
"""

import json

import pytest
import torch
from checkpoints import make_checkpoint
from click.testing import CliRunner
from conftest import spec_build
from safetensors.torch import load_file, save_file

from specdec.builder.build import build_engine
from specdec.cli.run import main as run_main
from specdec.cli.stops import generate_with_stops
from specdec.formats.tokenizer import Tokenizer
from specdec.runtime import GenerationConfig, load_orchestrator

CYCLE = "é東🙂 a"  # 2 + 3 + 4 + 1 + 1 bytes, each one token
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]


def byte_chars(text: str) -> list[str]:
    """The ByteLevel alphabet's character for each UTF-8 byte of ``text`` (GPT-2's byte-to-unicode table)."""
    from tokenizers import pre_tokenizers

    return list(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)[0][0])


def write_byte_tokenizer(ckpt, chars: list[str]) -> dict[str, int]:
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(SPECIAL + chars)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))
    return vocab


@pytest.fixture(scope="module")
def cycle_engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("stops")
    ckpt = make_checkpoint(d / "ckpt", vocab_size=96)
    cycle = byte_chars(CYCLE)
    ascii_chars = [c for c in byte_chars("".join(chr(c) for c in range(33, 127))) if c not in cycle]
    vocab = write_byte_tokenizer(ckpt, cycle + ascii_chars[: 96 - len(SPECIAL) - len(cycle)])
    ids = [vocab[c] for c in cycle]
    successor = {a: b for a, b in zip(ids, ids[1:] + ids[:1], strict=True)}
    weights = load_file(ckpt / "model.safetensors")
    torch.manual_seed(1)
    embed = torch.randn(96, 64)
    weights["model.embed_tokens.weight"] = embed
    head = embed.clone()  # token j's score: the embedding of the token it follows (a cycle id), else its own
    for a, b in successor.items():
        head[b] = embed[a]
    for c in range(96):
        if c not in successor.values():
            head[c] = -embed[c]  # never chosen after a cycle token
    weights["lm_head.weight"] = head * 4.0
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = torch.zeros_like(weights[name])  # the layers add nothing to the residual stream
    save_file(weights, ckpt / "model.safetensors")
    build_engine(ckpt, d / "engine", spec_build(4, max_seq_len=160, max_input_len=16), say=lambda _: None)
    return d / "engine"


def test_streamed_text_never_splits_a_character(cycle_engine):
    tokens = 5 * len(CYCLE.encode())  # whole cycles: the output ends on a complete character
    r = CliRunner().invoke(run_main, ["--engine_dir", str(cycle_engine), "--input_text", "a", "--max_output_len", str(tokens), "--streaming"])
    assert r.exit_code == 0, r.output
    # one token per round: the old re-decode printed U+FFFD for each unfinished character, then skipped the character
    assert r.output.splitlines()[0] == CYCLE * 5


def test_stop_string_inside_a_character_run(cycle_engine, tmp_path):
    out = tmp_path / "o.json"
    r = CliRunner().invoke(run_main, ["--engine_dir", str(cycle_engine), "--input_text", "a", "--max_output_len", "40",
                                      "--stop_words", "🙂", "--output_json", str(out)])
    assert r.exit_code == 0, r.output
    req = json.loads(out.read_text())["requests"][0]
    assert req["text"] == "é東🙂" and req["finish_reason"] == "stop_words"
    assert len(req["output_ids"]) == len("é東🙂".encode())  # cut after the token that completed the stop string


def test_streaming_decodes_a_short_window_per_token(cycle_engine):
    """Each decode sees a few tokens, however long the output: linear work, not a re-decode of everything."""
    from tokenizers import decoders

    tok = Tokenizer(cycle_engine)
    windows: list[int] = []
    byte_level = decoders.ByteLevel()

    class Counting:  # the same ByteLevel decoding, recording how many tokens each decode is given
        def decode_chain(self, tokens: list[str]) -> list[str]:
            windows.append(len(tokens))
            return [byte_level.decode(tokens)]

    tok.backend.decoder = decoders.Decoder.custom(Counting())
    orch = load_orchestrator(cycle_engine, num_threads=1)
    shown: list[str] = []
    outputs, _ = generate_with_stops(orch, [tok.encode("a")], GenerationConfig(max_output_len=132), tok, stops=("never",),
                                     on_text=lambda _i, text: shown.append(text))
    assert len(outputs[0].output_ids) == 132
    assert max(windows) <= 8  # the old code decoded the whole output every round: 132 tokens at the end
    assert sum(windows) <= 8 * 132
    assert "".join(shown) == CYCLE * 12


def run_json(cycle_engine, tmp_path, *flags):
    out = tmp_path / "o.json"
    r = CliRunner().invoke(run_main, ["--engine_dir", str(cycle_engine), "--input_text", "a", "--output_json", str(out), *flags])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text()), r.output


def test_min_output_len_holds_back_stop_words_and_bans_apply_under_speculation(cycle_engine, tmp_path):
    """The first "🙂" completes at the 9th token: with --min_output_len 10 it does not count, the second one does. Bad
    words and no repeated n-grams change the walk, and n-gram speculation (--baseline) gives target-only's tokens."""
    got, _ = run_json(cycle_engine, tmp_path, "--max_output_len", "40", "--stop_words", "🙂", "--min_output_len", "10")
    req = got["requests"][0]
    assert req["text"] == "é東🙂 aé東🙂" and req["finish_reason"] == "stop_words"
    plain, _ = run_json(cycle_engine, tmp_path, "--max_output_len", "30")
    assert plain["requests"][0]["text"].startswith(CYCLE * 2)
    for flags, absent in ((["--bad_words", "🙂"], "🙂"), (["--bad_words", " a"], " a"), (["--no_repeat_ngram_size", "4"], None),
                          (["--frequency_penalty", "1000"], None)):  # this model's walk outscores its other tokens by hundreds
        spec, printed = run_json(cycle_engine, tmp_path, "--max_output_len", "30", "--ngram_config", "[4,2,[0]]", "--baseline", *flags)
        out = spec["requests"][0]
        assert out["output_ids"] != plain["requests"][0]["output_ids"], flags
        assert spec["baseline"]["identical_outputs"] and "outputs identical to target-only: yes" in printed
        if absent is not None:
            assert absent not in out["text"], (flags, out["text"])
        elif flags[0] == "--no_repeat_ngram_size":
            ids = out["input_ids"] + out["output_ids"]
            grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
            assert len(grams) == len(set(grams))


def test_bad_words_and_min_output_len_errors_are_one_line(cycle_engine, tmp_path):
    for flags, says in ((["--bad_words", ""], "--bad_words '' is no token at all"), (["--stop_words", ""], "--stop_words '' is empty"),
                        (["--min_output_len", "9", "--max_output_len", "8"], "min_output_len=9 is larger than max_output_len=8"),
                        (["--no_repeat_ngram_size", "-1"], "no_repeat_ngram_size=-1 must be an integer >= 0")):
        r = CliRunner().invoke(run_main, ["--engine_dir", str(cycle_engine), "--input_text", "a", *flags])
        assert r.exit_code != 0 and says in r.output and "Traceback" not in r.output, r.output
