"""The CPU harness itself (tests/nemo/cpu_harness.py) must not hide defects: with its patches applied, code that
builds a model on the meta device (transformers' loading, ``with torch.device("meta")``) still does, and a
weight missing from a checkpoint (the value model's head) is initialised, not left as uninitialised memory.

Each check runs ``patch_worker()`` in a fresh interpreter (its patches are process-wide and permanent). Needs
torch and transformers only: it runs in ``make test`` and ``make test-nemo``.

The harness used to wrap torch's factory functions before torch had cached the set of factories that a
``torch.device`` context redirects (``torch.utils._device._device_constructors``): the set then held the
wrappers, the real factories escaped the context, ``torch.empty`` under ``torch.device("meta")`` allocated real
CPU memory, and the DTensor v2 value worker's head (absent from a causal-LM checkpoint) kept whatever that
memory held (values around 1e34 were seen).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _in_harness(code: str, tmp_path: Path) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(HERE)!r})
        import cpu_harness
        cpu_harness.patch_worker()
        out = {{}}
    """) + textwrap.dedent(code) + "\nprint(json.dumps(out))\n")
    env = {**os.environ, "RISE_NEMO_CPU_HARNESS": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RISE_NEMO_CPU_DRIVER", None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_meta_device_context_survives_the_factory_patches(tmp_path):
    out = _in_harness("""
        import torch
        with torch.device("meta"):
            out["empty"] = str(torch.empty(3).device)
            out["zeros"] = str(torch.zeros(2, 2).device)
            out["linear"] = str(torch.nn.Linear(4, 4).weight.device)
        out["cuda_to_cpu"] = str(torch.zeros(2, device="cuda").device)  # the harness's own remap still works
        out["index_to_cpu"] = str(torch.ones(2).to(0).device)  # Automodel's model.to(current_device())
    """, tmp_path)
    assert out == {"empty": "meta", "zeros": "meta", "linear": "meta", "cuda_to_cpu": "cpu", "index_to_cpu": "cpu"}


def test_a_head_missing_from_the_checkpoint_is_initialised(tmp_path):
    """What the DTensor v2 value worker does: a token-classification model with one label loaded from a causal
    LM's checkpoint, so ``score`` is not in the checkpoint and transformers initialises it
    (initializer_range 0.02), under the harness exactly as without it."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "tests" / "judges"))
    from tiny_qwen3 import build

    model_dir = build(tmp_path / "tiny", vocab_size=300)
    out = _in_harness(f"""
        import torch
        from transformers import AutoModelForTokenClassification
        model = AutoModelForTokenClassification.from_pretrained({str(model_dir)!r}, num_labels=1)
        w = model.score.weight.detach()
        out["finite"] = bool(torch.isfinite(w).all())
        out["std"] = float(w.std())
        out["max_abs"] = float(w.abs().max())
    """, tmp_path)
    assert out["finite"] and out["max_abs"] < 1.0, out
    assert 0.005 < out["std"] < 0.05, out  # normal(0, 0.02), not leftover memory
