"""The store's evidence log: an append-only, hash-chained record of every completed run document.

``<store>/_internal/log/<seq, 12 digits>.json``, one entry per completion (``store.completion``)::

    {"seq": n, "kind": "scorecard"|"study"|"adjudication"|"run", "id": run id,
     "doc": content hash of the document as completed, "created": its sealed time,
     "prev": hash of entry n-1 ("" for entry 0), "hash": sha256 of this entry's canonical JSON
     (without "hash" and "sig"), ["signer": key id, "sig": ed25519 over "hash"]}

Appending: the document gets ``seq = n`` under its seal (``trust.evidence.seal``: a document that
carries ``seq`` has its ``created`` sealed too), then entry ``n`` is **created exclusively** — the
primitive the attempts' leases are claimed with (a hard link locally, ``If-None-Match`` on object
stores). Two appenders that read the same head race for the same file; exactly one creates it and the
other re-reads the head and retries at ``n + 1``, so the chain never forks and no entry is lost or
overwritten. The writer is fenced (its lease still held) right before the entry is created, and the
run document is written only after its entry exists. An entry whose document never completed (a
killed writer, or another writer completed first) orders nothing.

Reading (``read_log``): entries ``0, 1, 2, …`` must be contiguous, each holding its own ``seq``,
chaining to its predecessor's hash and hashing to its ``hash``. At the first entry that fails (edited,
removed, reordered, garbage) the chain stops: that entry and every later one order nothing, and the
documents they logged read as not in the log. Which keys are trusted and whether signers are required
is the READER's policy (``store.trust_root``: a lab trust file the reader names), never the store's
``keys/``: an entry signed by a trusted key must verify; where signers are required, an unsigned entry or
one by a key not pinned for this store orders nothing either (the chain continues past it). Ordering,
"frozen before the run" and which runs an adjudication scores all use ``seq``, never a wall clock (``trust.evidence``).
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store._backend import INTERNAL, Backend
from reward_lens_spec.store.trust_root import policy
from reward_lens_spec.trust.evidence import content_hash, seal
from reward_lens_spec.store.signing import available, key_id, public_hex, sign, signing_key, verify

LOG = f"{INTERNAL}/log"
_ENTRY = re.compile(r"^(?P<seq>\d{12})\.json$")
_UNHASHED = ("hash", "sig")


def entry_key(seq: int) -> str:
    return f"{LOG}/{seq:012d}.json"


def entry_hash(entry: dict) -> str:
    body = {k: v for k, v in entry.items() if k not in _UNHASHED}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _seqs(b: Backend) -> list[int]:
    return sorted(int(m["seq"]) for m in map(_ENTRY.match, b.list_files(LOG)) if m)


def _head(b: Backend) -> tuple[int, str]:
    """``(next seq, hash of the last entry)``."""
    seqs = _seqs(b)
    if not seqs:
        return 0, ""
    try:
        last = b.read_json(entry_key(seqs[-1])) or {}
    except ValueError:
        last = {}
    return seqs[-1] + 1, str(last.get("hash", ""))


def append(b: Backend, run_id: str, attrs: dict, fence=None) -> dict:
    """Log the completion of ``run_id``; return ``attrs`` with its ``seq`` (resealed when sealed).

    ``fence``: called right before the entry is created (raises when the writer lost its lease).
    Signs the entry with ``REWARD_LENS_SPEC_SIGN_KEY`` when set (``store.signing``). Raises StoreError
    when the store cannot be written or the key cannot be read.
    """
    key = signing_key()
    for _ in range(1000):
        n, prev = _head(b)
        doc = {k: v for k, v in attrs.items() if k != "content_hash"}
        doc["seq"] = n
        doc = seal(doc) if "content_hash" in attrs else doc
        entry = {"seq": n, "kind": str(doc.get("kind") or "run"), "id": run_id, "doc": content_hash(doc),
                 "created": doc.get("created"), "prev": prev}
        if key is not None:
            entry["signer"] = key_id(public_hex(key))
        entry["hash"] = entry_hash(entry)
        if key is not None:
            entry["sig"] = sign(key, entry["hash"])[1]
        if fence is not None:
            fence()
        if b.create_exclusive(entry_key(n), json.dumps(entry, sort_keys=True).encode()):
            return doc
        time.sleep(random.uniform(0, 0.02))              # another appender took seq n: re-read the head
    raise StoreError(f"store {b.url}: could not append run {run_id} to the evidence log (1000 tries lost).")


class LogView:
    """The verified log of one store, as read now: which documents it orders and at which ``seq``;
    ``policy``: the reader's signer policy it was verified under (``store.trust_root.Policy``)."""

    def __init__(self, entries: list[dict], by_doc: dict, error: str | None, next_seq: int, policy=None):
        self.entries, self.by_doc, self.error, self.next_seq = entries, by_doc, error, next_seq
        self.policy = policy

    @classmethod
    def empty(cls) -> "LogView":
        return cls([], {}, None, 0)

    def order(self, run_id: str, doc_hash: str, sealed_seq) -> tuple[int | None, str]:
        """``(seq, "")`` when the log orders this document, else ``(None, why not)``."""
        hit = self.by_doc.get((run_id, doc_hash))
        if hit is None:
            why = "it is not in the store's evidence log (written before the log, or its document or log " \
                  "entry was edited or removed)"
            return None, why + (f"; the log is broken: {self.error}" if self.error else "")
        seq, problem = hit
        if problem:
            return None, f"its log entry {seq} {problem}"
        if sealed_seq != seq:
            return None, f"its sealed seq {sealed_seq!r} differs from its log entry {seq}"
        return seq, ""


def read_log(b: Backend) -> LogView:
    """Read and verify the whole log under the reader's signer policy (``store.trust_root.policy``: the
    reader's trust file, never the store's ``keys/``); never raises for a damaged log (``SpecError`` for an
    unreadable trust file)."""
    pol = policy(b)
    seqs = _seqs(b)

    def load(s):
        try:
            return b.read_json(entry_key(s))
        except ValueError:
            return None

    workers = 1 if b.local else min(16, max(1, len(seqs)))
    with ThreadPoolExecutor(workers) as pool:
        docs = list(pool.map(load, seqs))
    keys, required = pol.keys, pol.required
    by_doc, entries, prev, error = {}, [], "", None
    for want, (s, e) in enumerate(zip(seqs, docs)):
        if s != want:
            error = f"entry {want} is missing (the next is {s})"
        elif not isinstance(e, dict):
            error = f"entry {s} is not valid JSON"
        elif e.get("seq") != s:
            error = f"entry file {s} holds seq {e.get('seq')!r} (moved or reordered)"
        elif e.get("prev") != prev:
            error = f"entry {s} does not chain to entry {s - 1} (an entry was edited, removed or reordered)"
        elif entry_hash(e) != e.get("hash"):
            error = f"entry {s} does not hash to its hash (edited after it was written)"
        if error:
            break
        by_doc[(str(e.get("id")), str(e.get("doc")))] = (s, _signature_problem(e, keys, required))
        entries.append(e)
        prev = e["hash"]
    return LogView(entries, by_doc, error, len(seqs) if error is None else max(seqs, default=-1) + 1, pol)


def _signature_problem(e: dict, keys: dict, required: bool) -> str | None:
    signer = e.get("signer")
    if signer is None:
        return "is unsigned and the store requires signers" if required else None
    if signer not in keys:
        return f"is signed by key {signer}, not a trusted key of this store (none pinned for it by the reader's " \
               "trust file)" if required else None
    if not available():
        return "is signed and signatures cannot be checked here (pip install 'reward_lens_spec[sign]')" \
            if required else None
    if not verify(keys[signer]["public_key"], str(e.get("hash")), str(e.get("sig"))):
        return f"has a signature that does not verify with key {signer} (forged or edited)"
    return None
