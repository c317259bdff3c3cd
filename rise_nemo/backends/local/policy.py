"""LocalPolicy: token log-probs and AdamW training of the shared HF causal LM (interfaces.Policy).

Batches follow rise_nemo.interfaces: ``input_ids`` [B, T] right-padded, ``input_lengths`` [B], per-token
tensors [B, T] aligned with input_ids, per-sample columns [B]. Right padding needs no attention mask: a
causal model never lets a real token attend to a later pad, so real positions are exact.

``train(data, loss_fn)`` splits the batch into micro-batches of ``local.micro_batch_size`` rows (rows sorted
by length first, ``local.sort_by_length``, so each micro-batch is trimmed to a similar width and carries little
padding), runs ``loss_fn(logprobs, micro_batch)`` and back-propagates; since losses are globally normalised
(interfaces.LossFn), the micro-batch losses and gradients simply add up, in any grouping of the rows (only the
float summation order changes). Then one clipped AdamW step. Returned metrics: the loss_fn metrics summed
over micro-batches, ``loss`` (summed loss, unless the loss_fn reports its own), ``grad_norm`` (before
clipping), and ``policy/entropy_exact`` (mean full next-token entropy over ``token_mask`` on natural,
unmasked rows, when ``local.compute_entropy``, computed inside the training forward on those response
positions only; the loss's own ``policy/entropy`` is a sampled-token estimate and is left untouched).

Old log-probs from the training forward (``LocalPolicy.fills_prev_logprobs``): ``train`` takes exactly ONE
optimiser step per call, after every micro-batch's forward and backward, so every forward runs on the weights
that sampled the batch. When the batch has no ``prev_logprobs`` and the loss reads them, each micro-batch's
are its own forward's detached log-probs: bit for bit what ``get_logprobs`` returns for the same rows in the
same micro-batch layout (tests/local/test_train_forward_logprobs.py), so the PPO ratio's denominator costs no
second forward. The one exception is a model with active dropout: its training forward is not the eval-mode
forward, so ``train`` then calls ``get_logprobs`` itself first. A caller whose other code needs the old
log-probs BEFORE the update (a metric, an advantage) still calls ``get_logprobs`` and passes them in.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import torch

from rise_nemo.backends.local.engine import LocalEngine
from rise_nemo.core.logprobs import masked_token_entropy, token_logprobs
from rise_nemo.core.losses import loss_needs_prev_logprobs, loss_needs_reference_logprobs
from rise_nemo.interfaces import KIND_NATURAL, LossFn


def _lengths(data: Mapping[str, torch.Tensor]) -> torch.Tensor:
    ids = data["input_ids"]
    if "input_lengths" in data:
        return torch.as_tensor(data["input_lengths"]).long().cpu()
    return torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long)


def select_rows(data: Mapping[str, torch.Tensor], rows: torch.Tensor, width: int) -> dict:
    """Rows ``rows`` (index tensor) of every per-sample/per-token tensor, per-token ones cut to ``width`` columns.

    A tensor is per-sample if its first dim is B and per-token if its first two dims are (B, T); anything
    else (scalars, non-tensors) is passed through unchanged.
    """
    b, t = data["input_ids"].shape[:2]
    contiguous = rows.numel() > 0 and bool((rows == torch.arange(int(rows[0]), int(rows[0]) + rows.numel())).all())
    out = {}
    for key, value in data.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == b:
            value = value[int(rows[0]) : int(rows[0]) + rows.numel()] if contiguous else value[rows.to(value.device)]
            if value.dim() >= 2 and value.shape[1] == t:
                value = value[:, :width]
        out[key] = value
    return out


def micro_batch_rows(lengths: torch.Tensor, size: int, sort_by_length: bool) -> list[torch.Tensor]:
    """Row indices of each micro-batch of ``size`` rows: in batch order, or (``sort_by_length``) longest rows
    first (a stable sort: equal lengths keep their order), so rows of similar length share a micro-batch and
    trimming it to its longest row leaves little padding. Longest first: the peak memory comes at once."""
    order = torch.argsort(lengths, descending=True, stable=True) if sort_by_length else torch.arange(len(lengths))
    return [order[s : s + size] for s in range(0, len(lengths), size)]


def micro_batches(data: Mapping[str, torch.Tensor], size: int, sort_by_length: bool, device=None):
    """(rows, micro-batch) pairs over ``data`` (micro_batch_rows), each trimmed to its longest row and moved to
    ``device``; the one micro-batch layout of the local policy's and critic's forwards."""
    lengths = _lengths(data)
    for rows in micro_batch_rows(lengths, size, sort_by_length):
        mb = select_rows(data, rows, int(lengths[rows].max()))
        if device is not None:
            mb = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in mb.items()}
        yield rows, mb


STATE_FILE = "state.pt"  # what a local model's save_checkpoint(dir) writes into its directory


def save_state(state: dict, path: str | Path) -> None:
    """``torch.save(state)`` as ``<path>/state.pt`` (the local backend's checkpoint format)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / STATE_FILE)


def load_state(path: str | Path) -> dict:
    """What ``save_state(state, path)`` wrote. Checkpoints written before the checkpoint hooks held the
    same state as a file beside the directory (``step_N/policy.pt``, ``step_N/critic.pt``): read those too."""
    path = Path(path)
    for candidate in (path / STATE_FILE, path.with_name(path.name + ".pt")):
        if candidate.is_file():
            return torch.load(candidate, map_location="cpu", weights_only=False)
    raise FileNotFoundError(f"{path}: no saved state ({STATE_FILE} is missing)")


def _natural_token_mask(mb: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """token_mask [b, t] as bool, restricted to natural, unmasked rows (when ``kind`` / ``sample_mask`` exist)."""
    tm = mb["token_mask"].bool()
    rows = torch.ones(tm.shape[0], dtype=torch.bool, device=tm.device)
    if "sample_mask" in mb:
        rows &= mb["sample_mask"].bool()
    if "kind" in mb:
        rows &= mb["kind"] == KIND_NATURAL
    return tm & rows[:, None]


def has_active_dropout(model: torch.nn.Module) -> bool:
    """Whether ``model.train()`` changes its forward: a Dropout module with p > 0, or a config dropout rate
    > 0 (HF attention applies ``config.attention_dropout`` functionally, without a module)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    values = config.to_dict() if hasattr(config, "to_dict") else {}
    return any("dropout" in k and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
               for k, v in values.items())


class LocalPolicy:
    """interfaces.Policy on the shared LocalEngine, with its own AdamW optimiser."""

    # train() takes a batch's missing prev_logprobs from its own forward (one optimiser step per call; see the
    # module docstring): a caller that needs them only for the loss may skip get_logprobs.
    fills_prev_logprobs = True

    def __init__(self, engine: LocalEngine):
        self.engine = engine
        self.model = engine.model
        self.tokenizer = engine.tokenizer
        self.train_steps = 0
        self.optimizer = self._new_optimizer(engine.cfg.lr)
        # Frozen reference weights for a KL term: taken when the first loss that needs them arrives, i.e.
        # the policy RL starts from (after any warm start); checkpointed with the policy.
        self.reference: dict[str, torch.Tensor] | None = None

    def _new_optimizer(self, lr: float) -> torch.optim.AdamW:
        c = self.engine.cfg
        return torch.optim.AdamW(
            self.model.parameters(), lr=lr, betas=c.betas, eps=c.eps, weight_decay=c.weight_decay
        )

    def reset_optimizer(self, lr: float | None = None) -> None:
        """Fresh AdamW state (e.g. after a supervised warm start); ``lr`` defaults to ``local.lr``."""
        self.optimizer = self._new_optimizer(self.engine.cfg.lr if lr is None else lr)

    def begin_stage(self, checkpoint: str | Path | None = None) -> None:
        """A new training stage (a pipeline's next stage): from the model weights saved in ``checkpoint``
        (a policy checkpoint directory, as ``save_checkpoint`` writes it), else from the current ones; a fresh
        optimiser at ``local.lr``, no KL reference yet (the next KL term snapshots these weights), step
        counter 0. FileNotFoundError when ``checkpoint`` holds no saved state."""
        if checkpoint is not None:
            self.model.load_state_dict(load_state(checkpoint)["model"])
        self.reset_optimizer()
        self.reference = None
        self.train_steps = 0

    # ---- log-probs -------------------------------------------------------------------------------

    def _logits_and_logprobs(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.engine.forward(ids)  # [b, t, V]
        return logits, token_logprobs(logits, ids, self.engine.cfg.logprob_chunk_size)  # [b, t]

    @torch.no_grad()
    def get_logprobs(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """[B, T] fp32 on CPU, aligned with input_ids (col 0 = 0, positions >= length = 0)."""
        ids = data["input_ids"]
        lengths = _lengths(data)
        b, t = ids.shape
        out = torch.zeros((b, t), dtype=torch.float32)
        self.model.eval()
        c = self.engine.cfg
        for rows, mb in micro_batches({"input_ids": ids, "input_lengths": lengths}, c.logprob_batch_size,
                                      c.sort_by_length, self.engine.device):
            _, lp = self._logits_and_logprobs(mb["input_ids"])
            out[rows, : lp.shape[1]] = lp.float().cpu()
        valid = torch.arange(t)[None, :] < lengths[:, None]
        return out * valid

    @torch.no_grad()
    def reference_logprobs(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """[B, T] log-probs under the frozen reference weights (snapshotted now if none exist yet)."""
        if self.reference is None:
            self.reference = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        current = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(self.reference)
        try:
            return self.get_logprobs(data)
        finally:
            self.model.load_state_dict(current)

    # ---- training --------------------------------------------------------------------------------

    def train(self, data: Mapping[str, torch.Tensor], loss_fn: LossFn) -> dict[str, float]:
        """One optimiser step on the whole batch (see module docstring for the metrics)."""
        if loss_needs_reference_logprobs(loss_fn) and "reference_policy_logprobs" not in data:
            data = {**data, "reference_policy_logprobs": self.reference_logprobs(data)}
        fill_prev = loss_needs_prev_logprobs(loss_fn) and "prev_logprobs" not in data
        if fill_prev and has_active_dropout(self.model):  # train-mode forward != eval forward: a separate pass
            data, fill_prev = {**data, "prev_logprobs": self.get_logprobs(data)}, False
        c = self.engine.cfg
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        total_loss, ent_sum, ent_count = 0.0, 0.0, 0
        for rows, mb in micro_batches(data, c.micro_batch_size, c.sort_by_length, self.engine.device):
            logits, lp = self._logits_and_logprobs(mb["input_ids"])
            if fill_prev:  # the weights that sampled the batch: no optimiser step has happened yet in this call
                valid = torch.arange(lp.shape[1], device=lp.device)[None, :] < _lengths(mb).to(lp.device)[:, None]
                mb["prev_logprobs"] = torch.where(valid, lp.detach(), torch.zeros_like(lp))
            loss, mb_metrics = loss_fn(lp, mb)
            if not torch.isfinite(loss):
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(f"LocalPolicy.train: non-finite loss {float(loss)} in micro-batch rows "
                                         f"{rows.tolist()}")
            if c.compute_entropy and "token_mask" in mb:
                with torch.no_grad():  # exact entropy at the natural response positions only
                    ent = masked_token_entropy(logits.detach(), _natural_token_mask(mb), c.logprob_chunk_size)
                    ent_sum += float(ent.sum())
                    ent_count += ent.numel()
            loss.backward()
            total_loss += float(loss.detach())
            for k, v in mb_metrics.items():
                metrics[k] = metrics.get(k, 0.0) + float(v)
        grad_norm = self._clip_and_step()
        self.model.eval()
        self.train_steps += 1
        metrics.setdefault("loss", total_loss)
        metrics["grad_norm"] = grad_norm
        if ent_count > 0:
            metrics["policy/entropy_exact"] = ent_sum / ent_count
        return metrics

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.engine.cfg.grad_clip
        max_norm = clip if clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.tensor(0.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ---- checkpoints -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Copies of the weights, AdamW state, the generator's RNG state and the step counter."""
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "rng": self.engine.rng.get_state().clone(),
            "train_steps": self.train_steps,
            "fingerprint": self.engine.fingerprint(),
            "reference": None if self.reference is None else {k: v.clone() for k, v in self.reference.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("model", "optimizer", "rng"):
            if key not in state:
                raise KeyError(f"LocalPolicy.load_state_dict: checkpoint has no {key!r} entry")
        fp = state.get("fingerprint")
        if fp is not None and fp != self.engine.fingerprint():
            raise ValueError(
                f"LocalPolicy.load_state_dict: checkpoint was written for model/tokenizer {fp}, "
                f"this backend is {self.engine.fingerprint()} (different local: block?)"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        c = self.engine.cfg  # moments come from the checkpoint, hyper-parameters from the config in force
        for group in self.optimizer.param_groups:
            group.update(lr=c.lr, betas=c.betas, eps=c.eps, weight_decay=c.weight_decay)
        self.engine.rng.set_state(state["rng"].cpu())
        self.train_steps = int(state.get("train_steps", 0))
        ref = state.get("reference")
        self.reference = None if ref is None else {k: v.clone() for k, v in ref.items()}

    def save_checkpoint(self, path: str | Path) -> None:
        """interfaces.Policy hook: ``state_dict()`` as ``<path>/state.pt``."""
        save_state(self.state_dict(), path)

    def load_checkpoint(self, path: str | Path) -> None:
        self.load_state_dict(load_state(path))

    def save_pretrained(self, path: str | Path) -> Path:
        """Write model + tokenizer in Hugging Face format (loadable again with ``local.model_path: path``)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path
