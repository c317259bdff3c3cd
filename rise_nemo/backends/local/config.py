"""The recipe's ``local:`` block: keys, defaults, validation (unknown keys are errors naming the key).

Keys (all optional except that a tokenizer must be known):

  model_path        a local directory holding a Hugging Face causal LM and its tokenizer (``save_pretrained``
                    output, e.g. a downloaded Qwen2.5-0.5B-Instruct), loaded offline with
                    AutoModelForCausalLM / AutoTokenizer (local_files_only); null = build the tiny random
                    Qwen3 model described by ``tiny`` (the embedded tasks only: real text needs a real
                    model, rise_nemo.steps.verifiers.check_real_model). ``model`` is the older name.
  tokenizer         local path of a tokenizer, or ``builtin:persistent_task`` (word-level vocabulary of
                    the demo task, made in code); default: the ``model_path`` directory; required with a
                    tiny model
  chat_template     how chat prompts are rendered: null = the tokenizer's own template (an error naming this
                    key when it has none); ``passthrough`` = the message contents concatenated (NeMo-RL's
                    passthrough template, for base models); any other string = a Jinja chat template
  tiny              dims of the random-init Qwen3 model (used when ``model_path`` is null):
                      hidden_size 64, num_layers 2, num_heads 4, num_kv_heads 2, head_dim 16,
                      intermediate_size 192, max_position_embeddings 512, rope_theta 10000.0
  seed              model init (tiny) and the generator's sampling RNG; default 0
  lr                AdamW learning rate; default 1e-6 (paper)
  betas             AdamW betas; default [0.9, 0.999]
  eps               AdamW eps; default 1e-8
  weight_decay      AdamW weight decay; default 0.0
  grad_clip         max global grad norm (<= 0 disables clipping; the norm is still reported); default 1.0
  micro_batch_size  rows per forward/backward in ``train``; default 16
  sort_by_length    sort a batch's rows by length before splitting it into micro-batches (``train``,
                    ``get_logprobs``, the critic's): less padding per micro-batch; the globally normalised
                    losses are unchanged up to float summation order; default true
  logprob_batch_size rows per forward in ``get_logprobs``; default 32
  generation_batch_size rows (prompt x sample) decoded together by the generator; default 64
  logprob_chunk_size token positions per chunk in core.logprobs; default 256
  compute_entropy   report ``policy/entropy`` (mean over token_mask) from ``train``; default true
  device            auto | cpu | cuda | cuda:N; default auto (one CUDA GPU when present, else CPU)
  dtype             float32 | bfloat16 | float16; default float32
  num_threads       torch.set_num_threads for CPU runs; null leaves torch's default
  attn_implementation  transformers attention backend (sdpa | eager); default sdpa
  decode            the generator's per-token step: ``lean`` = a hand-written step on a static KV cache
                    (rise_nemo.backends.local.lean_decode; same logits) where the model supports it, else the
                    HF forward; ``hf`` = always the HF forward on a DynamicCache; default lean
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

TINY_DEFAULTS: dict[str, float | int] = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "intermediate_size": 192,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
}

DECODE_MODES = ("lean", "hf")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LocalConfigError(ValueError):
    """Invalid ``local:`` block; the message names the key."""


@dataclass
class LocalConfig:
    model_path: str | None = None
    tokenizer: str | None = None
    chat_template: str | None = None
    tiny: dict = field(default_factory=lambda: dict(TINY_DEFAULTS))
    seed: int = 0
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_size: int = 16
    sort_by_length: bool = True
    logprob_batch_size: int = 32
    generation_batch_size: int = 64
    logprob_chunk_size: int = 256
    compute_entropy: bool = True
    device: str = "auto"
    dtype: str = "float32"
    num_threads: int | None = None
    attn_implementation: str = "sdpa"
    decode: str = "lean"

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


def _plain(value):
    """OmegaConf containers -> plain Python, without importing omegaconf when it is not used."""
    if hasattr(value, "_metadata"):  # DictConfig / ListConfig
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _positive_int(key: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LocalConfigError(f"local.{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _number(key: str, value, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LocalConfigError(f"local.{key}: expected a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise LocalConfigError(f"local.{key}: must be >= {minimum}, got {value!r}")
    return float(value)


def check_model_dir(path: str) -> None:
    """``local.model_path`` must be a local directory holding a Hugging Face model (its ``config.json``):
    nothing is downloaded, so a hub name or a wrong path is a one-line error naming the key."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise LocalConfigError(f"local.model_path: {path!r} is not a directory (a local folder holding a Hugging "
                               "Face causal LM and its tokenizer; nothing is downloaded)")
    if not (p / "config.json").is_file():
        raise LocalConfigError(f"local.model_path: {path!r} holds no config.json (expected the output of "
                               "save_pretrained or a downloaded model snapshot)")


def parse_local_config(cfg: Mapping | None) -> LocalConfig:
    """Validate a ``local:`` mapping into a LocalConfig; errors name the offending key."""
    raw = dict(_plain(cfg) or {})
    if "model" in raw:  # the key's older name
        if raw.get("model_path") is not None and raw["model"] is not None and raw["model"] != raw["model_path"]:
            raise LocalConfigError("local.model: the older name of local.model_path; set only local.model_path")
        legacy = raw.pop("model")
        if raw.get("model_path") is None:
            raw["model_path"] = legacy
    known = {f.name for f in fields(LocalConfig)}
    for key in raw:
        if key not in known:
            raise LocalConfigError(f"local.{key}: unknown key; known keys: {sorted(known)}")
    out = LocalConfig()
    if raw.get("model_path") is not None:
        out.model_path = str(raw["model_path"])
        check_model_dir(out.model_path)
    if raw.get("tokenizer") is not None:
        out.tokenizer = str(raw["tokenizer"])
    if raw.get("chat_template") is not None:
        if not isinstance(raw["chat_template"], str) or not raw["chat_template"].strip():
            raise LocalConfigError(f"local.chat_template: expected null, 'passthrough' or a Jinja template, got "
                                   f"{raw['chat_template']!r}")
        out.chat_template = raw["chat_template"]
    tiny = dict(_plain(raw.get("tiny")) or {})
    for key, value in tiny.items():
        if key not in TINY_DEFAULTS:
            raise LocalConfigError(f"local.tiny.{key}: unknown key; known keys: {sorted(TINY_DEFAULTS)}")
        if key == "rope_theta":
            out.tiny[key] = _number(f"tiny.{key}", value, minimum=1.0)
        else:
            out.tiny[key] = _positive_int(f"tiny.{key}", value)
    if out.tiny["num_heads"] % out.tiny["num_kv_heads"]:
        raise LocalConfigError("local.tiny.num_kv_heads: must divide tiny.num_heads")
    if "seed" in raw:
        out.seed = _positive_int("seed", raw["seed"], minimum=0)
    for key in ("lr", "eps", "weight_decay", "grad_clip"):
        if key in raw:
            setattr(out, key, _number(key, raw[key], minimum=0.0 if key != "grad_clip" else None))
    if "betas" in raw:
        betas = _plain(raw["betas"])
        if not isinstance(betas, list | tuple) or len(betas) != 2:
            raise LocalConfigError(f"local.betas: expected two numbers, got {betas!r}")
        out.betas = (_number("betas[0]", betas[0], 0.0), _number("betas[1]", betas[1], 0.0))
    for key in ("micro_batch_size", "logprob_batch_size", "generation_batch_size", "logprob_chunk_size"):
        if key in raw:
            setattr(out, key, _positive_int(key, raw[key]))
    for key in ("compute_entropy", "sort_by_length"):
        if key in raw:
            if not isinstance(raw[key], bool):
                raise LocalConfigError(f"local.{key}: expected true/false, got {raw[key]!r}")
            setattr(out, key, raw[key])
    if "device" in raw:
        dev = str(raw["device"])
        if dev != "auto":
            try:
                torch.device(dev)
            except RuntimeError as exc:
                raise LocalConfigError(f"local.device: invalid device {dev!r}") from exc
        out.device = dev
    if "dtype" in raw:
        if raw["dtype"] not in _DTYPES:
            raise LocalConfigError(f"local.dtype: expected one of {sorted(_DTYPES)}, got {raw['dtype']!r}")
        out.dtype = raw["dtype"]
    if raw.get("num_threads") is not None:
        out.num_threads = _positive_int("num_threads", raw["num_threads"])
    if "attn_implementation" in raw:
        out.attn_implementation = str(raw["attn_implementation"])
    if "decode" in raw:
        if raw["decode"] not in DECODE_MODES:
            raise LocalConfigError(f"local.decode: expected one of {list(DECODE_MODES)}, got {raw['decode']!r}")
        out.decode = raw["decode"]
    if out.model_path is None and out.tokenizer is None:
        raise LocalConfigError(
            "local.tokenizer: a tiny model (local.model_path is null) needs a tokenizer: a local path or "
            "'builtin:persistent_task'"
        )
    return out
