"""specdec-serve with an EAGLE target: its own drafter is served (chain or tree), greedy answers equal target-only's,
sampled requests on a tree server draft the tree too, and a method the server lacks is a 400."""

import httpx
import pytest
from checkpoints import write_eagle_module, write_medusa_heads
from conftest import spec_build
from servers import engines, running

from specdec.builder.build import build_engine
from specdec.serve import build_served

TREE = "[[0],[1],[0,0],[0,1],[0,0,0]]"
PROMPTS = ["def fib(n):", "Hello world", "abc abc abc abc"]


@pytest.fixture(scope="module")
def eagle_url(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve_eagle")
    ckpt = engines()["target-ckpt"]
    write_eagle_module(ckpt, d / "module")
    build_engine(ckpt, d / "eagle", spec_build(6, speculative_decoding_mode="eagle", max_input_len=64, max_seq_len=160), say=lambda _: None,
                 eagle_dir=d / "module")
    served = build_served(d / "eagle", num_threads=1, draft_num_threads=1, eagle_choices=TREE)
    assert served.methods == ["none", "eagle"] and served.engine.speculation.method == "eagle"
    with running(served) as url:
        yield url


def complete(url, prompt, **kw):
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 16, **kw}, timeout=60)
    return r.status_code, r.json()


def test_greedy_eagle_tree_answers_equal_target_only(eagle_url):
    for p in PROMPTS:
        code, base = complete(eagle_url, p, temperature=0, speculative={"method": "none"})
        assert code == 200
        code, spec = complete(eagle_url, p, temperature=0)  # the server's default: eagle, its tree
        assert code == 200 and spec["choices"][0]["text"] == base["choices"][0]["text"]


def test_a_tree_servers_requests_report_the_drafts_they_ran_with(eagle_url):
    """speculative.num_draft_tokens in the response is what the request drafted: the tree cut to its nodes (5 here,
    asked for 6, 3 or 2), greedy and sampled alike."""
    for asked, temperature, ran in ((6, 0, 5), (3, 0, 3), (6, 0.8, 5), (2, 0.8, 2)):
        code, out = complete(eagle_url, PROMPTS[0], temperature=temperature, seed=1, speculative={"num_draft_tokens": asked})
        assert code == 200 and out["speculative"]["num_draft_tokens"] == ran, (asked, temperature, out["speculative"])
        assert len(out["speculative"]["drafted_per_position"]) <= 3  # the tree's depth bounds either


def test_sampled_requests_are_served_and_missing_methods_refused(eagle_url):
    code, out = complete(eagle_url, PROMPTS[0], temperature=0.8, seed=3)  # the tree, recursive rejection sampling
    assert code == 200 and out["usage"]["completion_tokens"] == 16 and out["speculative"]["drafted"] > 0
    assert complete(eagle_url, PROMPTS[0], temperature=0.8, seed=3)[1]["choices"] == out["choices"]  # the seed decides
    code, err = complete(eagle_url, PROMPTS[0], speculative={"method": "medusa"})
    assert code == 400 and "speculative_decoding_mode medusa" in err["error"]["message"]
    assert httpx.get(f"{eagle_url}/health", timeout=10).status_code == 200  # still serving


@pytest.fixture(scope="module")
def peagle_url(tmp_path_factory):
    from checkpoints import write_peagle_module

    d = tmp_path_factory.mktemp("serve_peagle")
    ckpt = engines()["target-ckpt"]
    write_peagle_module(ckpt, d / "module")
    build_engine(ckpt, d / "peagle", spec_build(6, speculative_decoding_mode="peagle", max_input_len=64, max_seq_len=160), say=lambda _: None,
                 peagle_dir=d / "module")
    served = build_served(d / "peagle", num_threads=1, draft_num_threads=1)
    assert served.methods == ["none", "peagle"] and served.engine.speculation.method == "peagle"
    with running(served) as url:
        yield url


def test_peagle_per_request_chains_auto_and_sampling(peagle_url):
    """A P-EAGLE server: per request its method (chains of any length, auto), greedy answers equal target-only's;
    a sampled request is served; another method is a 400."""
    for p in PROMPTS:
        code, base = complete(peagle_url, p, temperature=0, speculative={"method": "none"})
        assert code == 200
        for k in (2, 6, "auto"):
            code, spec = complete(peagle_url, p, temperature=0, speculative={"method": "peagle", "num_draft_tokens": k})
            assert code == 200 and spec["choices"][0]["text"] == base["choices"][0]["text"], (p, k)
    code, out = complete(peagle_url, PROMPTS[0], temperature=0.8, seed=3)
    assert code == 200 and out["usage"]["completion_tokens"] == 16
    code, err = complete(peagle_url, PROMPTS[0], speculative={"method": "eagle"})
    assert code == 400 and "speculative_decoding_mode eagle" in err["error"]["message"]


def test_a_medusa_chain_reports_the_drafts_it_ran_with(tmp_path_factory):
    """Without a tree a Medusa chain drafts one token per head: a request asking for more ran with that many, and its
    speculative.num_draft_tokens says so (it reported what was asked, 6, where 2 ran)."""
    d = tmp_path_factory.mktemp("serve_medusa")
    ckpt = engines()["target-ckpt"]
    write_medusa_heads(ckpt, d / "heads", num_heads=2)
    build_engine(ckpt, d / "medusa", spec_build(6, speculative_decoding_mode="medusa", max_input_len=64, max_seq_len=160), say=lambda _: None,
                 medusa_dir=d / "heads")
    with running(build_served(d / "medusa", num_threads=1, draft_num_threads=1)) as url:
        for asked, ran in ((6, 2), (1, 1)):
            for temperature in (0, 0.8):
                code, out = complete(url, PROMPTS[0], temperature=temperature, seed=1, speculative={"num_draft_tokens": asked})
                assert code == 200 and out["speculative"]["num_draft_tokens"] == ran, (asked, temperature, out["speculative"])
                assert len(out["speculative"]["drafted_per_position"]) <= 2
