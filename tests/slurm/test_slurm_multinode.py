"""The multi-node launch for real: `sbatch` of the real scripts on a 3-node Slurm whose nodes are network
namespaces (tests/slurm/netns_cluster.py), each node with its own address.

Layout of every tiny job here (3 nodes, RISE_JUDGE_NODES=1, RISE_USE_RAY=1): node 1 (rise-n1) Ray head
+ driver (the real `rise-nemo train`, local backend), node 2 Ray worker, node 3 the judge server: the
project's OpenAI-compatible rule grader served by the launcher in place of `vllm serve`
(RISE_JUDGE_SERVER=rule), bound to node 3's address. The driver reads the judge's URL from RISE_JUDGE_URLS
only (the launcher passes no judge override), so a wrong address or binding fails the job. This test
process never sends anything to the namespaces' addresses: it submits and queries inside the controller's
namespace and inspects processes and files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from netns_cluster import NODE_NAMES
from slurm_cluster import REPO_ROOT
from test_slurm_train import FAST, STEPS, assert_resumed_once, job_logs, metric_steps, wait_for_steps

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The launcher's settings for the 3-node layout; the overrides make the tiny recipe's judge the HTTP
# client and point it at RISE_JUDGE_URLS / RISE_JUDGE_MODEL, which the launcher exports to the driver.
LAYOUT = {
    "RISE_USE_RAY": "1", "RISE_JUDGE_NODES": "1", "RISE_JUDGE_SERVER": "rule", "RISE_JUDGE_MODEL": "rule-grader",
    "RISE_JUDGE_URLS_KEY": "", "RISE_JUDGE_MODEL_KEY": "", "RAY_INCLUDE_DASHBOARD": "false",
    "RISE_SERVER_RESTART_DELAY": "1", "RISE_SERVER_TIMEOUT": "120", "RISE_RAY_TIMEOUT": "180",
    # Our test environment sets 0 (keeps Ray on one node, on loopback); these namespaced nodes form a real
    # multi-node Ray cluster whose traffic stays on the namespaces' bridge.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
}
JUDGE_OVERRIDES = ("judge.type=http", "++judge.base_urls=${oc.decode:${oc.env:RISE_JUDGE_URLS}}",
                   "++judge.model=${oc.env:RISE_JUDGE_MODEL}", "++judge.max_attempts=12")
RULE_SERVER = "rise_nemo.judges.rule_server"
# Generous bounds for a loaded 2-core machine: Ray's two nodes take ~30-60 s to come up there, and the job
# that runs first on a fresh clone also builds the tiny model's warm start (cached in .cache/, 1-3 min).
FIRST_STEP_S, JOB_S = 600, 600


def submit_three_nodes(cluster, tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> tuple[str, Path]:
    run_dir = tmp_path / "run"
    job_id = cluster.sbatch("slurm/rise_tiny_cpu.sh", *FAST, *JUDGE_OVERRIDES, *overrides,
                            sbatch_args=("--nodes=3", "-o", str(tmp_path / "slurm-%j.out")),
                            env={**LAYOUT, "RISE_RUN_DIR": str(run_dir), **(env or {})})
    return job_id, run_dir


def roles_by_namespace(cluster) -> dict[str, set[str]]:
    """Which of our processes of interest run in which node's namespace right now."""
    # By the program each process runs (argv[0]): the srun clients on node 1 carry the same words in their
    # arguments.
    kinds = {"raylet": r"\S*/raylet ", "gcs": r"\S*/gcs_server ", "rule-server": rf"\S*python\S* -m {RULE_SERVER} ",
             "driver": r"\S*python\S* -m rise_nemo\.cli train "}
    ns_node = {cluster.ns_of(node): node for node in NODE_NAMES}
    seen: dict[str, set[str]] = {node: set() for node in NODE_NAMES}
    for ns, cmd in cluster.processes().values():
        for kind, pattern in kinds.items():
            if re.match(pattern, cmd + " ") and ns in ns_node:
                seen[ns_node[ns]].add(kind)
    return seen


def judged_lines(run_dir: Path) -> list[tuple[int, int, int, str]]:
    """(verdicts, calls, cache hits, line) of every "judged ..." line the driver's HTTP judge client logged."""
    out = []
    for line in (run_dir / "logs" / "driver.log").read_text().splitlines():
        m = re.search(r"judged (\d+) verdicts .* (\d+) calls, (\d+) cache hits", line)
        if m:
            out.append((int(m[1]), int(m[2]), int(m[3]), line))
    return out


def assert_every_verdict_known(run_dir: Path, logs: str) -> list[tuple[int, int, int, str]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["judge/unknown_excluded"] for r in rows) == 0, logs
    judged = judged_lines(run_dir)
    assert len(judged) >= STEPS and all(line.endswith(" 0 unknown") for *_, line in judged), logs
    return judged


def assert_nothing_left(cluster) -> None:
    """After the job, no Ray process, server or step is left on any node (only the Slurm daemons)."""
    left = cluster.wait_no_strays(30)
    assert not left, f"left behind in the node namespaces: {left}"


def test_three_nodes_ray_across_two_and_the_judge_server_on_the_third(netns_slurm, tmp_path):
    cluster, ips = netns_slurm, netns_slurm.node_ips
    job_id, run_dir = submit_three_nodes(cluster, tmp_path)
    wait_for_steps(cluster, job_id, run_dir, 1, timeout=FIRST_STEP_S)
    running = roles_by_namespace(cluster)  # while the driver trains
    job = cluster.wait(job_id, timeout=JOB_S)
    logs = job_logs(tmp_path, run_dir)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), logs
    assert job.fields["NodeList"] == "rise-n[1-3]", job.fields
    assert running == {"rise-n1": {"raylet", "gcs", "driver"}, "rise-n2": {"raylet"}, "rise-n3": {"rule-server"}}, running
    assert metric_steps(run_dir) == list(range(1, STEPS + 1)), logs
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert {"reward/natural_mean", "loss/pg"} <= set(first)
    launcher = (run_dir / "logs" / "launcher.log").read_text()
    a, b, c = (ips[n] for n in NODE_NAMES)
    for expected in (f"node 0 rise-n1 {a}: ray-head+driver", f"node 1 rise-n2 {b}: ray-worker",
                     f"node 2 rise-n3 {c}: judge(rule-grader TP=4)",
                     f"Ray nodes alive: 2/2 {a} {b}",  # what the Ray cluster reports, asked from node 1
                     f"started judge-rise-n3-0: rule-grader TP=4 on rise-n3 at http://{c}:8000",
                     "all 1 server(s) healthy", "driver exited with code 0"):
        assert expected in launcher, (expected, launcher)
    # The driver got the judge from the environment and every verdict came from node 3's server.
    driver_line = next(line for line in launcher.splitlines() if " driver on rise-n1: " in line)
    assert "http://" not in driver_line, driver_line  # no URL override: the environment only
    judged = assert_every_verdict_known(run_dir, logs)
    # Real HTTP calls (identical criteria of one batch share a call, so fewer calls than verdicts can be). A
    # response the tiny model repeats is judged from the run's in-memory cache, which only the server's answers
    # fill: 0 calls, every verdict a cache hit.
    assert all(verdicts > 0 and (calls > 0 or hits == verdicts) for verdicts, calls, hits, _ in judged), judged
    assert sum(calls for _, calls, _, _ in judged) > 0, judged
    assert "READY 8000" in (run_dir / "logs" / "judge-rise-n3-0.log").read_text()
    assert_nothing_left(cluster)


def test_requeue_on_three_nodes_resumes_from_the_checkpoint_with_every_step_once(netns_slurm, tmp_path):
    """The requeue's SIGTERM reaches every step on every node at once: srun SIGKILLs the judge server on
    node 3 and the Ray steps, while the driver (in the batch step on node 1) has KillWait (30 s) left. The
    step it is in needs the judge, so it is abandoned at the first failed call and the last complete step
    is checkpointed (rise_nemo/stopping.py); retrying the dead server ran into the SIGKILL before.

    The interleaving is forced: after two steps the judge server's hold trigger makes it stop answering,
    and the requeue comes only once it holds a call, so the driver is inside a judge call when the TERM
    lands (a requeue timed by steps alone sometimes landed between steps, where there is nothing to abandon).
    The requeued attempt's server (same command) finds no trigger and answers normally."""
    cluster = netns_slurm
    trigger = tmp_path / "hold"
    serve = (f"exec {REPO_ROOT / '.venv' / 'bin' / 'python'} -m {RULE_SERVER} --host \"$HOST\" --port \"$PORT\" "
             f"--hold-trigger {trigger}")
    job_id, run_dir = submit_three_nodes(cluster, tmp_path, env={"RISE_SERVE_CMD": serve})
    wait_for_steps(cluster, job_id, run_dir, 2, timeout=FIRST_STEP_S)
    trigger.write_text("")  # the next judge call is never answered
    deadline = time.monotonic() + FIRST_STEP_S
    while not (tmp_path / "hold.held").exists():
        assert time.monotonic() < deadline, job_logs(tmp_path, run_dir)
        time.sleep(0.2)
    cluster.run("scontrol", "requeue", job_id)
    job = cluster.wait(job_id, timeout=JOB_S, min_restarts=1)
    logs = job_logs(tmp_path, run_dir)
    assert (job.state, job.exit_code, job.restarts) == ("COMPLETED", 0, 1), logs
    assert metric_steps(run_dir) == list(range(1, STEPS + 1)), logs
    assert_resumed_once(run_dir, "SIGTERM", logs)
    launcher = (run_dir / "logs" / "launcher.log").read_text()
    # Both attempts built the whole layout again: Ray on nodes 1-2 (the first attempt's Ray was gone, or
    # the new head could not have bound its ports) and the judge on node 3.
    assert "attempt SLURM_RESTART_COUNT=1" in launcher
    # The first attempt ended cleanly within KillWait: the driver exited 0 after the TERM, not SIGKILLed.
    first = launcher[:launcher.index("attempt SLURM_RESTART_COUNT=1")]
    assert "received TERM" in first and "driver exited with code 0" in first, launcher
    train_log = (run_dir / "train.log").read_text()
    # The stop reached the driver either just before the dead server's connection error (the failed call
    # is not retried) or just after it (the retry's backoff ends at the stop): both abandon the step.
    assert re.search(r"step \d+ abandoned: stop requested (and a judge call failed|while waiting to retry a failed "
                     r"judge call)", train_log), logs
    assert launcher.count("Ray nodes alive: 2/2 ") == 2 and launcher.count("all 1 server(s) healthy") == 2, launcher
    assert_every_verdict_known(run_dir, logs)
    assert_nothing_left(cluster)


def test_judge_server_on_node_three_killed_mid_run_is_restarted_and_no_verdict_is_lost(netns_slurm, tmp_path):
    """Driver on node 1, judge server on node 3 (Ray, checked above, is left out to keep the job short)."""
    cluster = netns_slurm
    job_id, run_dir = submit_three_nodes(cluster, tmp_path, env={"RISE_USE_RAY": "0"})
    wait_for_steps(cluster, job_id, run_dir, 2, timeout=FIRST_STEP_S)
    judge_ns = cluster.ns_of("rise-n3")
    servers = [pid for pid, (ns, cmd) in cluster.processes().items()
               if ns == judge_ns and re.match(rf"\S*python\S* -m {RULE_SERVER} ", cmd)]
    assert len(servers) == 1, cluster.processes()
    os.kill(servers[0], signal.SIGKILL)
    job = cluster.wait(job_id, timeout=JOB_S)
    logs = job_logs(tmp_path, run_dir)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), logs
    assert metric_steps(run_dir) == list(range(1, STEPS + 1)), logs
    launcher = (run_dir / "logs" / "launcher.log").read_text()
    assert "judge-rise-n3-0 on rise-n3 exited (rc=137): restart 1/5" in launcher, logs
    assert (run_dir / "logs" / "judge-rise-n3-0.log").read_text().count("READY 8000") == 2
    judged = assert_every_verdict_known(run_dir, logs)
    # The step that met the dead server retried until the restarted one answered.
    assert any(calls > verdicts for verdicts, calls, _, _ in judged), judged
    assert_nothing_left(cluster)


def test_a_layout_the_planner_rejects_is_refused_before_anything_starts(netns_slurm, tmp_path):
    """rise_14b.sh on 3 nodes of 6 GPUs: TP 4 x PP 2 does not divide 12 training GPUs. (The test nodes
    have no GPUs: Slurm is asked for none, the launcher is told 6 per node.)"""
    cluster = netns_slurm
    run_dir = tmp_path / "run"
    env = {"GPUS_PER_NODE": "6", "SBATCH_GPUS_PER_NODE": "0", "RISE_RUN_DIR": str(run_dir)}
    job_id = cluster.sbatch("slurm/rise_14b.sh", sbatch_args=("--nodes=3", "-o", str(tmp_path / "out.log")), env=env)
    job = cluster.wait(job_id, timeout=120)
    out = (tmp_path / "out.log").read_text()
    assert (job.state, job.exit_code) == ("FAILED", 2), out
    assert "does not divide the 12 training GPUs" in out, out
    assert "rise-nemo plan rejects recipes/rise_14b.yaml on 3 node(s)" in out and "nothing was started" in out
    launcher = (run_dir / "logs" / "launcher.log").read_text()
    assert "rise-nemo plan rejects" in launcher and "started" not in launcher.replace("nothing was started", "")
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["launcher.log"]
    assert_nothing_left(cluster)


def test_without_namespace_tools_the_fixture_skips_on_a_laptop_and_fails_in_ci(tmp_path):
    """Slurm installed but no `ip`/`nsenter`: the 3-node fixture skips with the reason, unless
    RISE_REQUIRE_SLURM=1 (CI), where it fails."""
    from netns_cluster import unavailable_reason
    from slurm_cluster import SLURM_BINARIES, run_as_laptop_and_as_ci

    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    for tool in SLURM_BINARIES:  # Slurm present, the namespace tools absent
        (tmp_path / tool).symlink_to(shutil.which(tool))
    laptop, ci = run_as_laptop_and_as_ci(
        "tests/slurm/test_slurm_multinode.py::test_a_layout_the_planner_rejects_is_refused_before_anything_starts",
        tmp_path)
    assert laptop.returncode == 0 and "1 skipped" in laptop.stdout, laptop.stdout
    assert "network namespace tools missing (ip, nsenter): apt-get install iproute2 util-linux" in laptop.stdout
    assert ci.returncode == 1 and "RISE_REQUIRE_SLURM=1 but network namespace tools missing" in ci.stdout, ci.stdout
