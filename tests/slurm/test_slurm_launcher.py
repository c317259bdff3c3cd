"""The shared launcher (slurm/launch.sh): dry runs, exit codes, Ray start-up, judge servers.

The dry-run tests need only bash; the others submit to the real single-node Slurm of conftest.py.
Jobs here replace the trainer with RISE_DRIVER_CMD (a launcher feature) to test the launcher's own
mechanics quickly; tests/slurm/test_slurm_train.py submits the real `rise-nemo train`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from slurm_cluster import REPO_ROOT, port_below_ephemeral, require_tool, run_as_laptop_and_as_ci

pytestmark = pytest.mark.slurm
SCRIPTS = sorted((REPO_ROOT / "slurm").glob("*.sh"))
RECIPE_SCRIPTS = [p for p in SCRIPTS if p.name != "launch.sh"]


def dry_run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RISE_", "SBATCH_"))}
    return subprocess.run(["bash", str(REPO_ROOT / "slurm" / script), "--dry-run", *args],
                          env={**clean, **(env or {})}, capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT)


def test_shellcheck_clean():
    shellcheck = require_tool("shellcheck")
    assert len(RECIPE_SCRIPTS) >= 5, [p.name for p in SCRIPTS]
    res = subprocess.run([shellcheck, "-x", *map(str, SCRIPTS)], capture_output=True, text=True, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("script", [p.name for p in RECIPE_SCRIPTS])
def test_sbatch_directives_for_requeue_and_time_limit(script):
    text = (REPO_ROOT / "slurm" / script).read_text()
    directives = re.findall(r"^#SBATCH (\S+)", text, re.M)
    assert "--requeue" in directives and "--open-mode=append" in directives, directives
    assert any(re.fullmatch(r"--signal=B:USR1@\d+", d) for d in directives), directives
    assert any(d.startswith("--time=") for d in directives) and any(d.startswith("--nodes=") for d in directives)
    if script != "rise_tiny_cpu.sh":
        assert "--gpus-per-node=8" in directives and "--exclusive" in directives, directives
    assert text.rstrip().endswith('exec bash "${RISE_SBATCH_SCRIPT%/*}/launch.sh" "$@"')  # one shared launcher


def test_dry_run_rise_14b_on_three_nodes_lists_roles_and_commands():
    res = dry_run("rise_14b.sh", "--nodes", "3", "train.steps=7")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "planner: recipes/rise_14b.yaml on 3 node(s): OK: layout valid" in out
    roles = dict(re.findall(r"node \d (node-\d) \S+: (.+)$", out, re.M))
    assert roles == {"node-0": "ray-head+driver", "node-1": "ray-worker", "node-2": "judge(Qwen/Qwen3-32B TP=4)"}, out
    assert len(re.findall(r"\[dry-run\] ray-head@node-0: srun .* start --head --node-ip-address=", out)) == 1
    workers = re.findall(r"\[dry-run\] ray-worker-(\d)@(node-\d): srun .* start --address=\\<ip-of-node-0\\>:6379", out)
    assert workers == [("1", "node-1")], out
    assert "until 1 alive Ray node(s)" in out and "until 2 alive Ray node(s)" in out  # head first, then all
    # 8 GPUs / TP 4 = 2 judge replicas on the last node, on their own GPU slices and ports below 32768,
    # bound to the node's cluster address.
    judges = re.findall(r"\[dry-run\] judge-(\d)@node-2: srun .*HOST=\\<ip-of-node-2\\>\\ PORT=(\d+).*"
                        r"CUDA_VISIBLE_DEVICES=([\d\\,]+).*vllm\\ serve.*--max-model-len", out)
    assert [(r, p, g.replace("\\", "")) for r, p, g in judges] == [("0", "8000", "0,1,2,3"), ("1", "8001", "4,5,6,7")], out
    assert out.count("health-check: curl") == 2
    urls = '["http://<ip-of-node-2>:8000/v1","http://<ip-of-node-2>:8001/v1"]'
    assert f"RISE_JUDGE_URLS={urls} RISE_JUDGE_MODEL=Qwen/Qwen3-32B" in out
    driver = [line for line in out.splitlines() if line.startswith("[dry-run] driver@node-0:")]
    assert len(driver) == 1
    assert "-m rise_nemo.cli train --config recipes/rise_14b.yaml run.dir=" in driver[0]
    # The trainer is told the allocation's training nodes and exactly the judge that was started.
    assert "nemo.cluster.num_nodes=2 " in driver[0] and "judge.model=Qwen/Qwen3-32B" in driver[0]
    assert driver[0].count("train.steps=7") == 1
    assert "dry run: nothing was started" in out
    # Nothing started, nothing written.
    assert not (REPO_ROOT / "runs" / "rise_14b-dryrun").exists()


def test_dry_run_refuses_a_layout_the_planner_rejects():
    """rise_14b on 4 nodes: 3 training nodes give DP 3, which does not divide the batch of 512."""
    res = dry_run("rise_14b.sh", "--nodes", "4")
    assert res.returncode == 2, res.stdout
    assert "512 sampled rows per step (prompts x samples per prompt) are not a multiple of DP 3" in res.stderr
    assert "rise-nemo plan rejects recipes/rise_14b.yaml on 4 node(s)" in res.stderr
    assert "[dry-run]" not in res.stdout  # refused before any role or command is laid out
    # The user's overrides reach the planner: a batch DP 3 divides makes the same allocation valid.
    res = dry_run("rise_14b.sh", "--nodes", "4", "sampling.prompts_per_step=48", "nemo.policy.train_global_batch_size=768")
    assert res.returncode == 0 and "on 4 node(s): OK: layout valid" in res.stdout, res.stderr
    res = dry_run("rise_14b.sh", "--nodes", "4", env={"RISE_PLAN_CHECK": "0"})
    assert res.returncode == 0 and "planner check skipped (RISE_PLAN_CHECK=0)" in res.stdout, res.stderr
    res = dry_run("rise_tiny_cpu.sh")  # local backend: no parallel layout
    assert res.returncode == 0 and "not a NeMo-RL recipe: no parallel layout to check" in res.stdout, res.stderr


def test_dry_run_judge_server_rule_serves_the_rule_grader_bound_to_the_node():
    res = dry_run("rise_14b.sh", env={"RISE_JUDGE_SERVER": "rule"})
    assert res.returncode == 0, res.stderr
    judges = [line for line in res.stdout.splitlines() if line.startswith("[dry-run] judge-")]
    assert len(judges) == 2 and all("vllm" not in line for line in judges), judges
    for line in judges:
        assert '-m rise_nemo.judges.rule_server --host "$HOST" --port "$PORT"' in line.replace("\\", ""), line
        assert "HOST=<ip-of-node-1> " in line.replace("\\", "")
    res = dry_run("rise_14b.sh", env={"RISE_JUDGE_SERVER": "sglang"})
    assert res.returncode == 2 and "RISE_JUDGE_SERVER must be vllm or rule (got 'sglang')" in res.stderr


def test_the_rule_grader_command_of_the_dry_run_serves_and_passes_the_health_check(tmp_path):
    """The exact judge command the launcher builds for RISE_JUDGE_SERVER=rule, run as is on loopback:
    it binds HOST:PORT and answers the launcher's health check (GET /health, as vLLM does)."""
    import shlex
    import time
    import urllib.request

    port = port_below_ephemeral()
    res = dry_run("rise_tiny_cpu.sh", env={"RISE_JUDGE_SERVER": "rule", "RISE_JUDGE_NODES": "1", "RISE_SHARE_NODES": "1",
                                           "RISE_LOOPBACK": "1", "RISE_JUDGE_PORT": str(port)})
    assert res.returncode == 0, res.stderr
    line = next(line for line in res.stdout.splitlines() if line.startswith("[dry-run] judge-0@"))
    argv = shlex.split(line.split(": ", 1)[1].split(" >> ", 1)[0])
    command = argv[argv.index("bash") + 2]  # srun ... bash -c COMMAND
    assert f"HOST=127.0.0.1 PORT={port} " in command and "vllm" not in command, command
    server = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == f"READY {port}"
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + 30
        while True:
            try:
                with no_proxy.open(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                    assert reply.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        server.kill()
        server.wait()


def test_sbatch_scripts_match_their_recipes_plan():
    """Node count, judge nodes, judge model and TP of each GPU script agree with the recipe's nemo.plan."""
    from rise_nemo.config.loader import load_recipe_tree

    checked = 0
    for script in RECIPE_SCRIPTS:
        res = dry_run(script.name)
        recipe = re.search(r"recipe=(\S+)", res.stdout)[1]
        plan = load_recipe_tree(REPO_ROOT / recipe).get("nemo", {}).get("plan")
        if plan is None:
            continue
        checked += 1
        roles = re.findall(r"node \d+ node-\d+ \S+: (.+)$", res.stdout, re.M)
        assert len(roles) == plan["nodes"], (script.name, roles)
        judge = plan.get("judge") or {"nodes": 0}
        judge_roles = [r for r in roles if r.startswith("judge(")]
        assert len(judge_roles) == judge["nodes"], (script.name, roles)
        if judge["nodes"]:
            assert judge_roles[0] == f"judge({judge['model']} TP={judge['tensor_parallel_size']})", script.name
            assert f"--max-model-len {judge['max_model_len']}" in res.stdout.replace("\\ ", " ")
    assert checked >= 4


@pytest.mark.parametrize("script", [p.name for p in RECIPE_SCRIPTS])
def test_dry_run_of_every_recipe_script_at_its_sbatch_node_count(script):
    res = dry_run(script)
    assert res.returncode == 0, res.stderr
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)", (REPO_ROOT / "slurm" / script).read_text(), re.M)[1])
    assert len(re.findall(r"node \d+ node-\d+ ", res.stdout)) == nodes
    assert len(re.findall(r"^\[dry-run\] driver@node-0: ", res.stdout, re.M)) == 1


def test_dry_run_refuses_an_allocation_without_room_for_training():
    res = dry_run("rise_14b.sh", "--nodes", "1")
    assert res.returncode == 2
    assert "1 node(s) cannot hold training plus 0 teacher and 1 judge node(s)" in res.stderr
    assert "--nodes >= 2" in res.stderr
    res = dry_run("rise_14b.sh", "--bogus")
    assert res.returncode == 2 and "unknown argument '--bogus'" in res.stderr
    res = dry_run("rise_14b.sh", env={"RISE_JUDGE_TP": "four"})
    assert res.returncode == 2 and "RISE_JUDGE_TP must be a non-negative integer (got 'four')" in res.stderr
    res = dry_run("rise_14b.sh", env={"RISE_JUDGE_TP": "16"})
    assert res.returncode == 2 and "judge TP 16 must be between 1 and GPUS_PER_NODE=8" in res.stderr


def test_dry_run_under_sbatch_starts_nothing(slurm, tmp_path):
    # rise_14b.sh on the one-node test cluster: no judge node, GPUs overridden (the node has none);
    # --nodes has no SBATCH_ variable, so it goes on the command line.
    # The planner would refuse rise_14b on one node (it needs a judge node): not what this test is about.
    env = {"RISE_DRY_RUN": "1", "RISE_JUDGE_NODES": "0", "SBATCH_GPUS_PER_NODE": "0", "RISE_PLAN_CHECK": "0",
           "RISE_RUN_DIR": str(tmp_path / "run")}
    job_id = slurm.sbatch("slurm/rise_14b.sh", sbatch_args=("--nodes=1", "-o", str(tmp_path / "out.log")), env=env)
    job = slurm.wait(job_id, timeout=60)
    out = (tmp_path / "out.log").read_text()
    assert (job.state, job.exit_code) == ("COMPLETED", 0), out
    # The script found the checkout from its spool copy (via the job's Command) and printed the plan.
    assert f"node 0 {slurm.node} " in out and ": ray-head+driver" in out
    # Host mode: the driver runs in the batch step itself (an srun client would SIGKILL it on requeue).
    assert f"[dry-run] driver@{slurm.node}: " in out and "(in the batch step)" in out
    assert "--config recipes/rise_14b.yaml" in out
    assert not (tmp_path / "run").exists()


def test_driver_exit_code_is_the_job_exit_code(slurm, tmp_path):
    env = {"RISE_DRIVER_CMD": "echo driver on $(hostname) restart=${SLURM_RESTART_COUNT:-0}; exit 3",
           "RISE_RUN_DIR": str(tmp_path / "run"), "RISE_LOOPBACK": "1"}
    job_id = slurm.sbatch("slurm/rise_tiny_cpu.sh", sbatch_args=("-o", str(tmp_path / "out.log")), env=env)
    job = slurm.wait(job_id, timeout=60)
    assert (job.state, job.exit_code) == ("FAILED", 3), (tmp_path / "out.log").read_text()
    logs = tmp_path / "run" / "logs"
    assert "driver on " in (logs / "driver.log").read_text()
    assert "driver exited with code 3" in (logs / "launcher.log").read_text()


SERVER_CHECK_DRIVER = """
import json, os, signal, sys, time, urllib.request
from pathlib import Path

import ray

no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def healthy(url):
    try:
        return no_proxy.open(url.removesuffix("/v1") + "/health", timeout=2).status == 200
    except OSError:
        return False


def wait(pred, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
nodes = [n for n in ray.nodes() if n["Alive"]]
urls = json.loads(os.environ["RISE_JUDGE_URLS"])
report = {"ray_address": os.environ["RAY_ADDRESS"], "ray_nodes": len(nodes),
          "ray_node_ip": nodes[0]["NodeManagerAddress"], "urls": urls,
          "healthy_at_start": all(healthy(u) for u in urls)}
ray.shutdown()
# Kill the judge server: the launcher must notice and start it again.
pid_file = Path(os.environ["SERVE_DIR"]) / "server.pid"
first_pid = int(pid_file.read_text())
os.kill(first_pid, signal.SIGKILL)
report["down_after_kill"] = wait(lambda: not healthy(urls[0]), 20)
report["healthy_after_restart"] = wait(lambda: healthy(urls[0]), 60)
report["new_pid"] = int(pid_file.read_text()) != first_pid
Path(os.environ["REPORT"]).write_text(json.dumps(report))
"""


@pytest.mark.slow
def test_ray_cluster_and_supervised_judge_server_on_loopback(slurm, tmp_path):
    """Ray head + wait-for-cluster, a judge server health-checked, killed and restarted by the launcher."""
    serve_dir = tmp_path / "serve"
    serve_dir.mkdir()
    (serve_dir / "health").write_text("ok\n")  # http.server answers GET /health with 200
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(SERVER_CHECK_DRIVER))
    python = REPO_ROOT / ".venv" / "bin" / "python"
    judge_port, ray_port = port_below_ephemeral(), port_below_ephemeral() + 1
    ray_ports = {name: str(ray_port + 1 + i) for i, name in enumerate((
        "RAY_NODE_MANAGER_PORT", "RAY_OBJECT_MANAGER_PORT", "RAY_DASHBOARD_AGENT_LISTEN_PORT",
        "RAY_DASHBOARD_AGENT_GRPC_PORT", "RAY_RUNTIME_ENV_AGENT_PORT", "RAY_METRICS_EXPORT_PORT",
        "RAY_DASHBOARD_PORT", "RAY_CLIENT_SERVER_PORT"))}
    env = {
        **ray_ports,
        "RISE_USE_RAY": "1", "RISE_LOOPBACK": "1", "RISE_SHARE_NODES": "1", "RISE_JUDGE_NODES": "1",
        "RISE_JUDGE_PORT": str(judge_port), "RISE_RAY_PORT": str(ray_port), "RAY_INCLUDE_DASHBOARD": "false",
        "RAY_MIN_WORKER_PORT": str(ray_port + 20), "RAY_MAX_WORKER_PORT": str(ray_port + 60),
        "RISE_SERVER_RESTART_DELAY": "1", "RISE_SERVER_TIMEOUT": "60", "RISE_RAY_TIMEOUT": "120",
        "RISE_SERVE_CMD": f'cd {serve_dir} && echo $$ > server.pid && exec {python} -m http.server --bind "$HOST" "$PORT"',
        "SERVE_DIR": str(serve_dir), "REPORT": str(tmp_path / "report.json"),
        "RISE_DRIVER_CMD": f"{python} {driver}", "RISE_RUN_DIR": str(tmp_path / "run"),
    }
    job_id = slurm.sbatch("slurm/rise_tiny_cpu.sh", sbatch_args=("-o", str(tmp_path / "out.log")), env=env)
    job = slurm.wait(job_id, timeout=180)
    logs = tmp_path / "run" / "logs"
    launcher_log = (logs / "launcher.log").read_text() if (logs / "launcher.log").exists() else ""
    assert (job.state, job.exit_code) == ("COMPLETED", 0), (tmp_path / "out.log").read_text() + "\n" + \
        "".join(p.read_text(errors="replace")[-2000:] for p in sorted(logs.glob("*.log")))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ray_address"] == f"127.0.0.1:{ray_port}" and report["ray_nodes"] == 1
    assert report["ray_node_ip"] == "127.0.0.1"
    assert report["urls"] == [f"http://127.0.0.1:{judge_port}/v1"]
    assert report["healthy_at_start"] and report["down_after_kill"]
    assert report["healthy_after_restart"] and report["new_pid"]
    assert "all 1 server(s) healthy" in launcher_log
    assert re.search(r"judge-\S+ on \S+ exited \(rc=\d+\): restart 1/5", launcher_log), launcher_log
    assert "Ray nodes alive: 1/1" in launcher_log
    # Ray's RPC token is per run (shared by every node through the run directory), readable by us only.
    token = logs / "ray_auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64


def test_dry_run_in_container_mode_follows_ray_sub_conventions(tmp_path):
    run_dir = tmp_path / "run"
    res = dry_run("rise_14b.sh", env={"CONTAINER": "/images/nemo-rl.sqsh", "MOUNTS": "/data:/data",
                                      "RISE_RUN_DIR": str(run_dir)})
    assert res.returncode == 0, res.stderr
    steps = [line for line in res.stdout.splitlines() if line.startswith("[dry-run] ") and ": srun " in line]
    assert len(steps) == 5  # 2 judge replicas, Ray head, Ray probe, driver
    mounts = f"--container-mounts=/data:/data\\,{REPO_ROOT}:{REPO_ROOT}\\,{run_dir}:{run_dir}"
    for line in steps:
        assert "--container-image=/images/nemo-rl.sqsh" in line and mounts in line, line
        assert f"--container-workdir={REPO_ROOT}" in line and "--no-container-mount-home" in line
    # The driver runs in the Ray head's container, with the container's python.
    driver = next(line for line in steps if line.startswith("[dry-run] driver@"))
    assert "--container-name=rise-ray-head python -m rise_nemo.cli train" in driver
    assert not run_dir.exists()


@pytest.mark.parametrize("script", [p.name for p in RECIPE_SCRIPTS if p.name != "rise_tiny_cpu.sh"])
def test_driver_command_and_environment_load_with_the_recipe(script, monkeypatch):
    """The overrides and environment the launcher hands the driver are accepted by the config loader and
    point the judge client at the servers it started (real loader, loopback addresses)."""
    import shlex

    from rise_nemo.config import load_config

    res = dry_run(script, env={"RISE_LOOPBACK": "1"})
    assert res.returncode == 0, res.stderr
    env_line = next(line for line in res.stdout.splitlines() if line.startswith("[dry-run] env: RISE_RUN_DIR="))
    urls = json.loads(re.search(r"RISE_JUDGE_URLS=(\[.*?\]) ", env_line)[1])
    text = (REPO_ROOT / "slurm" / script).read_text()
    judge_nodes = int(re.search(r"^RISE_JUDGE_NODES=\$\{RISE_JUDGE_NODES:-(\d+)\}$", text, re.M)[1])
    assert bool(urls) == (judge_nodes > 0), urls  # verifier-rewarded recipes run without a judge node
    assert all(re.fullmatch(r"http://127\.0\.0\.1:80\d\d/v1", u) for u in urls), urls
    driver = next(line for line in res.stdout.splitlines() if line.startswith("[dry-run] driver@"))
    argv = shlex.split(driver.split(": ", 1)[1].rsplit(" >> ", 1)[0])
    recipe, overrides = argv[argv.index("--config") + 1], argv[argv.index("--config") + 2:]
    monkeypatch.setenv("RISE_JUDGE_URLS", json.dumps(urls))
    monkeypatch.setenv("RISE_JUDGE_MODEL", re.search(r"RISE_JUDGE_MODEL=(\S+)", env_line)[1])
    cfg = load_config(REPO_ROOT / recipe, overrides)
    if judge_nodes:
        assert list(cfg.judge.base_urls) == urls
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)", text, re.M)[1])
    assert cfg.nemo.cluster.num_nodes == nodes - judge_nodes  # every node but the judge nodes trains
    assert str(cfg.run.dir).endswith(f"runs/{Path(recipe).stem}-dryrun")


def test_missing_slurm_skips_on_a_laptop_and_fails_in_ci(tmp_path):
    """Without the Slurm binaries on PATH the fixture skips with the reason, unless RISE_REQUIRE_SLURM=1."""
    # tmp_path as PATH: no munged / slurmctld / sbatch there
    laptop, ci = run_as_laptop_and_as_ci(
        "tests/slurm/test_slurm_launcher.py::test_driver_exit_code_is_the_job_exit_code", tmp_path)
    assert laptop.returncode == 0 and "1 skipped" in laptop.stdout, laptop.stdout
    assert "Slurm not installed (missing munged" in laptop.stdout
    assert ci.returncode == 1 and "RISE_REQUIRE_SLURM=1 but Slurm not installed" in ci.stdout, ci.stdout


@pytest.mark.parametrize("script", [p.name for p in RECIPE_SCRIPTS if p.name != "rise_tiny_cpu.sh"])
def test_each_gpu_script_allocation_passes_the_planner(script):
    """`rise-nemo plan RECIPE --nodes N` accepts the recipe at the script's #SBATCH node count."""
    import sys

    text = (REPO_ROOT / "slurm" / script).read_text()
    nodes = re.search(r"^#SBATCH --nodes=(\d+)", text, re.M)[1]
    recipe = re.search(r"^RISE_RECIPE=\$\{RISE_RECIPE:-(\S+)\}$", text, re.M)[1]
    res = subprocess.run([sys.executable, "-m", "rise_nemo.cli", "plan", recipe, "--nodes", nodes],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert res.returncode == 0 and "OK: layout valid" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
