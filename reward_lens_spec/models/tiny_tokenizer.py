"""A byte-level tokenizer built in code: same ids on every machine, no download.

Vocabulary: 4 special tokens (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3)
then the 256 bytes (id = 4 + byte value), 260 ids in all. Every UTF-8 text
round-trips. Built with the ``tokenizers`` library (a BPE model with no merges
over the GPT-2 byte alphabet), wrapped as a ``PreTrainedTokenizerFast``.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
VOCAB_SIZE = len(SPECIALS) + 256

# A minimal chat template in the common role/content shape. It opens with the
# BOS token, so encoding it with add_special_tokens=True would double the BOS:
# the runtime must tokenize templates once, with special tokens off.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
)


def build_tiny_tokenizer(*, add_bos: bool = True, pad_token: str | None = "<pad>",
                         padding_side: str = "left", chat_template: bool = True) -> PreTrainedTokenizerFast:
    """Return the deterministic byte-level tokenizer.

    ``add_bos``: prepend ``<s>`` when ``add_special_tokens=True``.
    ``pad_token``: ``None`` builds a tokenizer without a pad token (tests use it);
    ``"</s>"`` makes pad equal to EOS.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_symbols = sorted(alphabet, key=lambda s: _byte_of(s))
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for sym in byte_symbols:
        vocab[sym] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token=pad_token, padding_side=padding_side)
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return no_whole_text_cache(fast)


def no_whole_text_cache(fast):
    """``fast`` (a ``PreTrainedTokenizerFast``) with BPE's word cache off when its pre-tokenizer does not split
    (none, or ``ByteLevel(use_regex=False)``): the cache would then hold whole texts, up to 10,000 of them
    (37 MB over the pairs of benchmarks/memory.py), and save nothing (each text of a dataset is new). Token ids
    are unchanged. A saved tokenizer does not keep the setting, so every load applies it (``models.hub``)."""
    backend = getattr(fast, "backend_tokenizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    if pre is None or getattr(pre, "use_regex", True) is False:
        resize = getattr(getattr(backend, "model", None), "_resize_cache", None)
        if callable(resize):
            resize(0)
    return fast


_BYTE_TO_UNICODE: dict[str, int] | None = None


def _byte_of(symbol: str) -> int:
    """The byte value GPT-2's byte-to-unicode table maps to ``symbol``."""
    global _BYTE_TO_UNICODE
    if _BYTE_TO_UNICODE is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
            + list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_TO_UNICODE = {chr(c): b for b, c in zip(bs, cs)}
    return _BYTE_TO_UNICODE[symbol]
