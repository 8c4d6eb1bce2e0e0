"""Turn preference pairs into token ids per side (stored flat, ``models.token_rows``), ready for padding.

Rules (``encode_pairs``):

- ``fmt="plain"``: text = ``template`` with ``{prompt}`` / ``{response}`` substituted in ONE
  pass (braces inside the texts are never interpreted), tokenized with the tokenizer's own
  special tokens (``add_special_tokens=True``). ``{other}`` (optional) is the pair's other
  response: a pairwise judge (``kinds.judge``) shows both, the side's own first.
- ``fmt="chat_template"``: ``tokenizer.apply_chat_template([user, assistant], tokenize=True,
  add_generation_prompt=False)`` tokenized ONCE from the template; the text is never rendered
  and re-tokenized (that would add a second BOS).
- ``fmt="messages"`` (pairs of TRL's conversational shapes, ``data.readers``: ``prompt`` and each response
  are canonical JSON message lists): ``tokenizer.apply_chat_template(prompt + response messages,
  chat_template=template or the tokenizer's own, tokenize=True, add_generation_prompt=False)``; chosen by
  ``inputs.encode`` from the data, never by ``model.format``.
- BOS check: when the tokenizer has a ``bos_token_id``, the leading BOS ids of every sequence
  are counted; more than one, or a count that differs between sequences, is a ``CaptureError``
  naming the model and the fix. The result records ``bos_count`` (0 or 1).
- Truncation to ``max_length`` keeps the END (response end + readout token): tokens are dropped
  from just after the leading BOS (kept if present), i.e. from the left of the prompt. A pair
  that lost prompt tokens is listed in ``prompt_truncated`` and KEPT (its response is whole).
- Policy for a pair whose RESPONSE was cut (the response alone does not fit): it is listed in
  ``response_truncated`` and, by default (``truncated_responses="exclude"``), EXCLUDED with
  reason ``response_truncated``, because a margin between two cut responses is not the
  comparison the label was given for; a warning gives the count and the fix (raise
  ``model.max_length``, up to the model's position limit). ``truncated_responses="keep"``
  keeps them (BOS + the last tokens, length ``max_length``), flagged.
- A pair whose two sides differ before truncation but are identical after is EXCLUDED: its id
  goes to ``excluded["identical_after_truncation"]`` and a warning gives the count. Pairs
  identical before truncation (chosen == rejected) are kept; their margin must be exactly 0.
- ``pair.prompt_rejected`` (when not None) is the rejected side's prompt.

Errors: ``SpecError`` (``model.format``, ``model.template``, ``model.max_length``,
``model.chat_template``) for bad arguments; ``CaptureError`` for BOS doubling or empty sequences.
"""
from __future__ import annotations

import hashlib
import re
import struct
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import CaptureError, SpecError
from . import token_rows
from .pair_ids import PairIds
from .token_rows import RowsBuilder, TokenRows
import json

FORMATS = ("plain", "chat_template", "messages")
TRUNCATED_RESPONSES = ("exclude", "keep")
_SLOT = re.compile(r"\{(prompt|response|other)\}")


@dataclass(frozen=True)
class EncodedPairs:
    """Token ids of the kept pairs, aligned: ``chosen[i]`` / ``rejected[i]`` belong to ``pair_ids[i]``.

    ``excluded``: reason -> pair ids left out (``identical_after_truncation``,
    ``response_truncated``). ``n_truncated``: input pairs with at least one side truncated.
    ``prompt_truncated`` / ``response_truncated``: input pair ids (kept or not) that lost prompt
    tokens / response tokens to truncation. ``kind_flags``: flag -> ids of kept pairs, the pair flags a kind's
    encoding hook adds (``data.pairs.KIND_FLAGS``; a PRM's ``no_step_separator``); empty for the other kinds.
    """

    pair_ids: Sequence[str]
    chosen: list[list[int]]
    rejected: list[list[int]]
    excluded: dict[str, list[str]]
    n_truncated: int
    bos_count: int
    max_length: int
    fmt: str
    response_truncated: list[str] = field(default_factory=list)
    prompt_truncated: list[str] = field(default_factory=list)
    template: str = ""          # the plain template used (response starts: engine.per_token)
    kind_flags: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.pair_ids, PairIds):  # stored as bytes (models.pair_ids): its text and an 8-byte offset
            object.__setattr__(self, "pair_ids", PairIds(self.pair_ids))
        for side in ("chosen", "rejected"):       # stored flat (models.token_rows): 4 bytes per token
            if not isinstance(getattr(self, side), TokenRows):
                object.__setattr__(self, side, TokenRows(getattr(self, side)))

    def digest(self) -> str:
        """sha256 hex of exactly what the model sees: for every kept pair, in order, its id and the
        token ids of its chosen and rejected side (after formatting and truncation).

        A change of order, of any id, or of any token of any side changes it; a run id covers it.
        """
        h = hashlib.sha256(b"reward_lens_spec.encoded.v1")
        for pid, c, r in zip(self.pair_ids, self.chosen, self.rejected):
            for part in (str(pid).encode("utf-8"), np.asarray(c, "<i8").tobytes(), np.asarray(r, "<i8").tobytes()):
                h.update(struct.pack("<Q", len(part)))
                h.update(part)
        return h.hexdigest()

    def lengths(self) -> np.ndarray:
        """Token counts, shape ``(n_pairs, 2)`` (dims: pair, side=[chosen, rejected]), int64."""
        return np.stack([self.chosen.lengths(), self.rejected.lengths()], axis=1).astype(np.int64)


def _ids(result: Any) -> list[int]:
    """Token ids from whatever ``apply_chat_template``/``__call__`` returned (list, dict, BatchEncoding)."""
    if hasattr(result, "keys") and "input_ids" in result:
        result = result["input_ids"]
    if hasattr(result, "tolist"):
        result = result.tolist()
    result = list(result)
    if result and isinstance(result[0], (list, tuple)):
        if len(result) != 1:
            raise CaptureError(f"expected one encoded sequence, got {len(result)}")
        result = list(result[0])
    return [int(t) for t in result]


def _fill(template: str, prompt: str, response: str, other: str = "") -> str:
    """``template`` with its slots filled in one pass (braces inside the texts are never interpreted)."""
    return _SLOT.sub(lambda m: {"prompt": prompt, "response": response, "other": other}[m.group(1)], template)


def encode_text(tokenizer, prompt: str, response: str, fmt: str, template: str, other: str = "") -> list[int]:
    if fmt == "plain":
        text = _fill(template, prompt, response, other)
        return _ids(tokenizer(text, add_special_tokens=True))
    if fmt == "messages":                       # canonical JSON message lists (data.readers.messages_text)
        messages = json.loads(prompt) + (json.loads(response) if response else [])
        return _ids(tokenizer.apply_chat_template(messages, chat_template=template or None, tokenize=True,
                                                  add_generation_prompt=False, return_dict=False))
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    return _ids(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False))


ENCODE_SLICE = 1024      # texts per tokenizer call in _encode_all


def _encode_all(tokenizer, items: list[tuple], fmt: str, template: str) -> list[list[int]]:
    """``encode_text`` of every ``(prompt, response)``; plain texts go to the tokenizer in batched calls of
    ``ENCODE_SLICE`` texts (no padding, no truncation: the same ids as one call per text). Slicing bounds
    the tokenizer's transient memory: one call over 16,384 pairs held 290 MB, slices of 1,024 hold 62 MB
    (benchmarks/results.md §10)."""
    if fmt != "plain" or not items:
        return [encode_text(tokenizer, *it[:2], fmt, template) for it in items]
    out: list[list[int]] = []
    backend = _plain_backend(tokenizer)
    for start in range(0, len(items), ENCODE_SLICE):
        texts = [_fill(template, *it) for it in items[start:start + ENCODE_SLICE]]   # (prompt, response[, other])
        if backend is not None:
            out.extend(e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=True))
            continue
        enc = tokenizer(texts, add_special_tokens=True, padding=False, truncation=False)
        out.extend([int(t) for t in ids] for ids in enc["input_ids"])
    return out


_CALL_STEPS = ("__call__", "_call_one", "encode_plus", "batch_encode_plus", "_encode_plus", "_batch_encode_plus")


def _plain_backend(tokenizer):
    """The Rust tokenizer behind ``tokenizer`` when ``tokenizer(texts, add_special_tokens=True, padding=False,
    truncation=False)`` is that backend's ``encode_batch`` with no truncation or padding (a
    ``PreTrainedTokenizerFast`` overriding none of the call's steps, its special tokens not split), its
    truncation and padding switched off as the call switches them off; else None. Its ``encode_batch_fast``
    gives the same ids without the character offsets the call computes and drops (~30 % of the call)."""
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast) or any(
            getattr(type(tokenizer), k, None) is not getattr(PreTrainedTokenizerFast, k, None) for k in _CALL_STEPS):
        return None
    backend = tokenizer.backend_tokenizer
    if not hasattr(backend, "encode_batch_fast") or (
            backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))):
        return None
    if backend.truncation is not None:
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    return backend


def common_prefix(base: list[int], full: list[int]) -> int:
    """Tokens of ``full`` that belong to the prompt part: common prefix with the empty-response encoding ``base``."""
    n = 0
    for a, b in zip(base, full):
        if a != b:
            break
        n += 1
    return n


def _leading(ids: list[int], tok_id: int | None) -> int:
    if tok_id is None:
        return 0
    n = 0
    while n < len(ids) and ids[n] == tok_id:
        n += 1
    return n


def _truncate(ids: list[int], bos: int, max_length: int) -> list[int]:
    """Keep the leading BOS (if any) and the last ``max_length - bos`` tokens."""
    if len(ids) <= max_length:
        return ids
    return ids[:bos] + ids[len(ids) - (max_length - bos):]


def _encode_slice(tokenizer, pairs, fmt, template, max_length, bos_id, model_name, bos_seen) -> list[tuple]:
    """``(pair id, chosen ids, rejected ids, chosen prompt part, rejected prompt part)`` of each of ``pairs``
    (the prompt part measured only for a side longer than ``max_length``); adds each side's count of leading
    BOS tokens to ``bos_seen``. Raises ``CaptureError`` for an empty side or a doubled BOS."""
    texts = [(prompt, resp, other) for pair in pairs for prompt, resp, other in (
        (pair.prompt, pair.chosen, pair.rejected),
        (pair.prompt_rejected if getattr(pair, "prompt_rejected", None) is not None else pair.prompt, pair.rejected,
         pair.chosen))]
    all_ids = _encode_all(tokenizer, texts, fmt, template)
    long = [k for k, ids in enumerate(all_ids) if len(ids) > max_length]     # their prompt part is measured
    prompt_only = dict(zip(long, _encode_all(tokenizer, [(texts[k][0], "", "") for k in long], fmt, template)))
    raw, k = [], 0
    for pair in pairs:
        sides = []
        for _ in range(2):
            ids = all_ids[k]
            if not ids:
                raise CaptureError(f"model {model_name!r}: pair {pair.id!r} encodes to no tokens; "
                                   "there is no readout token. Fix: drop empty pairs or use a template.")
            nb = _leading(ids, bos_id)
            if nb > 1:
                raise CaptureError(
                    f"model {model_name!r}: pair {pair.id!r} starts with {nb} BOS tokens (id {bos_id}). "
                    "The template already contains the BOS and the tokenizer adds another. Fix: remove "
                    "the BOS from the template (plain) or use model.format=chat_template, which "
                    "tokenizes the template once.")
            bos_seen.add(nb)
            sides.append((ids, common_prefix(prompt_only[k], ids) if k in prompt_only else 0))
            k += 1
        raw.append((str(pair.id), sides[0][0], sides[1][0], sides[0][1], sides[1][1]))
    return raw


def encode_pairs(tokenizer, pairs: Sequence[Any], *, fmt: str = "plain",
                 template: str = "User: {prompt}\nAssistant: {response}", max_length: int = 512,
                 model_name: str = "model", truncated_responses: str = "exclude") -> EncodedPairs:
    """Encode ``pairs`` (objects with ``id, prompt, chosen, rejected, prompt_rejected``); see module doc."""
    if truncated_responses not in TRUNCATED_RESPONSES:
        raise SpecError("truncated_responses", f"unknown policy {truncated_responses!r}.",
                        value=truncated_responses, options=TRUNCATED_RESPONSES)
    if fmt not in FORMATS:
        raise SpecError("model.format", f"unknown format {fmt!r}.", value=fmt, options=FORMATS)
    if fmt == "plain" and ("{response}" not in template or "{prompt}" not in template):
        raise SpecError("model.template", f"template {template!r} must contain {{prompt}} and {{response}}.",
                        fix="write e.g. 'User: {prompt}\\nAssistant: {response}'.")
    if fmt == "chat_template" and not getattr(tokenizer, "chat_template", None):
        raise SpecError("model.chat_template", f"the tokenizer of {model_name!r} has no chat template.",
                        fix="use model.format=plain or give the tokenizer a chat_template.")
    if fmt == "messages" and not template and not getattr(tokenizer, "chat_template", None):
        raise SpecError("dataset.chat_template", f"the data are message lists, and the tokenizer of {model_name!r} "
                        "has no chat template to render them.",
                        fix="set dataset.chat_template=<Jinja chat template text>, or use a model with one.")
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise SpecError("model.max_length", f"must be an integer >= 2, got {max_length!r}.", value=max_length,
                        fix="e.g. model.max_length=2048.")
    bos_id = getattr(tokenizer, "bos_token_id", None)
    pairs = pairs if isinstance(pairs, Sequence) else list(pairs)    # sliced below: never all held as objects
    bos_seen: set[int] = set()
    ids_out: list[PairIds] = []          # per slice: no Python string per kept pair held
    chosen, rejected = (RowsBuilder(token_rows.SPILL_BYTES) for _ in range(2))   # per slice; no list of every pair's ids
    identical: list[str] = []
    resp_cut: list[str] = []
    prompt_cut: list[str] = []
    dropped_cut: list[str] = []
    n_trunc = 0
    step = max(1, ENCODE_SLICE // 2)
    for first in range(0, len(pairs), step):
        raw = _encode_slice(tokenizer, pairs[first:first + step], fmt, template, max_length, bos_id, model_name,
                            bos_seen)
        if len(bos_seen) > 1:
            raise CaptureError(f"model {model_name!r}: some sequences start with a BOS and some do not. "
                               "Fix: check for texts that begin with the literal BOS token string.")
        bos = next(iter(bos_seen))
        kept_c, kept_r, kept_ids = [], [], []
        for pid, c, r, pc, pr_len in raw:
            tc, tr = _truncate(c, bos, max_length), _truncate(r, bos, max_length)
            cut_response = False
            if len(c) > max_length or len(r) > max_length:
                n_trunc += 1
                sides = [(len(s) - max_length, p - bos) for s, p in ((c, pc), (r, pr_len)) if len(s) > max_length]
                if any(prompt_part > 0 for _, prompt_part in sides):
                    prompt_cut.append(pid)
                # dropped tokens beyond the prompt part (after the BOS) reach into the response
                cut_response = any(dropped > prompt_part for dropped, prompt_part in sides)
                if cut_response:
                    resp_cut.append(pid)
            if c != r and tc == tr:
                identical.append(pid)
                continue
            if cut_response and truncated_responses == "exclude":
                dropped_cut.append(pid)
                continue
            kept_ids.append(pid)
            kept_c.append(tc)
            kept_r.append(tr)
        ids_out.append(PairIds(kept_ids))
        chosen.append(TokenRows(kept_c))
        rejected.append(TokenRows(kept_r))
        del raw, kept_c, kept_r, kept_ids
    if not bos_seen:                     # no pair at all
        bos_seen.add(1 if bos_id is not None and getattr(tokenizer, "add_bos_token", False) else 0)
    bos = next(iter(bos_seen))
    if identical:
        warnings.warn(f"model {model_name!r}: {len(identical)} pair(s) became identical after truncation "
                      f"to max_length={max_length} and were excluded: {identical[:5]}", stacklevel=2)
    if resp_cut:
        what = (f"{len(dropped_cut)} were excluded (reason response_truncated)" if truncated_responses == "exclude"
                else "they are kept and flagged response_truncated")
        warnings.warn(f"model {model_name!r}: {len(resp_cut)} pair(s) do not fit max_length={max_length} even "
                      f"without their prompt, so their response start was cut ({resp_cut[:5]}); {what}. Fix: "
                      "raise model.max_length (up to the model's position limit).", stacklevel=2)
    chosen, rejected = chosen.rows(), rejected.rows()
    return EncodedPairs(pair_ids=PairIds.join(ids_out), chosen=chosen, rejected=rejected,
                        excluded={"identical_after_truncation": identical, "response_truncated": dropped_cut},
                        n_truncated=n_trunc, bos_count=bos, max_length=max_length, fmt=fmt,
                        response_truncated=resp_cut, prompt_truncated=prompt_cut,
                        template=template if fmt in ("plain", "messages") else "")
