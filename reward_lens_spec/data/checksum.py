"""Content checksums and effective sample size of a set of pairs.

Checksums (``pair_hash``, ``dataset_checksum``) hash the EXACT text the formatter turns into
tokens: no Unicode normalization, no line-ending rewrite, because ``"caf\\u00e9"`` and
``"cafe\\u0301"``, or ``"\\r\\n"`` and ``"\\n"``, tokenize differently and so give different
numbers.

Normalization (``normalize``: Unicode NFC, then ``"\\r\\n"`` -> ``"\\n"``) is used only to COUNT
independent comparisons (``effective_sample_size``, ``prompt_cluster_key``): two spellings of
one text are one comparison for the sample size, never one input for identity.
"""
from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any, Iterable, Mapping

import numpy as np

CHECKSUM_FIELDS = ("prompt", "prompt_rejected", "chosen", "rejected", "dimension")
LABEL_META = ("group", "agreement", "votes", "step_labels")   # meta keys that count (see pair_hash)


def normalize(text: str | None) -> str | None:
    """NFC-normalize ``text`` and turn ``\\r\\n`` into ``\\n`` (``None`` stays ``None``)."""
    if text is None:
        return None
    return unicodedata.normalize("NFC", str(text)).replace("\r\n", "\n")


def _get(pair: Any, name: str) -> Any:
    if isinstance(pair, Mapping):
        return pair.get(name)
    return getattr(pair, name, None)


def pair_hash(pair: Any) -> str:
    """sha256 hex of one pair's exact content (code points as given; nothing normalized).

    The content is ``prompt, prompt_rejected, chosen, rejected, dimension``, plus the label
    fields ``group``, ``agreement``, ``votes`` and ``step_labels`` (a stepwise row's, ``data.readers``) of
    ``meta`` where a pair has any (the
    preference-structure operators read them; a pair without them hashes as before). The id,
    rubric, source and other meta do not count. A ``prompt_rejected`` equal to ``prompt`` counts
    as absent. Generated pair ids (``data.loaders``) are built from it.
    """
    prompt = str(_get(pair, "prompt") or "")
    pr = _get(pair, "prompt_rejected")
    pr = None if pr is None or str(pr) == prompt else str(pr)
    values = [prompt, pr, str(_get(pair, "chosen") or ""), str(_get(pair, "rejected") or ""),
              str(_get(pair, "dimension") or "")]
    meta = dict(_get(pair, "meta") or ())
    labels = {k: meta[k] for k in LABEL_META if meta.get(k) is not None}
    if labels:
        values.append(labels)
    blob = json.dumps(values, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def dataset_checksum(pairs: Iterable[Any]) -> str:
    """sha256 hex of the sorted per-pair hashes (``pair_hash``), one per line.

    It does not depend on pair order or ids (a run id covers those through the token ids it
    hashes, ``models.formatting.EncodedPairs.digest``). Duplicates count: it is the checksum of
    a multiset. Any change of one code point in a hashed field changes it, including Unicode
    form (NFC vs NFD) and line endings. Accepts ``Pair``s, a ``PairSet`` or mappings with the
    same keys.
    """
    return checksum_of_digests(np.array([bytes.fromhex(pair_hash(p)) for p in pairs], dtype="S32").reshape(-1))


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def checksum_of_digests(digests: np.ndarray, block: int = 8192) -> str:
    """``dataset_checksum`` from the pairs' raw sha256 digests (``S32``, dims ``pair``, any order): the same
    text (sorted lowercase hex, one per line) hashed ``block`` lines at a time, so ~65 bytes a line of it are
    never held at once (100,000 pairs: ~18 MB of text and line strings otherwise)."""
    raw = np.sort(np.asarray(digests, dtype="S32")).view(np.uint8).reshape(-1, 32)
    text = hashlib.sha256()
    for a in range(0, len(raw), block):
        part = raw[a:a + block]
        lines = np.empty((len(part), 65), np.uint8)
        lines[:, 0:64:2], lines[:, 1:64:2], lines[:, 64] = _HEX[part >> 4], _HEX[part & 15], ord("\n")
        text.update(memoryview(lines).cast("B")[:-1] if a + block >= len(raw) else lines)
    return text.hexdigest()


def prompt_cluster_key(prompt: str | None) -> str:
    """The key two prompts share when they fall in one cluster.

    The key is the normalized prompt (``normalize``), lowercased, with every run of whitespace
    collapsed to one space and the ends stripped.
    """
    return " ".join((normalize(prompt or "") or "").lower().split())


def effective_sample_size(pairs: Iterable[Any]) -> dict[str, int]:
    """How many independent comparisons the pairs really hold.

    - ``n``: the number of pairs.
    - ``n_unique``: distinct normalized ``(prompt, chosen, rejected)`` triples (``normalize``:
      NFC plus ``\\r\\n`` -> ``\\n``). Exact repeats of a comparison count once.
    - ``n_prompt_clusters``: distinct prompts, using the rule of ``prompt_cluster_key``
      (normalize, lowercase, collapse whitespace runs to one space, strip). Pairs that share a
      prompt are not independent, so this is a lower bound on the sample size.
    """
    items = list(pairs)
    triples = {(normalize(_get(p, "prompt") or ""), normalize(_get(p, "chosen") or ""),
                normalize(_get(p, "rejected") or "")) for p in items}
    clusters = {prompt_cluster_key(_get(p, "prompt")) for p in items}
    return {"n": len(items), "n_unique": len(triples), "n_prompt_clusters": len(clusters)}
