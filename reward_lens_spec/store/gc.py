"""``store gc``: remove what no live writer holds and no reader lists.

Garbage is an attempt (``store.attempts``, under ``_internal/attempts/<run_id>/``) that no
complete run document names, whose leases are all released or dead and whose last heartbeat is
older than the age limit, and a run folder left with nothing but a placeholder, a crashed
writer's partial publication or a crashed pre-attempt writer's partial data. Deletion goes entry by entry — never a whole
run folder at once, so an attempt a new writer creates meanwhile survives — and
never through a symlink (``Backend.check_inside``).
"""
from __future__ import annotations

import os
import time
from datetime import datetime

from reward_lens_spec.store._backend import DOC, RUNS, Backend
from reward_lens_spec.store.attempts import ATTEMPTS, PUBLISH, Attempt, list_attempts
from reward_lens_spec.store.publish import consolidate, root_lists
from reward_lens_spec.store.state import complete_attrs

GC_AGE_S = 3600.0            # default age limit: a dead writer's attempt stays an hour


def _young(last: float | None, now: float, older_than_s: float) -> bool:
    return older_than_s > 0 and last is not None and now - last < older_than_s


def _created(attrs: dict | None) -> float | None:
    try:
        return datetime.fromisoformat(str((attrs or {})["created"])).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def collect_run(b: Backend, run_id: str, older_than_s: float = GC_AGE_S) -> list[str]:
    """Collect one run's garbage; return ``[run_id]`` if the run went, else its removed ``run_id/attempt``s.

    An attempt is removed only when no live lease holds it and, read after that, the run document does not
    name it (a writer releases its role only after completing). The run folder is removed only under the
    run's ``publish`` lease (the one every completion holds), the run read again there: a writer that
    completed the run during this pass keeps it listed, whole."""
    from reward_lens_spec.store.writer import run_state

    if b.is_link(f"{RUNS}/{run_id}") or b.is_link(f"{ATTEMPTS}/{run_id}"):
        return []
    now = time.time()
    removed, held = [], False
    for aid in list_attempts(b, run_id):
        att = Attempt.open(b, run_id, aid) or Attempt(b, run_id, aid, {})
        if att.live_roles() or _young(att.last_activity(), now, older_than_s):
            held = True
            continue
        if att.named():
            continue
        att.remove()
        removed.append(f"{run_id}/{aid}")
    state, attrs = run_state(b, run_id)
    if state == "complete" or held or state == "absent" and not b.run_exists(run_id):
        return removed
    if state == "incomplete" and attrs and _young(_created(attrs), now, older_than_s):
        return removed                            # a pre-attempt writer's run, still young
    lock = Attempt(b, run_id, PUBLISH, {})
    if not lock.claim("publish"):                 # a writer completes this run now
        return removed
    try:                                          # read again under the lease every completion holds
        if complete_attrs(b, run_id) is not None or \
                set(list_attempts(b, run_id)) - {r.split("/", 1)[1] for r in removed}:
            lock.release("publish")               # completed meanwhile, or a new writer's attempt
            return removed
        b.remove_file(f"{RUNS}/{run_id}/{DOC}")
        for child in b.list_dirs(f"{RUNS}/{run_id}"):   # a partial publication, or a pre-attempt writer's data
            b.remove_tree(f"{RUNS}/{run_id}/{child}")
        if root_lists(b, run_id):                 # a forced writer died unlisting it: plain readers' view too
            consolidate(b, [run_id])
    finally:
        lock.close()              # (a lease not released stays live until it is removed below)
    b.remove_tree(f"{ATTEMPTS}/{run_id}/{PUBLISH}")
    if b.local:
        for key in (f"{ATTEMPTS}/{run_id}", f"{RUNS}/{run_id}"):
            try:
                os.rmdir(b.path(key))             # only if empty: a new writer's attempt stays
            except OSError:
                pass
    return [run_id]
