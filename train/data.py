"""Prompts in, training sequences out: the files prepare-data reads and writes, and what `run` trains on.

prepare-data reads prompts from
  * .txt: one prompt per non-empty line;
  * .jsonl: one object per line, the prompt from "prompt", "text" or "input", or the
    first user turn of "conversations" / "messages" (ShareGPT's {"from", "value"} or
    {"role", "content"}, as in ModelOpt's data).
and writes one object per prompt (ModelOpt's conversation format plus the token ids):
  {"conversation_id": i, "conversations": [{"role": "user", "content": prompt},
   {"role": "assistant", "content": answer}], "input_ids": prompt + answer ids, "prompt_len": n}
`run` trains on "input_ids" when present, else tokenizes the conversation text: one sequence per assistant turn, the turns
before it (in their order) its prompt.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..formats.jsonl import json_lines
from .errors import TrainConfigError

PROMPT_FIELDS = ("prompt", "text", "input")
USER_ROLES = ("user", "human")
PROMPT_ROLES = (*USER_ROLES, "system", "developer", "tool")  # the turns a run never trains on: every other turn answers


@dataclass
class Sequence:
    """One training sequence: token ids, of which the first ``prompt_len`` are the prompt (not trained on)."""

    ids: list[int]
    prompt_len: int = 0


def check_data_file(path: str | Path, flag: str = "--data_path") -> Path:
    p = Path(path)
    if not p.is_file():
        raise TrainConfigError(f"{flag} {p} does not exist or is not a file.")
    if p.suffix not in (".txt", ".jsonl", ".json"):
        raise TrainConfigError(f"{flag} {p}: expected a .txt (one prompt per line) or .jsonl file.")
    return p


def _lines(path: Path) -> list[str]:
    """The file's lines; a file that is not UTF-8 is one clean error naming the line, not a UnicodeDecodeError."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise TrainConfigError(f"{path} line {line} is not UTF-8 text (byte {data[err.start]:#04x}); save the file as UTF-8.") from None


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    for where, obj in json_lines(path, TrainConfigError, line=" line "):
        n = int(where.rsplit(" ", 1)[1])
        if not isinstance(obj, dict):
            raise TrainConfigError(f"{path} line {n} holds {type(obj).__name__}; expected a JSON object per line.")
        yield n, obj


def _turns(obj: dict) -> list[tuple[str, str]]:
    """(role, text) of a ShareGPT/ModelOpt/OpenAI-style conversation."""
    turns = obj.get("conversations") or obj.get("messages") or []
    out = []
    for t in turns if isinstance(turns, list) else []:
        if isinstance(t, dict):
            role = str(t.get("role", t.get("from", ""))).lower()
            text = t.get("content", t.get("value"))
            if isinstance(text, str):
                out.append((role, text))
    return out


def _prompt_of(obj: dict) -> str | None:
    for key in PROMPT_FIELDS:
        if isinstance(obj.get(key), str):
            return obj[key]
    users = [text for role, text in _turns(obj) if role in USER_ROLES]
    return users[0] if users else None


def read_prompts(path: str | Path, flag: str = "--data_path") -> list[str]:
    """Every prompt in a .txt or .jsonl file; a file without any is an error."""
    p = check_data_file(path, flag)
    if p.suffix == ".txt":
        prompts = [line for line in _lines(p) if line.strip()]
    else:
        prompts = []
        for n, obj in _jsonl(p):
            prompt = _prompt_of(obj)
            if prompt is None:
                raise TrainConfigError(f"{p} line {n} has no prompt: expected a \"prompt\"/\"text\"/\"input\" string or a user turn in "
                                       "\"conversations\".")
            if prompt.strip():
                prompts.append(prompt)
    if not prompts:
        raise TrainConfigError(f"{flag} {p} holds no prompts.")
    return prompts


def record(index: int, prompt: str, answer: str, prompt_ids: list[int], answer_ids: list[int]) -> dict:
    return {
        "conversation_id": index,
        "conversations": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
        "input_ids": list(prompt_ids) + list(answer_ids),
        "prompt_len": len(prompt_ids),
    }


def _check_vocab(p: Path, n: int, ids: list[int], vocab_size: int | None) -> None:
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise TrainConfigError(f"{p} line {n}: token id {max(ids)} is outside the model's vocabulary ({vocab_size}); was this data made for "
                               "another model?")


def _turn_sequences(turns: list[tuple[str, str]], tokenizer) -> Iterator[tuple[list[int], int]]:
    """One (ids, prompt_len) per answering turn of a conversation, in its order: the turns before it are its prompt (not trained
    on), it is the answer. A multi-turn conversation trains on each assistant turn once, never on a user's, system's or tool's
    text; one without an answering turn is all prompt (nothing to learn)."""
    answers = [i for i, (role, _) in enumerate(turns) if role not in PROMPT_ROLES]
    for i in answers or [len(turns)]:
        prompt = "".join(text for _, text in turns[:i])
        prompt_ids = tokenizer.encode(prompt) if prompt else []
        answer_ids = tokenizer.encode(turns[i][1], add_special_tokens=not prompt_ids) if i < len(turns) else []
        yield prompt_ids + answer_ids, len(prompt_ids)


def read_sequences(path: str | Path, tokenizer=None, max_len: int = 512, vocab_size: int | None = None, flag: str = "--data") -> list[Sequence]:
    """Training sequences from a prepare-data .jsonl (or any conversation .jsonl, tokenized with ``tokenizer``).

    Sequences are cut to ``max_len`` tokens. One teaches only if it has a token to score at position >= 2 after its
    prompt (a head at t predicts t+2 at the nearest); the others are dropped.
    """
    p = check_data_file(path, flag)
    if p.suffix == ".txt":
        raise TrainConfigError(f"{flag} {p} is a .txt of prompts: run `specdec-train prepare-data` on it first, and train on the .jsonl it writes.")
    out, lines = [], 0
    for n, obj in _jsonl(p):
        lines += 1
        turns = _turns(obj) if "input_ids" not in obj and tokenizer is not None else None
        if turns:
            pairs = list(_turn_sequences(turns, tokenizer))  # (ids, prompt_len) per answering turn
        elif "input_ids" in obj:
            ids = obj["input_ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**63 for i in ids):
                raise TrainConfigError(f"{p} line {n}: input_ids must be a list of token ids (integers >= 0).")
            prompt_len = obj.get("prompt_len")
            prompt_len = 0 if prompt_len is None else prompt_len  # absent or null: the whole sequence is trained on
            if not isinstance(prompt_len, int) or isinstance(prompt_len, bool) or prompt_len < 0:
                raise TrainConfigError(f"{p} line {n}: prompt_len must be an integer >= 0 (the prompt's tokens), found {str(prompt_len)[:40]!r}.")
            pairs = [(ids, prompt_len)]
        else:
            if tokenizer is None:
                raise TrainConfigError(f"{p} line {n} has no input_ids and the model has no tokenizer.json to tokenize its text with.")
            pairs = [(tokenizer.encode(_prompt_of(obj) or "", add_special_tokens=True), 0)]  # a text, all answer (conversations: above, turn by turn)
        for ids, prompt_len in pairs:
            _check_vocab(p, n, ids, vocab_size)
            ids = ids[:max_len]
            if len(ids) > max(2, prompt_len):
                out.append(Sequence(ids, prompt_len))
    if not out:
        why = ("is empty" if lines == 0
               else f"has no sequence with a token to learn (of {lines} lines: each needs 3 tokens or more, and answer tokens after its prompt_len)")
        raise TrainConfigError(f"{flag} {p} {why}; nothing to {'train on' if flag == '--data' else 'report on'}.")
    return out
