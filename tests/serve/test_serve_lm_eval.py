"""lm-evaluation-harness against a running specdec-serve on the demo pair: a log-likelihood task and a
generation task on local data (tests/serve/lm_eval_tasks, no download), the way users run it:
``lm_eval --model local-completions --model_args base_url=...,tokenizer=...``.

The same scores, and the same per-sample answers, with speculative.method none, draft and ngram (each a
server whose default it is: the harness sends no extension field).
"""

from pathlib import Path

import pytest
from servers import running

from specdec.builder.build import build_engine
from specdec.formats.config_strings import DraftTargetConfig, NGramConfig
from specdec.formats.engine_format import BuildConfig
from specdec.serve import build_served

lm_eval = pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness: pip install 'specdec[lmeval]' (in dev)")

ROOT = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).parent / "lm_eval_tasks"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval")
    quiet = dict(say=lambda _: None)
    build_engine(ROOT / "examples/demo-pair/target", d / "target", BuildConfig(dtype="float32", max_batch_size=4, max_input_len=256, max_seq_len=512,
                                                                               max_draft_len=4, speculative_decoding_mode="draft_tokens_external"),
                 **quiet)
    build_engine(ROOT / "examples/demo-pair/draft", d / "draft", BuildConfig(dtype="float32", max_batch_size=4, max_input_len=256, max_seq_len=512),
                 **quiet)
    tasks = d / "tasks"
    tasks.mkdir()
    for f in TASKS.iterdir():  # the data paths made absolute: the test runs from any directory
        text = f.read_text().replace("tests/serve/lm_eval_tasks/", f"{tasks}/")
        (tasks / f.name).write_text(text)
    return d


def evaluate(url: str, tokenizer: Path, include: Path) -> tuple[dict, dict]:
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"base_url={url}/v1/completions,tokenizer={tokenizer},model=demo,num_concurrent=2,max_retries=1,tokenized_requests=True",
        tasks=["specdec_pycode_mc", "specdec_pycode_gen"],
        task_manager=TaskManager(include_path=str(include), include_defaults=False),
        batch_size=4,  # several prompts in one request
        log_samples=True,
    )
    scores = {t: {k: v for k, v in r.items() if k in ("acc,none", "exact_match,none")} for t, r in out["results"].items()}
    answers = {t: [s["resps"] for s in samples] for t, samples in out["samples"].items()}
    return scores, answers


def test_lm_eval_scores_are_the_same_with_every_method(demo, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(demo / "hf-cache"))
    results = {}
    for method in ("none", "draft", "ngram"):
        served = build_served(demo / "target", demo / "draft", DraftTargetConfig(3, [0], [0], False), NGramConfig(4, 2, [0]), num_threads=1,
                              served_model_name="demo", method=method)
        with running(served) as url:
            results[method] = evaluate(url, demo / "target", demo / "tasks")
        stats = served.engine.stats
        if method != "none":
            assert stats.drafted > 0  # the generation task drafted (the log-likelihood requests decode 1 token)
    scores, answers = results["none"]
    assert all(r[0][0].strip() for r in answers["specdec_pycode_gen"])  # real continuations, compared one by one below
    assert set(scores) == {"specdec_pycode_mc", "specdec_pycode_gen"}
    assert 0.5 <= scores["specdec_pycode_mc"]["acc,none"] <= 1.0  # a model trained on Python prefers the Python continuations
    for method in ("draft", "ngram"):
        assert results[method] == (scores, answers), method
