"""A tiny rubric task for orchestration tests: word-level vocabulary, rule-judge criteria, no downloads.

The responses of a random-init tiny model are random words from the vocabulary, so keyword criteria are
met in a fraction of samples: rewards vary inside groups, hints (which only append words) are sometimes
"followed" by chance, and every stage of the loop gets real, non-degenerate data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rise_nemo.core.prompts import GUIDANCE_TEMPLATES, render_scaffold
from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricPrompt

TOPICS = ("river", "forest", "desert", "harbor", "valley", "meadow", "glacier", "canyon", "island")
WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sun", "moon", "star")


def make_rubric() -> Rubric:
    return Rubric((
        Criterion("Mentions alpha", 3.0, ("persistent",), MachineCheck("contains", "alpha")),
        Criterion("Mentions beta", 2.0, (), MachineCheck("contains", "beta")),
        Criterion("Says gamma", -1.0, (), MachineCheck("contains", "gamma")),
        Criterion("Uses at least three words", 1.0, (), MachineCheck("min_words", "3")),
    ))


def make_prompts(n: int, offset: int = 0) -> list[RubricPrompt]:
    rubric = make_rubric()
    out = []
    for i in range(n):
        topic = TOPICS[(i + offset) % len(TOPICS)]
        out.append(RubricPrompt(prompt_id=f"tiny-{i + offset}", messages=({"role": "user", "content": f"describe the {topic}"},),
                                rubric=rubric))
    return out


def corpus() -> list[str]:
    rubric = make_rubric()
    texts = [f"describe the {t}" for t in TOPICS] + list(WORDS)
    texts += [t.replace("{hint}", c.text) for t in GUIDANCE_TEMPLATES for c in rubric.criteria]
    texts += ["avoid the following", render_scaffold(rubric.criteria)]
    return texts


def build_tokenizer(path: Path) -> Path:
    from rise_nemo.backends.local.tokenizer import build_word_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    build_word_tokenizer(corpus()).save_pretrained(str(path))
    return path


def recipe(tokenizer_dir: Path, run_dir: Path, method: str = "rise", **over: Any) -> dict[str, Any]:
    """An in-memory recipe for the tiny task (validated with config_from_dict)."""
    return {
        "run": {"name": f"tiny-{method}", "dir": str(run_dir), "seed": 3},
        "method": method,
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
        "rise": {"lambda_guide": 0.2, "schedule": {"mode": "fixed", "switch_step": 3}},
        "data": {"source": "persistent"},  # prompts are passed to the Trainer directly
        "judge": {"type": "rule"},
        "train": {"steps": 4, "checkpoint_every": 2, "progress": False, "keep_checkpoints": 0},
        "eval": {"every": 2, "samples_per_prompt": 8, "at_start": True},
        "local": {
            "tokenizer": str(tokenizer_dir), "seed": 0, "lr": 1e-3, "num_threads": 1,
            "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                     "intermediate_size": 64},
        },
        **over,
    }


def write_jsonl(path: Path, prompts: list[RubricPrompt]) -> Path:
    """The prompts in rise_nemo.data.loaders' ``rise`` format (with machine checks), for CLI runs."""
    import json

    with open(path, "w") as fh:
        for p in prompts:
            fh.write(json.dumps({
                "prompt_id": p.prompt_id, "messages": [dict(m) for m in p.messages],
                "rubric": [{"criterion": c.text, "points": c.weight, "tags": list(c.tags),
                            "check": {"kind": c.check.kind, "value": c.check.value}} for c in p.rubric.criteria],
            }) + "\n")
    return path


def write_recipe(dir_: Path, tokenizer_dir: Path, run_dir: Path, method: str = "rise", **over: Any) -> Path:
    """A recipe file for `rise-nemo train` on the tiny task (data as JSONL files next to it)."""
    import yaml

    dir_.mkdir(parents=True, exist_ok=True)
    tree = recipe(tokenizer_dir, run_dir, method, **over)
    tree["data"] = {"source": "jsonl", "train_path": str(write_jsonl(dir_ / "train.jsonl", make_prompts(6))),
                    "eval_path": str(write_jsonl(dir_ / "eval.jsonl", make_prompts(3, 6)))}
    path = dir_ / f"tiny_{method}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


CHAIN_TINY = {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "intermediate_size": 64}


def chain_recipe(method: str, run_dir: Path | None = None, group_size: int = 4, max_new_tokens: int = 12,
                 steps: int = 3, **blocks: Any) -> dict[str, Any]:
    """A tiny recipe of the embedded reasoning task (3 levels, 3 warm-start steps, uncached): reasoning
    method tests. ``blocks`` add top-level blocks (e.g. ``exprl={...}``); RRL cuts states at the task's step
    marker, as recipes/rrl_chain_tiny_cpu.yaml does (the task's text has no line breaks)."""
    if method == "rrl":
        blocks["rrl"] = {"granularity": "step", **blocks.get("rrl", {})}
    return {
        "run": {"name": method, "seed": 1, **({"dir": str(run_dir)} if run_dir is not None else {})},
        "method": method,
        "sampling": {"prompts_per_step": 2, "group_size": group_size, "max_new_tokens": max_new_tokens},
        "data": {"source": "chain_arithmetic", "warm_start_cache": None,
                 "task": {"max_steps": 3, "train_per_level": 4, "heldout_per_level": 2, "train_levels": [2, 3]},
                 "warm_start": {"steps": 3, "batch_size": 4}},
        "train": {"steps": steps, "checkpoint_every": 1, "progress": False, "keep_checkpoints": 0},
        "eval": {"every": 2, "samples_per_prompt": 2},
        "local": {"tokenizer": "builtin:reasoning_task", "lr": 1e-3, "tiny": CHAIN_TINY, "num_threads": 1},
        **blocks,
    }
