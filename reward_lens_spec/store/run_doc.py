"""One complete run's provenance, trust derived, from the store's JSON documents alone (no xarray, pandas or zarr).

A rerun that ``run.reuse`` decides from bytes needs only the run document (``runs/<id>/zarr.json``),
the other complete runs' documents and the evidence log, to print the run's line; opening the store
through ``reader.Store`` imports xarray and pandas, which cost more than the rest of a rerun. This is
``Store.provenance`` built from the same parts (``state.run_state``, ``log.read_log``,
``trust.evidence_chain.Evidence``), for the runs whose derived trust needs no array: an adjudication record
(whose trust re-reads the arrays of the runs it scored) gives ``None``, and the caller opens the store.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store._backend import DOC, LAYOUT_KEY, LAYOUT_VERSION, RUN_NAME, store_handle
from reward_lens_spec.store.state import run_state
from reward_lens_spec.store.log import read_log
from reward_lens_spec.trust.evidence_chain import Evidence


def complete_provenance(url, run_id: str, *, storage_options: dict | None = None) -> dict | None:
    """``Store(url).provenance(run_id)`` (``url``: a store URL or handle, ``store.store_handle``) when ``run_id`` is complete in a store of this package's layout and its
    trust needs no array read; else ``None`` (absent, incomplete, another layout, an adjudication record, or a
    store that cannot be read: the caller decides the slow way)."""
    if not isinstance(run_id, str) or not RUN_NAME.match(run_id):
        return None
    try:
        b = store_handle(url, storage_options)
        root = b.read_json(DOC)
        if not isinstance(root, dict) or (root.get("attributes") or {}).get(LAYOUT_KEY) != LAYOUT_VERSION:
            return None
        state, attrs = run_state(b, run_id)
        if state != "complete" or attrs.get("kind") == "adjudication":
            return None
        ids = b.list_runs()
        with ThreadPoolExecutor(1 if b.local else min(16, max(1, len(ids)))) as pool:   # as ``Store._scan``
            states = list(pool.map(lambda r: run_state(b, r), ids))
        docs = {r: a for r, (s, a) in zip(ids, states) if s == "complete"}
        verdict = Evidence(docs, read_log(b)).derive(run_id)
    except (StoreError, ValueError, OSError):
        return None
    return {**attrs, **verdict}
