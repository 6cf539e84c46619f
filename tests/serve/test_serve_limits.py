"""Back-pressure and limits: a bounded queue (503 + Retry-After), a per-request timeout (504), /health while
the engines load, and SIGTERM that lets running requests finish (or ends them with a 503 at the deadline)."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from servers import engines, running, sse_events

from specdec.serve import build_served
from specdec.serve.server import ServerThread, answering_loading, bind, url_of

LONG_BODY = {"prompt": "abc", "max_tokens": 6000, "temperature": 0, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def one_slot():
    return build_served(engines()["one-slot"], num_threads=1)


def _first_chunk(url: str, body: dict, started: threading.Event, result: dict) -> None:
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                started.set()
                break
        result["events"] = sse_events(lines)  # read to the end, or until the server ends it


def test_a_full_queue_answers_503_with_retry_after(one_slot):
    with running(one_slot, max_queued_requests=1) as url:
        started, holder = threading.Event(), {}
        first = threading.Thread(target=_first_chunk, args=(url, {**LONG_BODY, "max_tokens": 1500}, started, holder))
        first.start()
        assert started.wait(30)
        queued = threading.Thread(target=lambda: holder.update(queued=httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                                                                                 timeout=60)))
        queued.start()
        for _ in range(200):  # the second waits for the slot
            if 'specdec:num_requests_waiting{model_name="one-slot"} 1.0' in httpx.get(f"{url}/metrics").text:
                break
            time.sleep(0.02)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "server_overloaded" and "--max_queued_requests 1" in err["message"]
        # a request that could never fit is a 400, not a retry
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 3}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        first.join(60)
        queued.join(60)
        assert holder["queued"].status_code == 200  # the queued one was served once the slot freed
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30).status_code == 200


def test_a_request_past_its_timeout_is_stopped_with_504(one_slot):
    with running(one_slot, request_timeout=0.5) as url:
        r = httpx.post(f"{url}/v1/completions", json={**LONG_BODY, "stream": False}, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        with httpx.stream("POST", f"{url}/v1/completions", json=LONG_BODY, timeout=60) as s:
            events = sse_events(s.iter_lines())
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
        # the slot was freed: a short request is served at once
        ok = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200 and ok.json()["timings"]["queue_s"] < 0.5


def test_health_says_loading_until_the_app_serves(one_slot):
    from specdec.serve import create_app

    sock = bind("127.0.0.1", 0)
    url = url_of("127.0.0.1", sock)
    with answering_loading(sock):
        r = httpx.get(f"{url}/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "loading" and r.headers["retry-after"] == "2"
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["message"].startswith("the model is loading")
    thread = ServerThread.__new__(ServerThread)  # the same socket handed to uvicorn, as run_server does
    from specdec.serve.server import _uvicorn_server

    thread.sock, thread.url = sock, url
    thread.server = _uvicorn_server(create_app(one_slot), "warning")
    thread.thread = threading.Thread(target=thread.server.run, kwargs={"sockets": [sock]}, daemon=True)
    with thread:
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}


def _start_cli(*flags) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "specdec.cli.serve", "--engine_dir", str(engines()["one-slot"]), "--port", "0", "--num_threads", "1", "--log_level",
           "warning", *flags]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline, line = time.time() + 60, ""
    while time.time() < deadline and "specdec-serve:" not in line:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "the server exited during startup"
    return proc, re.search(r"http://127\.0\.0\.1:\d+", line).group(0)


@pytest.mark.parametrize("grace,finishes", [(30, True), (0.5, False)], ids=["finishes", "deadline"])
def test_sigterm_drains(grace, finishes):
    proc, url = _start_cli("--shutdown_timeout", str(grace))
    try:
        started, holder = threading.Event(), {}
        body = {**LONG_BODY, "max_tokens": 400 if finishes else 7000}
        t = threading.Thread(target=_first_chunk, args=(url, body, started, holder))
        t.start()
        assert started.wait(30)
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        events = holder["events"]
        assert events[-1] == "[DONE]"
        if finishes:  # the running request had the time it needed
            assert events[-2]["choices"][0]["finish_reason"] == "length"
        else:  # ended at the deadline with a 503 error event
            assert events[-2]["error"]["type"] == "server_error" and "shutting down" in events[-2]["error"]["message"]
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has drained
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in proc.stderr.read()


def test_loading_failure_is_one_line(tmp_path):
    from click.testing import CliRunner

    from specdec.cli.serve import main

    bad = tmp_path / "not-an-engine"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    res = CliRunner().invoke(main, ["--engine_dir", str(bad), "--port", "0"])
    assert res.exit_code == 1 and res.output.startswith("error: ") and res.output.count("\n") == 1, res.output
