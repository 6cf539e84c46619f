"""Token ids -> streamed text: incremental detokenization and stop strings (serve/text.py).

A real byte-level tokenizer (one token per UTF-8 byte, as GPT-2's and Llama 3's
fall back to) makes multi-byte characters span several tokens.
"""

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from specdec.runtime.tokenizer import Tokenizer
from specdec.serve.text import IncrementalDetokenizer, TextStream

TEXT = "naïve café — 東京 🙂 done"


@pytest.fixture(scope="module")
def byte_tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("bytes")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))
    return Tokenizer(d)


def rounds(ids, sizes):
    """Split ids into rounds of the given sizes (cycled): ragged acceptance."""
    out, i, j = [], 0, 0
    while i < len(ids):
        n = sizes[j % len(sizes)]
        out.append(ids[i : i + n])
        i, j = i + n, j + 1
    return out


@pytest.mark.parametrize("sizes", [[1], [2], [3, 1, 4], [5]])
def test_multibyte_characters_are_never_split(byte_tok, sizes):
    ids = byte_tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) == len(TEXT.encode())  # one token per byte: é, —, 東, 🙂 span 2-4 tokens
    detok = IncrementalDetokenizer(byte_tok, byte_tok.encode("x: ", add_special_tokens=False))
    deltas = [detok.push(r) for r in rounds(ids, sizes)]
    assert all("\ufffd" not in d for d in deltas)  # no half character is ever sent
    assert "".join(deltas) + detok.flush() == TEXT


def test_the_window_stays_short(byte_tok):
    """Each round decodes the last piece shown plus the new tokens, never the whole output."""
    ids = byte_tok.encode(TEXT * 20, add_special_tokens=False)
    detok = IncrementalDetokenizer(byte_tok, [])
    longest = 0
    for r in rounds(ids, [3]):
        detok.push(r)
        longest = max(longest, len(detok.ids))
    assert len(ids) > 600 and longest <= 16  # a few characters' bytes, whatever the output's length


def test_a_truncated_character_is_flushed_at_the_end(byte_tok):
    ids = byte_tok.encode("ok 🙂", add_special_tokens=False)[:-1]  # the emoji's last byte never came
    detok = IncrementalDetokenizer(byte_tok, [])
    assert detok.push(ids) == ""  # held: it may still complete
    assert detok.flush() == "ok \ufffd"  # the request ended: what there is


@pytest.mark.parametrize("sizes", [[1], [4], [2, 7]])
def test_stop_string_cuts_the_output_and_is_never_sent(byte_tok, sizes):
    ids = byte_tok.encode("alpha beta STOP gamma STOP", add_special_tokens=False)
    stream = TextStream(byte_tok, [], stops=("STOP", "never"))
    sent, stopped = [], False
    for r in rounds(ids, sizes):
        delta, stopped = stream.feed(r)
        sent.append(delta)
        if stopped:
            break
    assert stopped and "".join(sent) + stream.finish() == "alpha beta "
    assert all("S" not in d for d in sent)  # not even the stop string's first letter went out
    assert stream.num_tokens == len(byte_tok.encode("alpha beta STOP", add_special_tokens=False))  # usage stops at the token that completed it


def test_earliest_stop_wins_and_held_prefix_is_released(byte_tok):
    stream = TextStream(byte_tok, [], stops=("xyz", "cd"))
    ids = byte_tok.encode("abxy", add_special_tokens=False)
    delta, stopped = stream.feed(ids)
    assert (delta, stopped) == ("ab", False)  # "xy" may grow into "xyz": held
    assert stream.finish() == "xy"  # it did not: released at the end
    s2 = TextStream(byte_tok, [], stops=("xyz", "bc"))
    assert s2.feed(byte_tok.encode("abcxyz", add_special_tokens=False)) == ("a", True)


def test_no_stops_streams_everything(byte_tok):
    stream = TextStream(byte_tok, [])
    out = [stream.feed([t])[0] for t in byte_tok.encode("plain text", add_special_tokens=False)]
    assert "".join(out) + stream.finish() == "plain text"
