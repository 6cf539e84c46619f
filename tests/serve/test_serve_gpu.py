"""specdec-serve on the GPU (marked cuda: a host with an NVIDIA GPU and onnxruntime-gpu, or for the torch backend
torch with CUDA and Triton; skipped elsewhere).

The demo pair built for the GPU (ort_cuda, or --backend torch; bfloat16; the target an EAGLE target, so it also serves
draft-target and n-gram) behind the OpenAI-compatible server on --device cuda: 16 clients at once, mixed methods
(target-only, draft-target, n-gram, EAGLE, suffix decoding), streamed and not, 4 slots, so requests queue and join the
running batch. Every response must equal the same request decoded alone, target-only, on the same GPU engines.
"""

import threading
from pathlib import Path

import pytest
from conftest import spec_build
from servers import running
from test_serve_concurrency import _ask

from specdec.builder.build import build_engine
from specdec.formats.config_strings import DraftTargetConfig, NGramConfig
from specdec.runtime import GenerationConfig
from specdec.runtime.orchestrator import Orchestrator
from specdec.runtime.proposers.suffix import SuffixConfig
from specdec.serve import build_served

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair"
SPECS = [{"method": "none"}, {"method": "draft"}, {"method": "ngram"}, {"method": "eagle"}, {"method": "draft", "num_draft_tokens": "auto"},
         {"method": "suffix"}]


@pytest.mark.cuda
def test_sixteen_concurrent_clients_on_the_gpu_get_their_solo_output(tmp_path):
    sixteen_clients(tmp_path, lowering="ort_cuda")


@pytest.mark.cuda(backend="torch")
def test_sixteen_concurrent_clients_on_the_torch_backend_get_their_solo_output(tmp_path):
    sixteen_clients(tmp_path, backend="torch")


def test_sixteen_concurrent_clients_on_the_torch_backend_on_the_cpu_get_their_solo_output(tmp_path):
    """The same on the CPU (float32, the kernels' torch references): what CI checks of the torch backend behind the server."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sixteen_clients(tmp_path, device="cpu", backend="torch", dtype="float32")
    finally:
        torch.set_num_threads(threads)


def sixteen_clients(tmp_path, device="cuda", dtype="bfloat16", **backend):
    from specdec.formats.tokenizer import Tokenizer

    limits = dict(max_batch_size=4, max_input_len=128, max_seq_len=256, dtype=dtype, **backend)
    build_engine(DEMO / "target", tmp_path / "target", spec_build(8, speculative_decoding_mode="eagle", **limits),
                 eagle_dir=DEMO / "heads" / "eagle", say=lambda _: None)
    build_engine(DEMO / "draft", tmp_path / "draft", spec_build(0, **limits), say=lambda _: None)
    pair = (tmp_path / "target", tmp_path / "draft", DraftTargetConfig(3, [0], [0], False), NGramConfig(4, 2, [0]))
    served = build_served(*pair, device=device, suffix=SuffixConfig())
    tok = Tokenizer(DEMO / "target")
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    ids = tok.encode(text * 3)
    prompts = [ids[(i * 5) % 40 : (i * 5) % 40 + 8 + (i * 13) % 40] for i in range(16)]
    lengths = [8 + (i * 11) % 49 for i in range(16)]
    # alone, target-only, on the server's own engines: greedy speculation of every method must give exactly this
    solo = Orchestrator.from_engine(served.engine)
    want = [solo.generate([p], GenerationConfig(max_output_len=n, end_ids=served.end_ids, method="none"))[0][0].output_ids
            for p, n in zip(prompts, lengths, strict=True)]
    results: list = [None] * 16
    with running(served) as url:
        bodies = [{"prompt": p, "max_tokens": n, "temperature": 0, "speculative": SPECS[i % len(SPECS)], "stream": i % 3 == 0,
                   **({"stream_options": {"include_usage": True}} if i % 3 == 0 else {})}
                  for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))]
        threads = [threading.Thread(target=_ask, args=(url, b, results, i)) for i, b in enumerate(bodies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not any(t.is_alive() for t in threads)
    assert [r["choices"][0]["token_ids"] for r in results] == want
