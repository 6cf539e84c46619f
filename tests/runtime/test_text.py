"""Token ids -> streamed text: incremental detokenization and stop strings (runtime/text.py).

specdec-serve ends text before a stop string (keep_stop=False), specdec-run
after it (keep_stop=True); both use this one implementation. A real byte-level
tokenizer (one token per UTF-8 byte, as GPT-2's and Llama 3's fall back to)
makes multi-byte characters span several tokens.
"""

import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.text import IncrementalDetokenizer, TextStream

TEXT = "naïve café — 東京 🙂 done"


def byte_tokenizer_dir(d):
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def byte_tok(tmp_path_factory):
    return Tokenizer(byte_tokenizer_dir(tmp_path_factory.mktemp("bytes")))


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


def counting_decoder(tok: Tokenizer) -> list[int]:
    """Replace ``tok``'s ByteLevel decoder by the same decoding that records how many tokens each decode gets."""
    windows: list[int] = []
    byte_level = decoders.ByteLevel()

    class Counting:
        def decode_chain(self, tokens: list[str]) -> list[str]:
            windows.append(len(tokens))
            return [byte_level.decode(tokens)]

    tok.backend.decoder = decoders.Decoder.custom(Counting())
    return windows


@pytest.mark.parametrize("sizes", [[1], [3], [8]])
def test_each_token_decodes_a_short_window(tmp_path, sizes):
    """Each decode sees the last piece shown plus the new tokens, never the whole output: linear work."""
    tok = Tokenizer(byte_tokenizer_dir(tmp_path))
    windows = counting_decoder(tok)
    ids = tok.encode(TEXT * 20, add_special_tokens=False)
    stream = TextStream(tok, tok.encode("x: ", add_special_tokens=False), stops=("never",), keep_stop=True)
    text = "".join(stream.feed(r)[0] for r in rounds(ids, sizes)) + stream.finish()
    assert text == TEXT * 20 and len(ids) > 600
    assert max(windows) <= 5 + 4 + 1  # the prompt context or the last piece shown, a character's bytes, the new token
    assert sum(windows) <= 10 * len(ids)


def test_a_truncated_character_is_flushed_at_the_end(byte_tok):
    ids = byte_tok.encode("ok 🙂", add_special_tokens=False)[:-1]  # the emoji's last byte never came
    detok = IncrementalDetokenizer(byte_tok, [])
    assert detok.push(ids) == "ok "  # the emoji's bytes are held: it may still complete
    assert detok.flush() == "\ufffd"  # the request ended: what there is


def feed_until_stopped(stream: TextStream, ids: list[int], sizes: list[int]) -> tuple[list[str], bool]:
    """Feed ``ids`` in rounds of ``sizes`` until a stop string ends the stream: (the deltas sent, whether it stopped)."""
    sent, stopped = [], False
    for r in rounds(ids, sizes):
        delta, stopped = stream.feed(r)
        sent.append(delta)
        if stopped:
            break
    return sent, stopped


@pytest.mark.parametrize("sizes", [[1], [4], [2, 7]])
def test_stop_string_cuts_the_output_and_is_never_sent(byte_tok, sizes):
    ids = byte_tok.encode("alpha beta STOP gamma STOP", add_special_tokens=False)
    stream = TextStream(byte_tok, [], stops=("STOP", "never"))
    sent, stopped = feed_until_stopped(stream, ids, sizes)
    assert stopped and "".join(sent) + stream.finish() == "alpha beta "
    assert all("S" not in d for d in sent)  # not even the stop string's first letter went out
    assert stream.num_tokens == len(byte_tok.encode("alpha beta STOP", add_special_tokens=False))  # usage stops at the token that completed it


@pytest.mark.parametrize("sizes", [[1], [4], [2, 7], [100]])
@pytest.mark.parametrize("keep", [False, True])
def test_no_stop_string_ends_the_text_in_its_first_min_tokens(byte_tok, sizes, keep):
    """vLLM's min_tokens: a stop string completed by one of the first min_tokens tokens does not count, even when one
    round brings those tokens and later ones together; one completed after them does."""
    ids = byte_tok.encode("a STOP b STOP c", add_special_tokens=False)
    stream = TextStream(byte_tok, [], stops=("STOP",), keep_stop=keep, min_tokens=len("a STOP"))
    sent, stopped = feed_until_stopped(stream, ids, sizes)
    assert stopped and "".join(sent) + stream.finish() == ("a STOP b STOP" if keep else "a STOP b ")
    assert stream.num_tokens == len("a STOP b STOP")
    late = TextStream(byte_tok, [], stops=("STOP",), min_tokens=len("a STO"))  # its last letter is past the first min_tokens: counts
    assert late.feed(ids) == ("a ", True)


def test_a_prompt_that_ends_inside_a_character_is_not_output_text(byte_tok):
    """Token-id prompts can end inside a multi-byte character: that part is not context, and never the output's text."""
    whole = byte_tok.encode("café wise", add_special_tokens=False)
    prompt, rest = whole[:4], whole[4:]  # "caf" and the first byte of "é"; the second byte, then " wise"
    for sizes in ([1], [3], [len(rest)]):
        stream = TextStream(byte_tok, prompt)
        text = "".join(stream.feed(ids)[0] for ids in rounds(rest, sizes)) + stream.finish()
        assert text == "é wise"  # the output completed the character: it is the output's, whole, as vLLM shows it
    for tail in (" wise", ""):  # not completed: the prompt's unfinished bytes are no part of the output's text
        stream = TextStream(byte_tok, prompt)
        assert stream.feed(byte_tok.encode(tail, add_special_tokens=False))[0] + stream.finish() == tail


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


@pytest.mark.parametrize("sizes", [[1], [4], [2, 7]])
def test_keep_stop_ends_after_the_stop_string(byte_tok, sizes):
    """specdec-run's mode (TensorRT-LLM's run.py keeps stop words): nothing is held back, the text ends after the stop."""
    ids = byte_tok.encode("alpha 東京 beta gamma 東京", add_special_tokens=False)
    stream = TextStream(byte_tok, [], stops=("京 b", "never"), keep_stop=True)
    sent, stopped = feed_until_stopped(stream, ids, sizes)
    assert stopped and "".join(sent) + stream.finish() == "alpha 東京 b" == stream.text
    assert stream.num_tokens == len(byte_tok.encode("alpha 東京 b", add_special_tokens=False))


def test_keep_stop_picks_the_stop_that_ends_first(byte_tok):
    stream = TextStream(byte_tok, [], stops=("abc", "b"), keep_stop=True)
    assert stream.feed(byte_tok.encode("xabc", add_special_tokens=False)) == ("xab", True)


def test_a_decoder_that_rewrites_shown_text_does_not_end_the_stream(tmp_path):
    """tokenizers' DecodeStream raises when a decoder changes text it already gave out; the stream goes on."""
    hf = HFTokenizer(models.WordLevel(vocab={"[UNK]": 0, "a": 1, "b": 2, "c": 3}, unk_token="[UNK]"))

    class Rewrite:  # "ab" reads as "X": the "a" shown first is not a prefix of the text once "b" comes
        def decode_chain(self, tokens: list[str]) -> list[str]:
            return ["".join(tokens).replace("ab", "X")]

    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path)
    tok.backend.decoder = decoders.Decoder.custom(Rewrite())
    detok = IncrementalDetokenizer(tok, [])
    text = detok.push([1]) + detok.push([2]) + detok.push([3, 3]) + detok.flush()
    assert text.startswith("a") and text.endswith("cc")  # what was shown stays; what follows keeps coming
