"""The engine's tokenizer, from the tokenizer.json copied into the engine dir (no transformers)."""

from __future__ import annotations

import json
from pathlib import Path

from .config_strings import shown
from .errors import RequestError

LONG_TEXT = 1 << 16  # characters past which encoding runs without the GIL (encode_batch costs a thread hand-off)


class Tokenizer:
    def __init__(self, directory: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        d = Path(directory)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise RequestError(f"{d} has no tokenizer.json; pass --tokenizer_dir, or give token ids (--input_file .csv/.npy).")
        self._tok = HFTokenizer.from_file(str(path))
        self.directory = d
        cfg_file = d / "tokenizer_config.json"
        self.config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}

    @property
    def backend(self):
        """The ``tokenizers.Tokenizer`` itself (for ``tokenizers.decoders.DecodeStream``, runtime/text.py)."""
        return self._tok

    def _special_id(self, key: str) -> int | None:
        value = self.config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return self._tok.token_to_id(value) if isinstance(value, str) else None

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        check_unicode(text)
        if len(text) > LONG_TEXT:  # encode_batch lets go of the GIL: a prompt of megabytes (seconds) holds up no other thread
            ids = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        else:
            ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self._special_id("bos_token")
        # tokenizer_config.json's add_bos_token is how many HF tokenizers add BOS
        if add_special_tokens and self.config.get("add_bos_token") and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's own string for a token (byte-level pieces as stored), as vLLM's /tokenize shows it."""
        return self._tok.id_to_token(int(token_id))

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (what llguidance reads)."""
        return self._tok.to_str()

    def decode_token(self, token_id: int) -> str:
        """One token's text as logprobs show it (special tokens included)."""
        return self._tok.decode([int(token_id)], skip_special_tokens=False)

    def special_token_id(self, text: str) -> int | None:
        """The id of ``text`` if the tokenizer has it as one special (added) token, else None."""
        for token_id, added in self._tok.get_added_tokens_decoder().items():
            if added.content == text and added.special:
                return int(token_id)
        return None


def check_unicode(text: str, what: str = "text") -> None:
    """Refuse a string that is not a sequence of Unicode scalars: a lone surrogate, which is what undecodable
    bytes on a command line or a "\\ud800" escape in JSON become. The tokenizers library cannot take one
    (it raised TypeError), and no tokenizer could say what it means."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(f"{what} {shown(text, 40)} is not valid Unicode: a lone surrogate {text[err.start]!r} at character {err.start} "
                           "(bytes that are not UTF-8, or a \\ud800-style escape in JSON); give UTF-8 text.") from None
