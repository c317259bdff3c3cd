"""Per-token log-probabilities and entropies from logits, computed in chunks (docs/DESIGN.md §3).

Alignment (shared with NeMo-RL, see rise_nemo.interfaces): for logits [B, T, V] of a causal LM run on
input_ids [B, T], ``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` comes from ``logits[b, t-1]``;
``out[:, 0] = 0`` (no prediction for the first token).

Memory: a naive ``logits.float().log_softmax(-1).gather(...)`` materialises the fp32 log-softmax of the
whole batch (4,096 tokens x 151,936 vocab = 2.5 GB) and autograd keeps it, then backward allocates two
more tensors of that size. Here the batch is processed ``chunk_size`` token positions at a time; each
chunk spans the full vocabulary in fp32 (chunk_size x V floats), only the log-sum-exp per position
(B*T floats) is saved, and backward recomputes the softmax chunk by chunk, writing the gradient directly
into one tensor of the logits' own dtype (bf16 logits stay bf16). See bench/logprob_memory.py.
"""

from __future__ import annotations

import torch

__all__ = [
    "token_logprobs",
    "token_entropy",
    "masked_token_entropy",
    "naive_token_logprobs",
    "naive_token_entropy",
    "DEFAULT_CHUNK_SIZE",
    "ppo_reference_logprobs",
]

# 256 positions x 151,936 vocab x 4 bytes = 156 MB of fp32 per temporary: small next to a 4k-token batch's
# logits, large enough that the per-chunk Python overhead is negligible.
DEFAULT_CHUNK_SIZE = 256


def _check_shapes(logits: torch.Tensor, input_ids: torch.Tensor | None = None) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    if input_ids is not None and tuple(input_ids.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} must match logits' [B, T] {tuple(logits.shape[:2])}"
        )


def _next_token_targets(input_ids: torch.Tensor) -> torch.Tensor:
    """Flat [B*T] targets: row (b, t) of the logits predicts input_ids[b, t+1]; the last row of each
    sequence predicts nothing (target 0, its result is dropped and its gradient is zero)."""
    tgt = torch.zeros_like(input_ids)
    tgt[:, :-1] = input_ids[:, 1:]
    return tgt.reshape(-1).long()


def _shift_right(per_row: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """[B*T] values computed at logits rows -> [B, T] aligned with input_ids (column 0 = 0)."""
    out = per_row.new_zeros(b, t)
    out[:, 1:] = per_row.view(b, t)[:, :-1]
    return out


class _ChunkedTokenLogprob(torch.autograd.Function):
    """log softmax(x)[target] per row of x [N, V]; saves only logsumexp [N], recomputes in backward."""

    @staticmethod
    def forward(ctx, flat_logits: torch.Tensor, targets: torch.Tensor, chunk_size: int) -> torch.Tensor:
        n = flat_logits.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=flat_logits.device)
        out = torch.empty(n, dtype=torch.float32, device=flat_logits.device)
        for s in range(0, n, chunk_size):
            x = flat_logits[s : s + chunk_size].float()  # [c, V] fp32, the only large temporary
            lse[s : s + chunk_size] = torch.logsumexp(x, dim=-1)
            out[s : s + chunk_size] = (
                x.gather(1, targets[s : s + chunk_size, None]).squeeze(1) - lse[s : s + chunk_size]
            )
            del x
        ctx.save_for_backward(flat_logits, targets, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        flat_logits, targets, lse = ctx.saved_tensors
        cs = ctx.chunk_size
        grad = torch.empty_like(flat_logits)  # logits' dtype: the one unavoidable full-size tensor
        for s in range(0, flat_logits.shape[0], cs):
            g = grad_out[s : s + cs].float()  # [c]
            # d logp_target / d x = onehot(target) - softmax(x); times the incoming gradient g.
            # Never modify .float() in place: for fp32 logits it returns the input itself, not a copy.
            p = (flat_logits[s : s + cs].float() - lse[s : s + cs, None]).exp_()  # softmax, [c, V]
            p.mul_(-g[:, None])
            p.scatter_add_(1, targets[s : s + cs, None], g[:, None])
            grad[s : s + cs] = p.to(grad.dtype)
            del p
        return grad, None, None


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy H = -sum p log p per row of x [N, V]; saves logsumexp and H, recomputes in backward."""

    @staticmethod
    def forward(ctx, flat_logits: torch.Tensor, chunk_size: int) -> torch.Tensor:
        n = flat_logits.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=flat_logits.device)
        ent = torch.empty(n, dtype=torch.float32, device=flat_logits.device)
        for s in range(0, n, chunk_size):
            x = flat_logits[s : s + chunk_size].float()
            c_lse = torch.logsumexp(x, dim=-1)
            logp = x - c_lse[:, None]  # not in place: .float() of fp32 logits is the input itself
            lse[s : s + chunk_size] = c_lse
            ent[s : s + chunk_size] = -(logp.exp() * logp).sum(-1)
            del x, logp
        ctx.save_for_backward(flat_logits, lse, ent)
        ctx.chunk_size = chunk_size
        return ent

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        flat_logits, lse, ent = ctx.saved_tensors
        cs = ctx.chunk_size
        grad = torch.empty_like(flat_logits)
        for s in range(0, flat_logits.shape[0], cs):
            g = grad_out[s : s + cs].float()
            logp = flat_logits[s : s + cs].float() - lse[s : s + cs, None]  # [c, V]
            p = logp.exp()
            # dH/dx_i = -p_i (log p_i + H), times the incoming gradient g.
            logp.add_(ent[s : s + cs, None]).mul_(p).mul_(-g[:, None])
            grad[s : s + cs] = logp.to(grad.dtype)
            del logp, p
        return grad, None


def _flat(logits: torch.Tensor) -> torch.Tensor:
    b, t, v = logits.shape
    # view() needs a contiguous tensor; a non-contiguous input is copied once (documented cost).
    return logits.contiguous().view(b * t, v)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Per-token log-probs [B, T] (fp32) of ``input_ids`` under ``logits`` [B, T, V] (any float dtype).

    Differentiable with respect to ``logits``; the backward recomputes the softmax per chunk.
    """
    _check_shapes(logits, input_ids)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    b, t, _ = logits.shape
    per_row = _ChunkedTokenLogprob.apply(
        _flat(logits), _next_token_targets(input_ids.to(logits.device)), chunk_size
    )
    return _shift_right(per_row, b, t)


def token_entropy(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Entropy [B, T] (fp32, nats) of the next-token distribution, aligned like ``token_logprobs``:
    ``out[b, t]`` is the entropy of the distribution that produced input_ids[b, t]; ``out[:, 0] = 0``."""
    _check_shapes(logits)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    b, t, _ = logits.shape
    return _shift_right(_ChunkedEntropy.apply(_flat(logits), chunk_size), b, t)


def masked_token_entropy(
    logits: torch.Tensor, mask: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """``token_entropy(logits)[mask]`` as a flat [n] fp32 tensor, computed at the masked positions only (e.g.
    the response tokens: the prompt's next-token distributions are never evaluated). Same values, in row-major
    order of the mask; a masked column 0 (no prediction) gives 0, as in ``token_entropy``."""
    _check_shapes(logits)
    m = mask.bool().to(logits.device)
    if tuple(m.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"mask {tuple(m.shape)} must match logits' [B, T] {tuple(logits.shape[:2])}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    picked = logits[:, :-1][m[:, 1:]]  # [n', V]: the logits row that predicts each masked token
    aligned = torch.zeros(m.shape, dtype=torch.float32, device=logits.device)  # [B, T], no vocabulary dim
    if picked.shape[0]:
        aligned[:, 1:][m[:, 1:]] = _ChunkedEntropy.apply(picked, chunk_size)
    return aligned[m]


def naive_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Reference implementation (full fp32 log-softmax of the batch), for tests and the benchmark only."""
    _check_shapes(logits, input_ids)
    lp = logits[:, :-1].float().log_softmax(-1).gather(-1, input_ids[:, 1:, None].long()).squeeze(-1)
    return torch.nn.functional.pad(lp, (1, 0))


def naive_token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Reference implementation of ``token_entropy``, for tests only."""
    _check_shapes(logits)
    logp = logits[:, :-1].float().log_softmax(-1)
    return torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))


def ppo_reference_logprobs(
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    sampled_under_train_prompt: torch.Tensor,
) -> torch.Tensor:
    """The log-probs a row's PPO ratio (eq. 12, pi_theta / pi_old) is taken against, [B, T].

    With a behaviour-ratio correction (rollouts from another engine, e.g. FP8 vLLM) pi_old is the SAMPLER's
    log-probs (``generation_logprobs``), so the ratio is the importance weight of the policy that actually
    produced the tokens. That holds only for a row whose tokens were sampled under the very prompt it is
    trained on (``sampled_under_train_prompt`` [B], bool). Every other row keeps the trainer's recomputed
    log-probs under the original prompt (``prev_logprobs``): RISE guided rows and coupled privileged rows
    (sampled under the hinted prompt, they carry placeholder sampler log-probs of 0.0), RuscaRL rows
    (sampled under a scaffolded prompt). Taking a 0.0 placeholder as pi_old would make every ratio
    exp(log p) < 1, clip most tokens at 1 - eps and shrink or kill their gradient. Off the response tokens
    (``token_mask`` 0) prev_logprobs is kept as well.
    """
    behaviour = sampled_under_train_prompt.bool()[:, None] & token_mask.bool()  # [B, T]
    return torch.where(behaviour, generation_logprobs, prev_logprobs)
