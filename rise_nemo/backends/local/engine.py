"""The model, tokenizer, device and sampling RNG that LocalPolicy and LocalGenerator share.

One process holds one causal LM; the policy trains it in place and the generator samples from the same
weights, so a generation after a train call always sees the updated policy (no weight sync needed).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from pathlib import Path

import torch

from rise_nemo.backends.local.config import LocalConfig
from rise_nemo.backends.local.lean_decode import lean_support
from rise_nemo.backends.local.tokenizer import builtin_tokenizer

log = logging.getLogger("rise_nemo.local")

PASSTHROUGH = "passthrough"
# NeMo-RL's passthrough template (nemo_rl/data/chat_templates.py): the message contents, concatenated.
PASSTHROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _load_tokenizer(cfg: LocalConfig):
    spec = cfg.tokenizer or cfg.model_path
    if spec is None:  # parse_local_config already rejects this; kept for direct callers
        raise ValueError("local.tokenizer: no tokenizer given")
    if spec.startswith("builtin:"):
        tok = builtin_tokenizer(spec.split(":", 1)[1])
    else:
        if not Path(spec).exists():
            key = "tokenizer" if cfg.tokenizer else "model_path"
            raise FileNotFoundError(f"local.{key}: tokenizer path {spec!r} does not exist (no downloads here)")
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    if cfg.chat_template is not None:  # local.chat_template replaces the tokenizer's own
        tok.chat_template = PASSTHROUGH_TEMPLATE if cfg.chat_template == PASSTHROUGH else cfg.chat_template
    return tok


def _tiny_qwen3(cfg: LocalConfig, tokenizer):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    t = cfg.tiny
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=t["hidden_size"],
        num_hidden_layers=t["num_layers"],
        num_attention_heads=t["num_heads"],
        num_key_value_heads=t["num_kv_heads"],
        head_dim=t["head_dim"],
        intermediate_size=t["intermediate_size"],
        max_position_embeddings=t["max_position_embeddings"],
        rope_theta=t["rope_theta"],
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        attn_implementation=cfg.attn_implementation,
    )
    # Seeded init without disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return Qwen3ForCausalLM(config)


def _load_model(cfg: LocalConfig):
    """The pretrained causal LM of ``local.model_path``, offline, in ``local.dtype``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        cfg.model_path, local_files_only=True, dtype=cfg.torch_dtype, attn_implementation=cfg.attn_implementation
    )


class LocalEngine:
    """Shared state: ``model``, ``tokenizer``, ``device``, ``rng`` (torch.Generator on the device)."""

    def __init__(self, cfg: LocalConfig):
        self.cfg = cfg
        if cfg.num_threads is not None:
            torch.set_num_threads(cfg.num_threads)
        self.device = cfg.resolved_device()
        if cfg.model_path is not None and not Path(cfg.model_path).exists():
            raise FileNotFoundError(f"local.model_path: path {cfg.model_path!r} does not exist (no downloads here)")
        self.tokenizer = _load_tokenizer(cfg)
        if self.tokenizer.pad_token_id is None:  # many causal LMs ship without one; any id works (masked)
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = _tiny_qwen3(cfg, self.tokenizer) if cfg.model_path is None else _load_model(cfg)
        self.model = model.to(device=self.device, dtype=cfg.torch_dtype)
        self.model.eval()
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(cfg.seed)
        self.stop_token_ids = self._stop_ids()
        # transformers 5 renamed the cache argument (past_key_values -> cache); accept both.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.prepared_masks = self._accepts_prepared_mask()
        # The generator's decode step (local.decode): lean where lean_decode supports the model, else HF's.
        self.lean_unsupported = lean_support(self.model) if cfg.decode == "lean" else "local.decode is hf"
        self.lean_decode = self.lean_unsupported is None
        if cfg.decode == "lean" and not self.lean_decode:
            log.info("local.decode: lean decode unsupported for this model (%s); using the HF forward",
                     self.lean_unsupported)

    def _accepts_prepared_mask(self) -> bool:
        """Whether a decode step may pass its attention mask as the model's own prepared 4D boolean mask
        [B, 1, q, kv] (True = attend): transformers >= 5 returns such a mask untouched (masking_utils), and it is
        what that version builds from a 2D mask for SDPA attention with only full-attention layers (a sliding-
        window layer or another attention backend needs a different mask)."""
        import transformers

        config = self.model.config
        layer_types = getattr(config, "layer_types", None) or ["full_attention"]
        return (int(transformers.__version__.split(".")[0]) >= 5
                and getattr(config, "_attn_implementation", None) == "sdpa"
                and not getattr(config, "use_sliding_window", False)
                and all(t == "full_attention" for t in layer_types))

    def _stop_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return sorted(i for i in ids if i is not None)

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None) -> torch.Tensor:
        """Logits [B, T, V] (with ``cache`` updated in place when given)."""
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        if cache is not None:
            kwargs[self._cache_kw] = cache
            kwargs["use_cache"] = True
        else:
            kwargs["use_cache"] = False
        return self.model(**kwargs).logits

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, n: int):
        """The prompt pass of a left-padded decode batch, shared by both decode steps (local.decode):
        ``(last logits [B, V], the filled DynamicCache, positions [B, n] of the n tokens to generate)``."""
        cache = self.new_cache()
        logits = self.forward(ids, mask, pos, cache)[:, -1]
        positions = pos[:, -1:] + torch.arange(1, n + 1, device=ids.device)  # position of generated token i
        return logits, cache, positions

    def new_cache(self):
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # transformers 4.x: no config argument
            return DynamicCache()

    def encode_prompt(self, messages) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            spec = self.cfg.tokenizer or self.cfg.model_path
            raise ValueError(
                f"local.tokenizer: the tokenizer at {spec!r} has no chat template, so chat prompts cannot be "
                "rendered; use an instruct model's tokenizer, or set local.chat_template (passthrough for a base "
                "model, or a Jinja template)"
            )
        out = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
        )
        if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
            out = out["input_ids"]
        return [int(i) for i in out]

    def encode_response(self, text: str) -> list[int]:
        """Token ids of an assistant response followed by the EOS (end-of-turn) token, as generated."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [int(i) for i in ids] + [int(self.tokenizer.eos_token_id)]

    def fingerprint(self) -> str:
        """Hash of the model architecture, tokenizer vocabulary and initial-weight recipe.

        Used as part of cache keys (warm start): two engines with the same fingerprint start from the
        same weights and tokenize identically. Computed once (a 150k vocabulary takes a moment).
        """
        if getattr(self, "_fingerprint", None) is not None:
            return self._fingerprint
        tiny = self.cfg.model_path is None
        spec = {  # "model": the key's older name, kept so that existing warm-start caches stay valid
            "model": self.cfg.model_path,
            "tiny": self.cfg.tiny if tiny else None,
            "seed": self.cfg.seed if tiny else None,
            "dtype": self.cfg.dtype,
            "config": self.model.config.to_dict() if tiny else None,
            "vocab": sorted(self.tokenizer.get_vocab().items()),
            "chat_template": self.tokenizer.chat_template,
        }
        blob = json.dumps(spec, sort_keys=True, default=str).encode()
        self._fingerprint = hashlib.sha256(blob).hexdigest()[:16]
        return self._fingerprint
