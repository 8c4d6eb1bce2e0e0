"""Completing a run: one attempt's data published into the run group and named by the run document.

Its own module, above both ``store.attempts`` (the attempt and its leases) and ``store.publish`` (the
published groups and the root's consolidated metadata, whose ``root`` lease is an ``Attempt``): the
completion needs both, and neither imports it. It reaches ``store.publish``'s functions through the module
(``publication.consolidate``), so a test that plants a death in one of them reaches the completion too.
"""
from __future__ import annotations

import time

from reward_lens_spec.store import publish as publication
from reward_lens_spec.store._backend import DOC, RUNS, group_doc
from reward_lens_spec.store.attempts import PUBLISH, Attempt
from reward_lens_spec.store.log import append as append_to_log
from reward_lens_spec.store.state import complete_attrs


def complete(att: Attempt, run_attrs: dict, role: str, *, force: bool = False) -> bool:
    """Publish attempt ``att``'s observables into the run group and name it in the run document (its attrs
    ``run_attrs``, a JSON-safe dict, plus ``complete: true`` and ``attempt``); False when another writer
    completed first.

    Under the run's ``publish`` lease (one completing writer at a time): the published groups are
    replaced by this attempt's (``store.publish.publish``), the run is logged, then the run document is
    written (one atomic write); then, still under that lease (so a forced writer's unlisting is never
    overwritten by it), the root's consolidated metadata is brought up to date. Without ``force`` a run
    already complete is left as it is (the first stays listed). With ``force`` a complete run is first
    unlisted (its document emptied, the root's consolidated metadata without it) before its published
    groups are touched: a writer that dies while replacing them leaves the run absent, never listed over
    missing data or another writer's; a run the root's consolidated metadata still lists (a forced writer
    died after emptying its document) is dropped from it first too. Raises StoreError when this process
    no longer holds ``role`` of ``att``.
    """
    b, run_id = att.b, att.run_id
    att.fence(role)
    if not force and complete_attrs(b, run_id) is not None:
        return False
    lock = Attempt(b, run_id, PUBLISH, {}, lease_s=att.lease_s)
    try:
        while not lock.claim("publish"):          # another writer publishes this run now
            att.fence(role)
            if not force and complete_attrs(b, run_id) is not None:
                return False
            time.sleep(0.05)
        if not force and complete_attrs(b, run_id) is not None:
            return False

        def fence():
            att.fence(role)
            lock.fence("publish")

        listed = complete_attrs(b, run_id) is not None
        if listed or publication.root_lists(b, run_id):           # force, or a forced writer died unlisting it:
            fence()                                   # unlisted before its data are replaced
            if listed:
                b.write_atomic(f"{RUNS}/{run_id}/{DOC}", group_doc({}))
            publication.consolidate(b, [run_id])
        entries = publication.publish(att, run_attrs, fence)
        # seq under the seal, then the entry in the evidence log, then the document (store.log)
        run_attrs = append_to_log(b, run_id, run_attrs, fence=fence)
        doc = {"zarr_format": 3, "node_type": "group",
               "attributes": {**run_attrs, "complete": True, "attempt": att.aid}}
        b.write_atomic(f"{RUNS}/{run_id}/{DOC}", group_doc(doc["attributes"]))
        entries[f"{RUNS}/{run_id}"] = {**doc, "consolidated_metadata": {
            "kind": "inline", "must_understand": False, "metadata": {}}}
        try:              # still under the lease: a forced writer's unlisting is never overwritten by this
            publication.consolidate(b, known={run_id: entries})
        except Exception:                     # the run is complete: a failure here only delays plain readers
            pass
    finally:
        try:
            lock.release("publish")           # also after a failure: the next writer clears what is left
        finally:
            lock.close()
    return True
