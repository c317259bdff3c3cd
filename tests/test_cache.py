"""One cache location: $RISE_NEMO_CACHE, else ~/.cache/rise_nemo — never the cwd; one build
of a warm-start entry when two processes want it at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rise_nemo.cache import cache_dir
from rise_nemo.config import config_from_dict
from rise_nemo.loop.data import warm_start_cache_dir


def test_cache_dir_honours_the_environment_and_defaults_to_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RISE_NEMO_CACHE", str(tmp_path / "c"))
    assert cache_dir("warm_start") == (tmp_path / "c" / "warm_start").resolve()
    monkeypatch.delenv("RISE_NEMO_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == (tmp_path / "home" / ".cache" / "rise_nemo").resolve()


def test_the_warm_start_cache_does_not_depend_on_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("RISE_NEMO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cfg = config_from_dict({})
    places = set()
    for cwd in (tmp_path / "a", tmp_path / "b"):
        cwd.mkdir()
        monkeypatch.chdir(cwd)
        places.add(warm_start_cache_dir(cfg))
    assert places == {(tmp_path / "xdg" / "rise_nemo" / "warm_start").resolve()}
    assert warm_start_cache_dir(config_from_dict({"data": {"warm_start_cache": None}})) is None
    assert warm_start_cache_dir(config_from_dict({"data": {"warm_start_cache": "x/y"}})) == Path("x/y")


CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import tiny_task
import rise_nemo.tasks.sft as sft
from rise_nemo.backends import build_backend
from rise_nemo.config import config_from_dict
from rise_nemo.loop.data import warm_start_policy

tmp, name = Path(sys.argv[1]), sys.argv[2]
real = sft.sft_phase

def building(*args, **kwargs):  # a build started: say so, and go on only when the test says
    (tmp / f"building_{name}").touch()
    deadline = time.monotonic() + 600
    while not (tmp / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("the test never said go")
        time.sleep(0.05)
    return real(*args, **kwargs)

sft.sft_phase = building
recipe = tiny_task.chain_recipe("grpo")
recipe["data"]["warm_start_cache"] = str(tmp / "cache")
cfg = config_from_dict(recipe)
policy, generator = build_backend(cfg)
stats = warm_start_policy(cfg, policy, generator, progress=False)
print(json.dumps({"cached": stats["cached"], "cache_path": stats["cache_path"]}))
"""


def test_two_processes_started_together_build_a_warm_start_once(tmp_path):
    """Two commands warm-starting the same recipe at once: the first builds the cache entry while the second
    waits on its lock (and says so), then loads it. Without the lock both would build: each is held inside its
    build until both have either started building or are waiting, so the outcome does not depend on timing."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    orchestration_tests = str(Path(__file__).resolve().parent / "orchestration")
    procs = {}
    for name in ("a", "b"):
        procs[name] = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), name, orchestration_tests],
            stdout=open(tmp_path / f"out_{name}", "w"), stderr=open(tmp_path / f"err_{name}", "w"),
            env={**os.environ, "OMP_NUM_THREADS": "1"})

    def events() -> int:
        building = len(list(tmp_path.glob("building_*")))
        waiting = sum("waiting for another process" in (tmp_path / f"err_{n}").read_text() for n in procs)
        return building + waiting

    deadline = time.monotonic() + 600
    while events() < 2 and all(p.poll() is None for p in procs.values()):
        assert time.monotonic() < deadline, "neither both building nor one waiting after 600 s"
        time.sleep(0.1)
    (tmp_path / "go").touch()
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (tmp_path / f"err_{name}").read_text()[-3000:]
    results = {n: json.loads((tmp_path / f"out_{n}").read_text().splitlines()[-1]) for n in procs}
    assert sorted(r["cached"] for r in results.values()) == [False, True], results
    assert len({r["cache_path"] for r in results.values()}) == 1
    assert len(list(tmp_path.glob("building_*"))) == 1
    waited = [n for n in procs if "waiting for another process" in (tmp_path / f"err_{n}").read_text()]
    assert waited == [n for n, r in results.items() if r["cached"]], waited
