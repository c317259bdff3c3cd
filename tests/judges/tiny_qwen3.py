"""Build a tiny random-weight Qwen3 chat model in a local folder (no downloads), for the real-vLLM smoke test
and the local backend's real-model path (tests/local/test_real_model.py, trained on GSM8K text).

Run with any Python that has transformers>=4.51 and tokenizers: ``python tests/judges/tiny_qwen3.py OUT_DIR``.
The tokenizer is a byte-level BPE trained in code (on ``corpus``, default the judge's words), so any text is
expressible (vLLM's structured-output grammar needs that for the judge's JSON); the chat template is a
minimal ChatML one, like Qwen3's.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    # Enough varied text that BPE learns merges for JSON punctuation, the verdict words and English.
    words = (
        "explanation criteria_met true false PRESENT NOT_PRESENT criterion response conversation "
        "the patient should doctor potassium calcium message rubric points grade json object"
    ).split()
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += ['{"explanation": "The response mentions it.", "criteria_met": true}',
              '{"1": "PRESENT", "2": "NOT_PRESENT", "3": "PRESENT"}']
    return lines * 20


def build(out: Path, vocab_size: int = 2048, corpus: list[str] | None = None) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus() if corpus is None else corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    cfg = Qwen3Config(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"), tie_word_embeddings=True,
    )
    import torch

    torch.manual_seed(0)  # the same random weights every time: a reproducible smoke test
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.save_pretrained(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_qwen3.py OUT_DIR")
    print(build(Path(sys.argv[1])))
