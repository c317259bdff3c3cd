"""slurm/launch.sh's ports against the one port table (rise_nemo/ports.py): every port variable of the script is in
the table with the script's default, nothing a node binds overlaps anything else at 8 GPUs per node, and
docs/slurm.md prints the table. (NeMo-RL's own constants against the table's NeMo-RL rows: tests/nemo.)

The Ray worker range used to be 20000-20512, across vLLM's rendezvous ports (20001 + 100 per engine): with 8
engines on a node a Ray worker could take an engine's port first, and that engine failed to start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rise_nemo import ports

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "slurm" / "launch.sh"


def script_defaults() -> dict[str, int]:
    """``NAME=${NAME:-1234}`` lines of launch.sh whose NAME ends in _PORT: variable -> default."""
    pattern = re.compile(r"^([A-Z_]*PORT)=\$\{\1:-(\d+)\}", re.M)
    return {name: int(value) for name, value in pattern.findall(LAUNCH.read_text())}


def rows_set_by_script(defaults: dict[str, int]) -> list[ports.PortUse]:
    """The table, with each launch.sh-set row at the script's default."""
    out = []
    for use in ports.table():
        names = [n.strip() for n in use.setting.split("/")]
        if not all(n in defaults for n in names):
            out.append(use)
            continue
        low = defaults[names[0]]
        high = defaults[names[1]] if len(names) == 2 else low + (use.high - use.low)
        out.append(ports.PortUse(use.name, low, high, use.who, use.setting, use.ephemeral))
    return out


def test_every_port_variable_of_the_launcher_is_in_the_table():
    defaults = script_defaults()
    assert len(defaults) >= 13, defaults  # the regex still reads the script
    in_table = {n.strip() for u in ports.table() for n in u.setting.split("/")}
    assert sorted(set(defaults) - in_table) == []


def test_the_launcher_defaults_are_the_tables():
    defaults = script_defaults()
    assert rows_set_by_script(defaults) == list(ports.table())


@pytest.mark.parametrize("gpus_per_node", [1, 4, 8])
def test_no_two_uses_of_a_node_overlap(gpus_per_node):
    """At the script's defaults, with one vLLM engine and one judge/teacher replica per GPU."""
    uses = []
    for use in rows_set_by_script(script_defaults()):
        if use.name == ports.vllm_rendezvous().name:
            use = ports.vllm_rendezvous(gpus_per_node)
        elif use.setting in ("RISE_JUDGE_PORT", "RISE_TEACHER_PORT"):
            use = ports.server_replicas(use.name, use.low, use.setting, gpus_per_node)
        uses.append(use)
    assert [(str(a), str(b)) for a, b in ports.overlaps(uses)] == []


def test_docs_print_the_table():
    assert ports.markdown() in (ROOT / "docs" / "slurm.md").read_text()
