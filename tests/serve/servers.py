"""Tiny engines with a real tokenizer and chat template, and real servers on 127.0.0.1 for the serve tests.

The engines are built once per test process (``engines()`` is cached), into a
temporary directory removed at exit: every serve test module shares them.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from checkpoints import make_checkpoint  # noqa: E402
from conftest import spec_build  # noqa: E402

from specdec.builder.build import build_engine  # noqa: E402
from specdec.formats.config_strings import DraftTargetConfig, NGramConfig  # noqa: E402
from specdec.runtime.proposers.suffix import SuffixConfig  # noqa: E402
from specdec.serve import build_served, create_app  # noqa: E402
from specdec.serve.server import ServerThread  # noqa: E402

MAX_DRAFT = 4
LONG = 8192  # the one-slot engine's max_seq_len
# A transformers-style template: special tokens as variables, a loop, raise_exception, add_generation_prompt.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('roles must be system, user or assistant') }}{% endif %}"
    "{{ message['role'] }}: {{ message['content'] | trim }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% if enable_thinking is defined and not enable_thinking %} (no thinking){% endif %}{% endif %}"
)


def char_tokenizer(path: Path, chat_template: str | None) -> None:
    """The docs' character-level tokenizer: <pad> <s> </s> "\\n", then ASCII 32..123 (96 ids)."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "\n": 3}
    vocab.update({chr(c): 4 + i for i, c in enumerate(range(32, 124))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast"}
    if chat_template:
        cfg["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


@functools.cache
def engines() -> dict[str, Path]:
    root = Path(tempfile.mkdtemp(prefix="specdec-serve-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    target = make_checkpoint(root / "target-ckpt", num_hidden_layers=2, seed=0)
    draft = make_checkpoint(root / "draft-ckpt", num_hidden_layers=1, hidden_size=32, intermediate_size=64, seed=0)
    char_tokenizer(target, CHAT_TEMPLATE)
    char_tokenizer(draft, CHAT_TEMPLATE)
    # a long context (a request can hold the slot for thousands of rounds), a tokenizer without a chat template
    plain = make_checkpoint(root / "plain-ckpt", num_hidden_layers=2, seed=0, max_position_embeddings=LONG)
    char_tokenizer(plain, None)
    quiet = dict(say=lambda _: None)
    build_engine(target, root / "target", spec_build(MAX_DRAFT, max_batch_size=4, max_input_len=64, max_seq_len=160), **quiet)
    build_engine(draft, root / "draft", spec_build(0, max_batch_size=4, max_input_len=64, max_seq_len=160), **quiet)
    build_engine(plain, root / "one-slot", spec_build(0, max_batch_size=1, max_input_len=64, max_seq_len=LONG), **quiet)
    return {"root": root, "target": root / "target", "draft": root / "draft", "one-slot": root / "one-slot", "target-ckpt": target}


DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"
# A Hermes-style template: tools as JSON in the prompt, tool results and calls as messages (the demo pair has none)
DEMO_TEMPLATE = (
    "{% if tools %}# tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}# {{ m['role'] }}: {{ m['content'] or '' }}"
    "{% if m['tool_calls'] is defined %}{{ m['tool_calls'] | tojson }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:\n{% endif %}"
)


@functools.cache
def demo_engines() -> dict[str, Path]:
    """The demo pair (a real BPE tokenizer, which llguidance reads: structured outputs and tools), built once per process."""
    from specdec.formats.engine_format import BuildConfig

    root = Path(tempfile.mkdtemp(prefix="specdec-serve-demo-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    quiet = dict(say=lambda _: None)
    build_engine(DEMO / "target", root / "target", BuildConfig(dtype="float32", max_batch_size=4, max_input_len=512, max_seq_len=768, max_draft_len=4,
                                                                speculative_decoding_mode="draft_tokens_external"), **quiet)
    build_engine(DEMO / "draft", root / "draft", BuildConfig(dtype="float32", max_batch_size=4, max_input_len=512, max_seq_len=768), **quiet)
    (root / "chat.jinja").write_text(DEMO_TEMPLATE)
    return {"root": root, "target": root / "target", "draft": root / "draft", "chat_template": root / "chat.jinja"}


def served_demo(**kw):
    """The demo pair served as "demo": draft-target (3 drafts) by default, n-gram and suffix decoding loaded, a chat template."""
    e = demo_engines()
    return build_served(e["target"], e["draft"], DraftTargetConfig(3, [0], [0], False), NGramConfig(4, 2, [0]), num_threads=1,
                        chat_template=e["chat_template"], served_model_name="demo", suffix=SuffixConfig(max_draft_len=4), **kw)


def served_pair(**kw):
    """Target + draft model + n-gram + suffix decoding, draft-target the default (3 drafts per round)."""
    e = engines()
    return build_served(e["target"], e["draft"], DraftTargetConfig(3, [0], [0], False), NGramConfig(MAX_DRAFT, 2, [0]), num_threads=1,
                        suffix=SuffixConfig(max_draft_len=MAX_DRAFT), **kw)


@contextmanager
def running(served, **app_kw):
    """A real server on 127.0.0.1, an ephemeral port, in a thread: yields its base URL."""
    app = create_app(served, **app_kw)
    with ServerThread(app) as url:
        yield url


def sse_events(lines) -> list:
    """The data: payloads of an SSE stream, JSON-decoded ('[DONE]' kept as a string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def join_choices(chunks: list[dict]) -> list[dict]:
    """A completion stream's chunks joined per choice (text, token ids, finish reason, logprobs' lists), by index."""
    by: dict[int, dict] = {}
    for e in chunks:
        for c in e["choices"]:
            j = by.setdefault(c["index"], {"index": c["index"], "text": "", "token_ids": [], "finish_reason": None, "logprobs": None})
            j["text"] += c["text"]
            j["token_ids"] += c["token_ids"]
            j["finish_reason"] = c["finish_reason"] or j["finish_reason"]
            if c["logprobs"] is not None:
                lp = j["logprobs"] = j["logprobs"] or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                for k in lp:
                    lp[k] += c["logprobs"][k]
    return [by[i] for i in sorted(by)]


def scrape(url: str, **kw) -> dict:
    """/metrics as {(sample name, ((label, value), ...)): value}, model_name dropped from the labels."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", **kw).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
