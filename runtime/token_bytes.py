"""Token ids <-> the exact bytes of text they stand for, for moving drafts between two tokenizers.

Decoding to ``str`` loses information at token boundaries: a token that ends
inside a multi-byte UTF-8 character decodes to U+FFFD. Cross-tokenizer
drafting works on bytes instead:

* ``bytes_of(ids)``: a token's bytes from its vocabulary string. Byte-level
  BPE (GPT-2, Llama 3, Qwen, the demo pair: a ``ByteLevel`` decoder) spells
  each byte as one printable character; SentencePiece-style vocabularies
  spell a space as U+2581 and a raw byte as ``<0xNN>`` (``ByteFallback``).
  Special tokens (BOS, EOS, pad) stand for no text: b"".
* ``encode_bytes(data)``: ids whose bytes are exactly ``data``'s longest
  encodable prefix: whole characters are encoded normally; bytes that are no
  character (the rest of a character the other side's tokens split, at the
  start) are spelled byte by byte with the tokenizer's single-byte tokens; a
  partial character at the end is left out (it is completed next round).
  Tokens whose bytes stop matching ``data`` (a tokenizer that adds a space in
  front of a fragment) end the result: a draft must be the text's exact
  continuation to be worth verifying.
"""

from __future__ import annotations

import json
from functools import lru_cache

from ..formats.tokenizer import Tokenizer


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable spelling of each byte (the ByteLevel pre-tokenizer's), inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte < 0xC0


def complete_prefix(data: bytes) -> int:
    """Length of ``data``'s longest prefix that ends on a character boundary (a trailing partial character cut)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        lead = data[n - back]
        if _is_continuation(lead):
            continue
        need = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
        return n if back >= need else n - back
    return n


class TokenBytes:
    """One tokenizer's token -> bytes table and byte-exact encoder."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        spec = json.loads(tokenizer.to_json())
        decoder = json.dumps(spec.get("decoder") or {})
        special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
        vocab = tokenizer.vocab()
        size = max(vocab.values(), default=-1) + 1
        self.table: list[bytes] = [b""] * size
        if '"ByteLevel"' in decoder:
            alphabet = _byte_level_alphabet()
            for piece, i in vocab.items():
                if i not in special:
                    self.table[i] = bytes(alphabet[c] for c in piece) if all(c in alphabet for c in piece) else piece.encode()
        else:  # SentencePiece-style (U+2581 for a space, <0xNN> bytes) or a plain vocabulary
            for piece, i in vocab.items():
                if i in special:
                    continue
                if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                    self.table[i] = bytes([int(piece[3:5], 16)])
                else:
                    self.table[i] = piece.replace("\u2581", " ").encode()
        self.byte_token: dict[int, int] = {}  # byte -> a token spelling exactly that byte
        for i, b in enumerate(self.table):
            if len(b) == 1 and b[0] not in self.byte_token:
                self.byte_token[b[0]] = i

    def bytes_of(self, ids) -> bytes:
        table = self.table
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in ids)

    def encode_bytes(self, data: bytes) -> list[int]:
        """Ids spelling ``data``'s longest encodable prefix exactly (see the module's docstring)."""
        ids: list[int] = []
        at, end = 0, complete_prefix(data)  # a partial character at the end waits for the next round
        while at < end:
            try:
                text, stop, bad = data[at:end].decode("utf-8"), end, end
            except UnicodeDecodeError as err:  # bytes that are no character here: a split character's rest, or junk
                text, stop, bad = data[at : at + err.start].decode("utf-8"), at + err.start, at + err.end
            if text:
                for i in self.tokenizer.encode(text, add_special_tokens=False):  # kept while they spell data exactly
                    piece = self.table[i] if i < len(self.table) else b""
                    if not piece or data[at : at + len(piece)] != piece:
                        return ids
                    ids.append(i)
                    at += len(piece)
                if at != stop:
                    return ids
            for b in data[stop:bad]:  # spelled byte by byte
                if b not in self.byte_token:
                    return ids
                ids.append(self.byte_token[b])
            at = bad
        return ids
