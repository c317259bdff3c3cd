"""CPU stand-ins for the three NeMo-RL objects the nemo backend drives, honouring NeMo-RL v0.7's contracts:

- ``CpuMegatronPolicy``: ``get_logprobs`` returns ``{"logprobs": [B, S]}`` with column 0 = 0; ``train(data,
  loss_fn, gbs, mbs)`` shards rows over DP ranks and micro-batches and calls the loss exactly as NeMo-RL's
  workers do (``loss_fn(data=, global_valid_seqs=, global_valid_toks=, next_token_logprobs=[B, S-1])``),
  sums losses and backpropagates, one optimiser step per global batch, and reports ``all_mb_metrics``.
- ``CpuVllm``: ``generate(data, greedy)`` returns a ``GenerationOutputSpec`` (prompt then response in
  ``output_ids``, sampler log-probs at the response positions) from its OWN copy of the weights, which only
  a refit updates (so a missing refit shows up as stale sampling).
- ``refit``: copies the policy's weights into the vLLM stand-in (``refit_policy_generation``'s job).
- ``CpuValue``: NeMo-RL's ``Value`` (nemo_rl/models/value/lm_value.py): ``get_values`` returns ``{"values":
  [B, S]}`` shifted right by one (megatron_value_worker.py:829-833); ``train(data, loss_fn, gbs, mbs)``
  shards like the policy and calls ``loss_fn(logits=values [B, S], data=, global_valid_seqs=, global_valid_toks=)``
  as the packed path does (megatron_value_worker.py:149-151, 315; wrapper.py:136-141), summing micro-batch losses; ``prepare_for_*`` / ``finish_*`` phases
  and ``save_checkpoint(weights_path, optimizer_path, tokenizer_path)``.

The model is a bigram LM over a word-level tokenizer: real gradients, real sampling, milliseconds.
Every call is appended to ``events`` so tests can check the phase order.
"""

from __future__ import annotations

import copy

import torch

from rise_nemo.backends.local.tokenizer import build_word_tokenizer
from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricPrompt

WORDS = ("alpha", "beta", "gamma", "delta", "sun", "moon", "river", "forest")


def make_prompts(n: int, offset: int = 0, rubric: Rubric | None = None) -> list[RubricPrompt]:
    """n "describe the <topic>" prompts sharing ``rubric`` (default: mentions alpha / beta, not gamma)."""
    rubric = rubric or Rubric((
        Criterion("Mentions alpha", 3.0, (), MachineCheck("contains", "alpha")),
        Criterion("Mentions beta", 2.0, (), MachineCheck("contains", "beta")),
        Criterion("Says gamma", -1.0, (), MachineCheck("contains", "gamma")),
    ))
    topics = ("river", "forest", "sun", "moon")
    return [RubricPrompt(f"p{i + offset}", ({"role": "user", "content": f"describe the {topics[(i + offset) % 4]}"},),
                         rubric) for i in range(n)]


def write_jsonl(path, prompts) -> str:
    """Prompts as rise_nemo's rubric JSONL (data.source: jsonl); returns the path."""
    import json

    with open(path, "w") as fh:
        for p in prompts:
            fh.write(json.dumps({
                "prompt_id": p.prompt_id, "messages": [dict(m) for m in p.messages],
                "rubric": [{"criterion": c.text, "points": c.weight,
                            "check": {"kind": c.check.kind, "value": c.check.value}} for c in p.rubric.criteria],
            }) + "\n")
    return str(path)


def make_tokenizer():
    from rise_nemo.core.prompts import GUIDANCE_TEMPLATES

    texts = [*WORDS, "describe the", "mentions says avoid the following"]
    texts += [t.replace("{hint}", "Mentions alpha; Mentions beta; avoid Says gamma") for t in GUIDANCE_TEMPLATES]
    return build_word_tokenizer(texts)


class Bigram(torch.nn.Module):
    def __init__(self, vocab: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 0.5)

    def next_token_logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, S] -> [B, S-1]: log p(input_ids[:, t+1] | input_ids[:, t]) (NeMo-RL's loss input)."""
        logp = torch.log_softmax(self.table[input_ids[:, :-1]], dim=-1)
        return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


class _Axes:
    def __init__(self, dp: int):
        self.dp = dp

    def get_axis_size(self, name: str) -> int:
        assert name == "data_parallel"
        return self.dp


TRAINING_STATE = frozenset({"params", "grads", "optimizer"})


class CpuMegatronPolicy:
    """``resident``: which of the policy's params / grads / optimizer state NeMo-RL's Megatron worker would hold
    on the GPUs after each phase call (megatron_policy_worker.py:1411-1460 and 1487-1592, with
    ``offload_optimizer_for_logprob`` off, as in NeMo-RL's base configs): the log-prob pass, training and the
    refit assert what they need, and the value stand-in asserts the policy holds nothing (PPO's order)."""

    def __init__(self, vocab: int, dp: int, events: list, lr: float = 0.5):
        self.model = Bigram(vocab)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.sharding_annotations = _Axes(dp)
        self.events = events
        self.train_calls: list[dict] = []
        self.resident = set(TRAINING_STATE)  # Megatron builds the model and optimizer on the GPUs

    def prepare_for_lp_inference(self):  # :1411-1431: params on, grad buffers off
        self.events.append("policy.prepare_for_lp_inference")
        self.resident = (self.resident | {"params"}) - {"grads"}

    def prepare_for_training(self):  # :1433-1450: everything on
        self.events.append("policy.prepare_for_training")
        self.resident = set(TRAINING_STATE)

    def finish_inference(self):  # :1452-1460: params off
        self.events.append("policy.finish_inference")
        self.resident.discard("params")

    def offload_before_refit(self):  # :1487-1577: grad buffers and optimizer off
        self.events.append("policy.offload_before_refit")
        self.resident -= {"grads", "optimizer"}

    def offload_after_refit(self):  # :1578-1592: everything off
        self.events.append("policy.offload_after_refit")
        self.resident = set()

    def _aligned(self, input_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            lp = self.model.next_token_logprobs(input_ids)
        return torch.cat([torch.zeros(lp.shape[0], 1), lp], dim=1)

    def get_logprobs(self, data):
        self.events.append("policy.get_logprobs")
        assert "params" in self.resident, "get_logprobs with the policy's weights off the GPUs"
        rows = data["input_ids"].shape[0]
        assert rows % self.sharding_annotations.dp == 0, "NeMo-RL shards rows evenly over DP"
        return {"logprobs": self._aligned(data["input_ids"])}

    def get_reference_policy_logprobs(self, data):
        self.events.append("policy.get_reference_policy_logprobs")
        return {"reference_logprobs": self._aligned(data["input_ids"])}

    def train(self, data, loss_fn, gbs=None, mbs=None):
        self.events.append("policy.train")
        assert self.resident == TRAINING_STATE, f"policy.train with only {sorted(self.resident)} on the GPUs"
        assert loss_fn.input_type.value == "logprob" and loss_fn.loss_type.value == "token_level"
        rows, dp = data["input_ids"].shape[0], self.sharding_annotations.dp
        assert gbs == rows and rows % (dp * mbs) == 0, (rows, gbs, dp, mbs)
        self.train_calls.append({k: v.clone() for k, v in data.items()})
        mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
        gvt, gvs = mask.sum(), data["sample_mask"].sum()  # NeMo-RL's own normalisers (ignored by our loss)
        self.opt.zero_grad()
        per_rank, metrics = rows // dp, {}
        total = 0.0
        for rank in range(dp):
            for start in range(rank * per_rank, (rank + 1) * per_rank, mbs):
                mb = {k: v[start: start + mbs] for k, v in data.items()}
                loss, m = loss_fn(data=mb, global_valid_seqs=gvs, global_valid_toks=gvt,
                                  next_token_logprobs=self.model.next_token_logprobs(mb["input_ids"]))
                loss.backward()
                total += float(loss.detach())
                for k, v in {**m, "lr": 0.5}.items():
                    metrics.setdefault(k, []).append(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e9)
        self.opt.step()
        return {"loss": torch.tensor(total), "grad_norm": grad_norm, "all_mb_metrics": metrics}

    def save_checkpoint(self, weights_path, optimizer_path=None, tokenizer_path=None, checkpointing_cfg=None):
        self.events.append("policy.save_checkpoint")
        import os

        os.makedirs(weights_path, exist_ok=True)
        torch.save(self.model.state_dict(), os.path.join(weights_path, "model.pt"))


class CpuVllm:
    def __init__(self, vocab: int, max_new_tokens: int, pad_id: int, eos_id: int, events: list, seed: int = 0):
        self.model = Bigram(vocab, seed=123)  # deliberately NOT the policy's weights until a refit
        self.max_new_tokens, self.pad_id, self.eos_id = max_new_tokens, pad_id, eos_id
        self.events = events
        self.gen = torch.Generator().manual_seed(seed)
        self.awake = False

    def prepare_for_generation(self, *a, **k):
        self.events.append("vllm.prepare_for_generation")
        self.awake = True
        return True

    def finish_generation(self, *a, **k):
        self.events.append("vllm.finish_generation")
        self.awake = False
        return True

    @torch.no_grad()
    def generate(self, data, greedy=False):
        self.events.append("vllm.generate")
        assert self.awake, "generate outside prepare_for_generation/finish_generation"
        return self._outputs(data, greedy, self.gen)

    async def generate_async(self, data, greedy=False):
        """VllmGeneration.generate_async (async engine): ONE sample per call (vllm_generation.py:756-760), yielded as
        (index, output); a request with a seed (rise_nemo's seeded worker, column ``sampling_seed``) samples from
        its own generator, as vLLM does for SamplingParams.seed."""
        import asyncio

        assert self.awake, "generate_async outside prepare_for_generation/finish_generation"
        assert data["input_ids"].shape[0] == 1, "generate_async is restricted to handle only single samples"
        self.events.append("vllm.generate_async")
        seed = data.get("sampling_seed")
        gen = torch.Generator().manual_seed(int(seed[0])) if seed is not None else self.gen
        await asyncio.sleep(0)
        with torch.no_grad():
            yield 0, self._outputs(data, greedy, gen)

    def _outputs(self, data, greedy, gen):
        ids, lens = data["input_ids"], data["input_lengths"]
        rows = []
        for i in range(ids.shape[0]):
            prompt = ids[i, : int(lens[i])].tolist()
            resp, lps, last = [], [], prompt[-1]
            for _ in range(self.max_new_tokens):
                logp = torch.log_softmax(self.model.table[last], -1)
                tok = int(logp.argmax()) if greedy else int(torch.multinomial(logp.exp(), 1, generator=gen))
                resp.append(tok)
                lps.append(float(logp[tok]))
                last = tok
                if tok == self.eos_id:
                    break
            rows.append((prompt, resp, lps))
        width = max(len(p) + len(r) for p, r, _ in rows)
        out_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        out_lp = torch.zeros(len(rows), width)
        for i, (p, r, lp) in enumerate(rows):
            out_ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            out_lp[i, len(p): len(p) + len(r)] = torch.tensor(lp)
        return {
            "output_ids": out_ids,
            "logprobs": out_lp,
            "generation_lengths": torch.tensor([len(r) for _, r, _ in rows]),
            "unpadded_sequence_lengths": torch.tensor([len(p) + len(r) for p, r, _ in rows]),
            "truncated": torch.tensor([r[-1] != self.eos_id for _, r, _ in rows]),
        }


class CpuValue:
    """A per-token value head over a bigram-style embedding: V_raw[t] = w[input_ids[t]] + b, right-shifted."""

    def __init__(self, vocab: int, dp: int, events: list, lr: float = 0.5, seed: int = 0, colocated_policy=None):
        g = torch.Generator().manual_seed(seed)
        self.colocated_policy = colocated_policy  # a CpuMegatronPolicy on the same GPUs (must be offloaded)
        self.model = torch.nn.Embedding(vocab, 1)
        with torch.no_grad():
            self.model.weight.copy_(torch.randn(vocab, 1, generator=g) * 0.1)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.sharding_annotations = _Axes(dp)
        self.events = events
        self.on_gpu = False
        self.train_calls: list[dict] = []

    def _shifted(self, input_ids: torch.Tensor) -> torch.Tensor:
        raw = self.model(input_ids).squeeze(-1)  # [B, S]: value after reading token t
        return torch.cat([torch.zeros_like(raw[:, :1]), raw[:, :-1]], dim=1)  # value of the state before t

    def _check_policy_offloaded(self):
        if self.colocated_policy is not None:
            assert not self.colocated_policy.resident, (
                f"the value model loads while the policy holds {sorted(self.colocated_policy.resident)} on the GPUs")

    def prepare_for_inference(self):
        self.events.append("value.prepare_for_inference")
        self._check_policy_offloaded()
        self.on_gpu = True

    def finish_inference(self):
        self.events.append("value.finish_inference")
        self.on_gpu = False

    def prepare_for_training(self):
        self.events.append("value.prepare_for_training")
        self._check_policy_offloaded()
        self.on_gpu = True

    def finish_training(self):
        self.events.append("value.finish_training")
        self.on_gpu = False

    @torch.no_grad()
    def get_values(self, data):
        self.events.append("value.get_values")
        assert self.on_gpu, "get_values outside prepare_for_inference/finish_inference"
        assert data["input_ids"].shape[0] % self.sharding_annotations.dp == 0, "NeMo-RL shards rows evenly over DP"
        return {"values": self._shifted(data["input_ids"])}

    def train(self, data, loss_fn, eval_mode=False, *, gbs=None, mbs=None, timer=None):
        self.events.append("value.train")
        assert self.on_gpu, "train outside prepare_for_training/finish_training"
        assert loss_fn.input_type.value == "logit" and loss_fn.loss_type.value == "token_level"
        rows, dp = data["input_ids"].shape[0], self.sharding_annotations.dp
        assert gbs == rows and rows % (dp * mbs) == 0, (rows, gbs, dp, mbs)
        self.train_calls.append({k: v.clone() for k, v in data.items()})
        mask = data["token_mask"] * data["sample_mask"][:, None]
        gvt, gvs = mask.sum(), data["sample_mask"].sum()
        self.opt.zero_grad()
        per_rank, metrics, total = rows // dp, {}, 0.0
        for rank in range(dp):
            for start in range(rank * per_rank, (rank + 1) * per_rank, mbs):
                mb = {k: v[start: start + mbs] for k, v in data.items()}
                loss, m = loss_fn(logits=self._shifted(mb["input_ids"]), data=mb, global_valid_seqs=gvs,
                                  global_valid_toks=gvt)
                loss.backward()
                total += float(loss.detach())
                for k, v in m.items():
                    metrics.setdefault(k, []).append(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e9)
        if not eval_mode:
            self.opt.step()
        return {"loss": torch.tensor(total), "grad_norm": grad_norm, "all_mb_metrics": metrics}

    def save_checkpoint(self, weights_path, optimizer_path=None, tokenizer_path=None, checkpointing_cfg=None):
        self.events.append("value.save_checkpoint")
        assert self.on_gpu, "ppo.py saves the value model between prepare_for_training and finish_training"
        import os

        os.makedirs(weights_path, exist_ok=True)
        torch.save(self.model.state_dict(), os.path.join(weights_path, "model.pt"))
        if optimizer_path:
            os.makedirs(optimizer_path, exist_ok=True)
            torch.save(self.opt.state_dict(), os.path.join(optimizer_path, "optim.pt"))


def make_refit(events: list):
    def refit(policy, generation, colocated, _refit_buffer_size_gb=None, **_):
        events.append("refit")
        # grpo.refit_policy_generation streams the weights from the GPUs (colocated ZMQ/IPC)
        assert "params" in policy.resident, "refit with the policy's weights off the GPUs"
        if colocated:
            policy.offload_before_refit()
        generation.model.load_state_dict(copy.deepcopy(policy.model.state_dict()))
        generation.prepare_for_generation()

    return refit


def master_config(max_new_tokens: int, mbs: int = 2, async_engine: bool = False) -> dict:
    return {"policy": {
        "train_micro_batch_size": mbs, "logprob_batch_size": mbs, "make_sequence_length_divisible_by": 4,
        "train_global_batch_size": 32,
        "tokenizer": {"name": "word-level"},
        "generation": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": max_new_tokens,
                       "colocated": {"enabled": True}, "stop_token_ids": None,
                       "vllm_cfg": {"async_engine": async_engine}},
    }}
