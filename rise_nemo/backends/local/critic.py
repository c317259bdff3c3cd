"""LocalCritic: interfaces.Critic on the local backend (docs/DESIGN.md §7).

A value head (one linear layer, zero-initialised so V starts at 0) on a transformer body of the same
family as the policy: a SEPARATE copy of the policy's body (its weights at creation, i.e. after the warm
start, as PPO implementations initialise the critic from the policy) with its own AdamW optimiser.

Values follow NeMo-RL's right shift: ``values[b, t] = V(input_ids[b, :t])`` is computed from the hidden
state of token t-1, so the value of the state a response token is sampled from sits at that token's
position; ``values[:, 0] = 0`` (the empty state is never an action's state).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import torch

from rise_nemo.backends.local.engine import LocalEngine
from rise_nemo.backends.local.policy import _lengths, load_state, micro_batches, save_state
from rise_nemo.interfaces import LossFn


def transformer_body(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body of a Hugging Face ``*ForCausalLM`` (the module its ``base_model_prefix`` names:
    ``model`` for Qwen / Llama, ``transformer`` for GPT-2), whose output has ``last_hidden_state``."""
    prefix = getattr(model, "base_model_prefix", "") or "model"
    body = getattr(model, prefix, None)
    if not isinstance(body, torch.nn.Module):
        raise TypeError(f"LocalCritic: {type(model).__name__} has no transformer body (.{prefix}) to copy")
    return body


class LocalCritic:
    def __init__(self, engine: LocalEngine, lr: float = 1e-4, grad_clip: float | None = None,
                 micro_batch_size: int | None = None):
        self.engine = engine
        body = transformer_body(engine.model)
        self.body = copy.deepcopy(body).to(engine.device)
        hidden = int(engine.model.config.hidden_size)
        self.head = torch.nn.Linear(hidden, 1).to(device=engine.device, dtype=engine.cfg.torch_dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.lr = lr
        self.grad_clip = engine.cfg.grad_clip if grad_clip is None else grad_clip
        self.micro_batch_size = micro_batch_size or engine.cfg.micro_batch_size
        c = engine.cfg
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=lr, betas=c.betas, eps=c.eps,
                                           weight_decay=c.weight_decay)
        self.train_steps = 0

    def parameters(self):
        return [*self.body.parameters(), *self.head.parameters()]

    def _values(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=ids, use_cache=False).last_hidden_state  # [b, t, H]
        v = self.head(hidden).squeeze(-1).float()  # [b, t]: V(ids[:, :t+1])
        return torch.cat([v.new_zeros(v.shape[0], 1), v[:, :-1]], dim=1)  # right shift: V(ids[:, :t])

    @torch.no_grad()
    def get_values(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """[B, T] fp32 on CPU; 0 at column 0 and at positions >= the row's length."""
        ids = data["input_ids"]
        lengths = _lengths(data)
        b, t = ids.shape
        out = torch.zeros((b, t), dtype=torch.float32)
        self.body.eval()
        c = self.engine.cfg
        for rows, mb in micro_batches({"input_ids": ids, "input_lengths": lengths}, c.logprob_batch_size,
                                      c.sort_by_length, self.engine.device):
            values = self._values(mb["input_ids"])
            out[rows, : values.shape[1]] = values.float().cpu()
        return out * (torch.arange(t)[None, :] < lengths[:, None])

    def train(self, data: Mapping[str, torch.Tensor], loss_fn: LossFn) -> dict[str, float]:
        """One AdamW step; ``loss_fn(values [b, t], micro-batch)`` must be globally normalised."""
        self.body.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        for _, mb in micro_batches(data, self.micro_batch_size, self.engine.cfg.sort_by_length, self.engine.device):
            loss, mb_metrics = loss_fn(self._values(mb["input_ids"]), mb)
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(f"LocalCritic.train: non-finite value loss {float(loss)}")
            loss.backward()
            for k, v in mb_metrics.items():
                metrics[k] = metrics.get(k, 0.0) + float(v)
        params = [p for p in self.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.tensor(0.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.body.eval()
        self.train_steps += 1
        metrics["critic/grad_norm"] = float(norm)
        return metrics

    def state_dict(self) -> dict:
        return {
            "body": {k: v.detach().clone() for k, v in self.body.state_dict().items()},
            "head": {k: v.detach().clone() for k, v in self.head.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "train_steps": self.train_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("body", "head", "optimizer"):
            if key not in state:
                raise KeyError(f"LocalCritic.load_state_dict: checkpoint has no {key!r} entry")
        self.body.load_state_dict(state["body"])
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.train_steps = int(state.get("train_steps", 0))

    def save_checkpoint(self, path: str | Path) -> None:
        """interfaces.Critic hook: ``state_dict()`` as ``<path>/state.pt``."""
        save_state(self.state_dict(), path)

    def load_checkpoint(self, path: str | Path) -> None:
        self.load_state_dict(load_state(path))
