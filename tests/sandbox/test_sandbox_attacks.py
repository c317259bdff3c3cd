"""Each attack on the sandbox ends with reward 0, a logged reason, the host unchanged and the trainer alive
(rise_nemo/judges/sandbox_attacks.py: the attack programs, the bait and what "contained" checks)."""

from __future__ import annotations

import logging
import os

import pytest

from rise_nemo.judges.code_verifier import CodeResult, CodeTests
from rise_nemo.judges.sandbox_attacks import ATTACKS, HostBait, run_attack


@pytest.fixture(scope="module")
def bait():
    with HostBait() as b:
        yield b


# the outcome kind each attack ends with (the reason must say why)
EXPECTED = {
    "fork_bomb": {"timeout", "runtime_error"}, "rm_rf_home": {"wrong_answer"}, "rm_rf_run_dir": {"wrong_answer"},
    "write_outside_tmp": {"wrong_answer"}, "read_api_key_env": {"wrong_answer"}, "read_ssh_key": {"wrong_answer"},
    "read_run_dir": {"wrong_answer"}, "open_socket": {"runtime_error"}, "allocate_50gb": {"memory"},
    "infinite_loop": {"timeout"}, "print_1gb": {"output_limit"}, "close_stdout": {"timeout"},
    "sleep_past_limit": {"timeout"}, "daemon_outlives": {"wrong_answer"}, "kill_parent": {"wrong_answer"},
    "sigstop_self": {"timeout"}, "ctypes_crash": {"runtime_error"},
    "multiprocess_memory_bomb": {"memory"}, "thread_bomb": {"runtime_error"}, "double_fork_escape": {"wrong_answer"},
    "ptrace_pid1": {"wrong_answer"}, "dev_shm_fill": {"wrong_answer"}, "fill_private_tmp": {"wrong_answer"},
}
# with per-execution cgroups the process cap is the cgroup's: the whole execution is killed
WITH_CGROUPS = {"fork_bomb": {"processes"}, "thread_bomb": {"processes"}}
# only a cgroup caps what several processes hold together (without one: the host memory budget, tested in
# test_execution_cgroups.py)
NEEDS_CGROUPS = {"multiprocess_memory_bomb"}
MEMORY_ATTACKS = {"multiprocess_memory_bomb", "dev_shm_fill", "fill_private_tmp"}
# What this process's cgroups may hold beyond the executions' caps: the kernel charges in per-CPU batches of
# 64 pages, and the launch prepared for each slot's next execution (a forked child waiting to exec) holds
# 16-256 KiB. Measured here well under 1 MiB in all.
SLACK = 4 << 20


def test_every_attack_has_an_expectation():
    assert {a.name for a in ATTACKS} == set(EXPECTED)
    assert len(ATTACKS) >= 20


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_contained(verifier, sandbox, bait, attack, caplog, request):
    if attack.name in NEEDS_CGROUPS:
        request.getfixturevalue("cgroups")
    if attack.name in MEMORY_ATTACKS:
        request.getfixturevalue("roomy_host")
    trainer_pid = os.getpid()
    with caplog.at_level(logging.INFO, logger="rise_nemo.judges.code_verifier"):
        report = run_attack(verifier, attack, bait)
    expected = WITH_CGROUPS.get(attack.name, EXPECTED[attack.name]) if sandbox.cgroups else EXPECTED[attack.name]
    assert report.contained, report
    assert report.reward == 0.0 and report.outcome in expected, report
    assert report.reason and not report.damage and not report.leftover and report.trainer_ok
    assert os.getpid() == trainer_pid and os.environ.get("RISE_NEMO_JUDGE_API_KEY") == bait.proof
    if sandbox.cgroups is not None:  # what the execution held, by the kernel's count, stayed within its cap
        assert report.cgroup_peak_bytes is not None and report.cgroup_peak_bytes <= report.cap_bytes + SLACK, report
        sandbox.discard_prepared()  # the launches forked ahead for the next executions, with their cgroups
        assert not list(sandbox.cgroups.parents[0].glob("exec-*"))  # the attack's cgroup is gone
    if attack.name == "multiprocess_memory_bomb":
        assert "whole execution killed" in report.reason


def test_killed_sandbox_leaves_no_process(verifier, bait):
    """The daemon's command line carries the bait token: it must be gone as soon as grading returns."""
    from rise_nemo.judges.sandbox_attacks import leftover_processes

    daemon = next(a for a in ATTACKS if a.name == "daemon_outlives")
    code = daemon.code.format(**bait.fields()).replace('print("started a daemon")',
                                                        "import time\ntime.sleep(3600)")
    [result] = verifier.grade([code], [CodeTests([""], ["x"])])
    assert result.outcome == "timeout"
    assert leftover_processes(bait.token) == []


class _Escaping:
    """A verifier that reports every program as passing: run_attack must call that an escape."""

    def grade(self, responses, tests):
        return [CodeResult(1.0, 1, 1, "passed", "all tests passed") for _ in responses]


def test_run_attack_reports_an_escape(bait):
    report = run_attack(_Escaping(), ATTACKS[0], bait)
    assert not report.contained and report.reward == 1.0


def test_bait_detects_host_damage():
    with HostBait() as b:
        assert b.damage() == []
        (b.run_dir / "pwned").write_text("x")
        (b.home / ".ssh" / "id_ed25519").unlink()
        b.home.joinpath(".ssh", "id_ed25519").write_text("other")
        damage = b.damage()
    assert "run directory changed" in damage and "home's SSH key changed or removed" in damage
