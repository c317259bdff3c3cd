"""The unit-test code reward end to end in the sandbox: each outcome kind, pass fraction, limits, verify()."""

from __future__ import annotations

import logging
import threading

import pytest

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.judges.code_verifier import CodeTests, CodeVerifier
from rise_nemo.judges.sandbox import SandboxPool

ADD = CodeTests(["1 2\n", "5 7\n", "10 -3\n"], ["3", "12", "7"])
CALL = CodeTests([[1, 2], [5, 7]], [[3], 12], "add")


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


@pytest.mark.parametrize("code, tests, outcome, passed", [
    ("a, b = map(int, input().split())\nprint(a + b)", ADD, "passed", 3),
    ("def add(a, b):\n    print('noise')\n    return a + b", CALL, "passed", 2),
    ("class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a + b", CALL, "passed", 2),
    ("a, b = map(int, input().split())\nprint(a + b if a < 10 else 0)", ADD, "wrong_answer", 2),
    ("def add(a, b):\n    return a - b", CALL, "wrong_answer", 0),
    ("def add(a, b)\n    return a + b", CALL, "syntax_error", 0),
    ("print(1 +)", ADD, "syntax_error", 0),
    ("a, b = map(int, input().split())\nprint(a + b if b != 7 else a // (b - 7))", ADD, "runtime_error", 2),
    ("def sub(a, b):\n    return a - b", CALL, "runtime_error", 0),  # no function add
    ("import time\na, b = map(int, input().split())\nif b == 7: time.sleep(60)\nprint(a + b)", ADD, "timeout", 2),
    ("while True:\n    pass", ADD, "timeout", 0),
    ("x = [0] * (10 ** 10)", ADD, "memory", 0),  # one process past its address space: MemoryError
    ("import sys\nwhile True:\n    sys.stdout.write('y' * 65536)", ADD, "output_limit", 0),
])
def test_outcome_kinds(verifier, code, tests, outcome, passed):
    [r] = verifier.grade([fenced(code)], [tests])
    assert (r.outcome, r.passed, r.total) == (outcome, passed, len(tests.outputs)), r
    assert r.reward == (1.0 if outcome == "passed" else 0.0)
    assert r.pass_fraction == pytest.approx(passed / len(tests.outputs))
    assert r.reason


def test_no_code_and_syntax_error_stop_early(verifier):
    [none] = verifier.grade(["```cpp\nint main(){}\n```"], [ADD])
    assert (none.outcome, none.passed, none.total) == ("no_code", 0, 3)
    [syn] = verifier.grade([fenced("print(")], [ADD])
    assert syn.outcome == "syntax_error" and "SyntaxError" in syn.reason and len(syn.tests) == 3


def test_total_time_limit_counts_unreached_tests_as_timeouts(sandbox):
    v = CodeVerifier(per_test_seconds=2.0, total_seconds=3.0, workers=1, sandbox=sandbox)
    try:
        slow = CodeTests(["1\n"] * 5, ["1"] * 5)
        [r] = v.grade([fenced("import time\ntime.sleep(60)")], [slow])
    finally:
        v.close()
    assert r.outcome == "timeout" and r.total == 5
    assert any("total time limit" in t.reason for t in r.tests)


def test_preamble_is_the_apps_harness_one(verifier, sandbox):
    code = "print(gcd(12, 18), Counter('aab')['a'], list(accumulate([1, 2])), heappop([3]))"
    [r] = verifier.grade([fenced(code)], [CodeTests([""], ["6 2 [1, 3] 3"])])
    assert r.outcome == "passed", r
    bare = CodeVerifier(per_test_seconds=3.0, workers=1, preamble=False, sandbox=sandbox)
    try:
        [r] = bare.grade([fenced(code)], [CodeTests([""], ["6 2 [1, 3] 3"])])
    finally:
        bare.close()
    assert r.outcome == "runtime_error" and "NameError" in r.reason


def test_verify_returns_bools_logs_each_rollout_and_none_for_bad_tests(verifier, caplog):
    def problem(pid: str, answer: str) -> ReasoningProblem:
        return ReasoningProblem(pid, ({"role": "user", "content": "add"},), "", answer)

    problems = [problem("ok", ADD.to_json()), problem("bad", ADD.to_json()), problem("broken", "{not json")]
    responses = [fenced("a, b = map(int, input().split())\nprint(a + b)"), fenced("print(0)"), fenced("print(1)")]
    before = verifier.outcomes.copy()
    with caplog.at_level(logging.INFO, logger="rise_nemo.judges.code_verifier"):
        assert verifier.verify(problems, responses) == [True, False, None]
    logged = [r.getMessage() for r in caplog.records if r.name == "rise_nemo.judges.code_verifier"]
    assert any("ok: passed 3/3" in m for m in logged) and any("bad: wrong_answer 0/3" in m for m in logged)
    assert any("broken: unreadable tests" in m for m in logged)
    assert verifier.outcomes["passed"] == before["passed"] + 1
    assert verifier.outcomes["wrong_answer"] == before["wrong_answer"] + 1
    assert [r and r.outcome for r in verifier.last_results] == ["passed", "wrong_answer", None]


def test_sandbox_environment(sandbox, monkeypatch, tmp_path):
    """No trainer variables, an unprivileged uid, no route out, read-only everything but /tmp, no host paths."""
    monkeypatch.setenv("RISE_NEMO_SECRET_PROBE", "leak")
    code = (
        "import os, socket\n"
        "print(sorted(os.environ))\n"
        "print(os.getuid(), os.getgid())\n"
        "print(sorted(os.listdir('/')))\n"
        f"print(os.path.exists({str(tmp_path)!r}), os.path.exists('/work'), os.path.exists('/root'))\n"
        "print(os.listdir('/proc/1'))\n"  # bubblewrap's PID 1 (its environment, its memory) is hidden
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net')\n"
        "except OSError:\n    print('nonet')\n"
        "open('/tmp/ok', 'w').write('x'); print(os.getcwd())\n"
        "import subprocess\n"
        "print(subprocess.run(['unshare', '--user', 'true'], capture_output=True).returncode != 0)\n"
    )
    res = sandbox.run_python(code)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode().splitlines()
    assert lines[0] == "['HOME', 'LANG', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PATH', 'PWD', 'PYTHONIOENCODING']"
    assert lines[1] == "65534 65534"
    assert "work" not in lines[2] and "home" not in lines[2] and "root" not in lines[2]
    assert lines[3:] == ["False False False", "[]", "nonet", "/tmp", "True"]  # ..., no nested user namespace


def test_pool_back_pressure(sandbox):
    """submit blocks while max_pending executions are queued or running; it resumes when one finishes."""
    release, started = threading.Event(), threading.Event()
    with SandboxPool(sandbox, workers=1, max_pending=1) as pool:
        first = pool.submit_task(lambda box, slot: (started.set(), release.wait(60))[1])
        assert started.wait(60)
        second_submitted = threading.Event()

        def submit_second():
            pool.submit("print('two')")
            second_submitted.set()

        t = threading.Thread(target=submit_second)
        t.start()
        assert not second_submitted.wait(0.5)  # blocked: the queue is full (no timing dependence on success)
        release.set()
        assert second_submitted.wait(60)
        t.join(60)
        assert first.result() is True


def test_process_limit_counts_each_sandbox_alone(sandbox):
    """The process cap (16 here) holds inside the sandbox, and two sandboxes at once each get the whole cap:
    with cgroups its pids.max (then the whole execution is killed, ``processes``), without them
    RLIMIT_NPROC (the fork fails inside the program)."""
    code = ("import os, time\n"
            "for i in range(40):\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        print('limit', flush=True)\n"
            "        break\n"
            "    if pid == 0:\n"
            "        time.sleep(3)\n"
            "        os._exit(0)\n"
            "    print('forked', i + 1, flush=True)\n")
    with SandboxPool(sandbox, workers=2) as pool:
        results = pool.map([(code, ""), (code, "")])
    for res in results:
        forked = max([int(line.split()[1]) for line in res.stdout.decode().splitlines() if line.startswith("forked")],
                     default=0)
        assert 8 <= forked < 16, res.stdout  # the sandbox's cap, not the host's
        if sandbox.cgroups is not None:
            assert res.limit == "processes" and res.returncode is None and "process cap" in res.reason, res
        else:
            assert res.returncode == 0 and res.stdout.decode().splitlines()[-1] == "limit", res.reason


def test_stderr_past_its_cap_is_drained_not_blocking(sandbox):
    """A program that floods stderr and then answers is not stalled by a full pipe: it finishes, stderr kept
    to its cap."""
    code = "import sys\nfor _ in range(64):\n    sys.stderr.write('e' * 65536)\nprint('done')"
    res = sandbox.run_python(code)
    assert res.returncode == 0 and res.stdout == b"done\n" and not res.timed_out
    assert len(res.stderr) == sandbox.limits.stderr_bytes


def test_batch_metrics_of_the_last_verify(verifier):
    def problem(pid: str) -> ReasoningProblem:
        return ReasoningProblem(pid, ({"role": "user", "content": "add"},), "", ADD.to_json())

    responses = [fenced("a, b = map(int, input().split())\nprint(a + b)"),
                 fenced("a, b = map(int, input().split())\nprint(a + b if a < 10 else 0)"), fenced("print(")]
    verifier.verify([problem("a"), problem("b"), problem("c")], responses)
    m = verifier.batch_metrics()
    assert m["code/pass_fraction"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert (m["code/outcome/passed"], m["code/outcome/wrong_answer"], m["code/outcome/syntax_error"]) == \
        pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert sum(v for k, v in m.items() if k.startswith("code/outcome/")) == pytest.approx(1.0)
