"""Word-level tokenizers made in code (no downloads), with special tokens and a chat template.

The tiny demo model needs a tokenizer whose vocabulary covers its task exactly: every word of the
prompts, hints and responses becomes one token, so a 0.3M-parameter model can learn the task in seconds.
``build_word_tokenizer(texts)`` collects the vocabulary from a corpus with the same normaliser and
pre-tokeniser the tokenizer uses at run time (lower-casing, split on whitespace and punctuation), so the
corpus never produces an unknown token.

The chat template renders ``<|im_start|>role content<|im_end|>`` per message (Qwen's markers; newlines
are dropped by a word-level pre-tokeniser, so they are not used) and ``<|im_start|>assistant`` as the
generation prompt. ``<|im_end|>`` is the EOS token: the generator stops on it and the warm start
appends it to every target response.

Named built-in vocabularies (``local.tokenizer: builtin:<name>``) are resolved by ``builtin_tokenizer``;
the demo's is ``builtin:persistent_task`` (rise_nemo.data.persistent_task.vocabulary_corpus); the
reasoning task's is ``builtin:reasoning_task`` (rise_nemo.data.chain_task.vocabulary_corpus), and
``builtin:reasoning_task_zap`` adds the hidden operation's word (``data.task.hidden_op``).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

PAD, UNK, EOT, IM_START, IM_END = "<|pad|>", "<|unk|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, EOT, IM_START, IM_END)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)

# Role names appear in rendered conversations; they must be in every vocabulary.
_ROLE_WORDS = ("system", "user", "assistant")


def _normalizer() -> normalizers.Normalizer:
    return normalizers.Lowercase()


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # Splits on whitespace and separates punctuation runs: "don't?" -> ["don", "'", "t", "?"].
    return pre_tokenizers.Whitespace()


def corpus_words(texts: Iterable[str]) -> list[str]:
    """Sorted distinct words of ``texts`` exactly as the word-level tokenizer will split them."""
    norm, pre = _normalizer(), _pre_tokenizer()
    words: set[str] = set(_ROLE_WORDS)
    for text in texts:
        words.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(text)))
    return sorted(words - set(SPECIAL_TOKENS))


def build_word_tokenizer(texts: Iterable[str]):
    """A transformers fast tokenizer over the words of ``texts`` (specials first, then sorted words).

    Deterministic: the same corpus always gives the same ids, so a cached warm start stays valid.
    """
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in corpus_words(texts):
        vocab[w] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.normalizer = _normalizer()
    core.pre_tokenizer = _pre_tokenizer()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=IM_END,
        additional_special_tokens=[IM_START, EOT],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def builtin_tokenizer(name: str):
    """Resolve ``builtin:<name>``; raises ValueError listing the known names."""
    if name == "persistent_task":
        from rise_nemo.data.persistent_task import vocabulary_corpus

        return build_word_tokenizer(vocabulary_corpus())
    if name in ("reasoning_task", "reasoning_task_zap"):
        from rise_nemo.data.chain_task import vocabulary_corpus as reasoning_corpus

        return build_word_tokenizer(reasoning_corpus(hidden_op=name == "reasoning_task_zap"))
    raise ValueError(f"local.tokenizer: unknown built-in tokenizer 'builtin:{name}'; known: "
                     "builtin:persistent_task, builtin:reasoning_task, builtin:reasoning_task_zap")
