"""``store migrate``: bring a store this package wrote under an older layout to layout 4.

Layouts 1–3 kept attempts (``runs/<run_id>/attempt-…/``) inside the run group and the evidence log
(``log/``) and listed keys (``keys/``) at the root, all inside the Zarr hierarchy. Migration moves them
under ``_internal/`` (``log/`` → ``_internal/log/``, ``keys/`` → ``_internal/keys/``, every attempt →
``_internal/attempts/<run_id>/``), publishes each complete run's observables from the attempt its document
names into ``runs/<run_id>/<observable>`` (``store.publish``; chunks copied, never re-encoded, so the
sealed digests still hold), stamps ``reward_lens_spec_layout: 4`` on the root (its other attrs kept) and
writes the root's consolidated metadata. Run documents, seals and log entries are not changed. A layout-4
store is left as it is, except that its publications and consolidated metadata are brought up to date
(what a writer killed between completing and consolidating left behind).

A root this package did not write — no ``reward_lens_spec_layout`` attr and not the pre-attr shape (empty
root attrs, a ``runs`` group, nothing else but ``log``/``keys``) — is refused before anything changes.
"""
from __future__ import annotations

import json
import os

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store._backend import DOC, INTERNAL, LAYOUT_KEY, LAYOUT_VERSION, RUNS, Backend, store_handle
from reward_lens_spec.store.attempts import ATTEMPTS, PREFIX, PUBLISH, Attempt
from reward_lens_spec.store.keys import KEYS
from reward_lens_spec.store.log import LOG
from reward_lens_spec.store.publish import ATTEMPT, VARIABLES, consolidate, publish_group, published_group
from reward_lens_spec.store.state import run_state

OLD_LOG, OLD_KEYS = "log", "keys"               # layouts 1–3: beside runs/ at the root


def _ours(b: Backend, attrs: dict) -> bool:
    """A root without the layout attr that this package wrote before it had one: empty attrs, a ``runs``
    group, and nothing else at the root but the log, the keys and ``_internal``."""
    if attrs:
        return False
    try:
        runs = b.read_json(f"{RUNS}/{DOC}")
    except ValueError:
        return False
    if not runs or runs.get("node_type") != "group":
        return False
    names = set(b.list_dirs("")) | set(b.list_files(""))
    return names <= {DOC, RUNS, OLD_LOG, OLD_KEYS, INTERNAL}


def _move(b: Backend, src: str, dst: str) -> None:
    """Move the folder ``src`` to ``dst`` (keys); nothing when ``src`` is absent. Run again after an
    interruption, it completes the move (``dst`` already there is merged into, never nested in)."""
    b.check_inside(src)
    b.check_inside(dst)
    try:
        if b.local:
            if not os.path.isdir(b.path(src)):
                return
            os.makedirs(os.path.dirname(b.path(dst)), exist_ok=True)
            if os.path.exists(b.path(dst)):               # an interrupted migration: merge what is left
                for name in os.listdir(b.path(src)):
                    _move(b, f"{src}/{name}", f"{dst}/{name}")
                os.rmdir(b.path(src))
            else:
                os.rename(b.path(src), b.path(dst))
            return
        # object stores: every object copied to its own key, then the source removed. Not ``fs.mv``: an
        # interrupted one leaves ``dst`` behind, and moving into an existing ``dst`` nests ``src`` inside it
        # (``dst/<name>/...``, where no reader looks); this is the same whichever run of it finishes.
        base = b.path(src)
        found = [p for p in b.fs.find(base, withdirs=False) if p.startswith(base + "/")]
        if found:
            b.fs.copy(found, [b.path(dst) + p[len(base):] for p in found])
            b.fs.rm(base, recursive=True)
            b.fs.invalidate_cache(base)
    except StoreError:
        raise
    except Exception as e:
        raise b._fail(f"move {src} to {dst}", e) from e


def _list_plain(b: Backend, group: str) -> None:
    """Give a run group written before layout 3 (one Dataset, no listing) its ``output_variables``."""
    import xarray as xr

    from reward_lens_spec.store._backend import group_doc

    doc = b.read_json(f"{group}/{DOC}") or {}
    attrs = dict(doc.get("attributes") or {})
    if VARIABLES in attrs:
        return
    ds = xr.open_zarr(b.zarr_store(), group=group, consolidated=False, zarr_format=3)
    b.write_atomic(f"{group}/{DOC}", group_doc({**attrs, VARIABLES: list(ds.data_vars), ATTEMPT: None}))


def _publish_run(b: Backend, run_id: str) -> None:
    """Publish the observables of a complete run that are not (or not wholly) published from the attempt its
    document names; under the run's ``publish`` lease, the document read again there (a forced writer may
    have replaced the run meanwhile: its groups are never overwritten with the attempt it replaced).

    Raises StoreError (one line) when such a run's ``publish`` lease is held by another process: the run is
    listed by its document, so migration must not go on as if it were published."""
    state, attrs = run_state(b, run_id)
    if state != "complete":
        return
    aid = attrs.get("attempt")
    if not aid:                                       # layout 1: the data are in the run group already
        for obs in attrs.get("observables") or []:
            _list_plain(b, published_group(run_id, obs))
        return
    if not _unpublished(b, run_id, attrs):
        return
    lock = Attempt(b, run_id, PUBLISH, {})
    if not lock.claim("publish"):      # skipping would list a complete run over data not published
        raise StoreError(f"store migrate: run {run_id} is complete but not yet published, and its publication "
                         "lease is held by another process (a migrate or writer at work, or one that died less "
                         f"than {lock.lease_s:g} s ago); the layout was not changed past it. Fix: run store "
                         "migrate again once that process has ended.")
    try:
        state, attrs = run_state(b, run_id)
        if state != "complete" or attrs.get("attempt") != aid:
            return
        for obs in _unpublished(b, run_id, attrs):
            dst = published_group(run_id, obs)
            b.remove_tree(dst)
            publish_group(b, f"{ATTEMPTS}/{run_id}/{aid}/{obs}", dst, aid)
    finally:
        try:
            lock.release("publish")
        finally:
            lock.close()


def _unpublished(b: Backend, run_id: str, attrs: dict) -> list[str]:
    """The observables of a complete run (``attrs``: its document's) whose published group does not name the
    attempt the document names, which that attempt holds.

    Raises StoreError (one line) for one the attempt does not hold either: the run's data for it are gone
    (removed by hand or damaged), and migrating on would list the run over data no reader finds."""
    aid, out = attrs.get("attempt"), []
    for obs in attrs.get("observables") or []:
        try:
            have = (b.read_json(f"{published_group(run_id, obs)}/{DOC}") or {}).get("attributes") or {}
        except ValueError:
            have = {}
        if have.get(ATTEMPT) == aid:
            continue
        if not b.exists_key(f"{ATTEMPTS}/{run_id}/{aid}/{obs}/{DOC}"):
            raise StoreError(f"store migrate: run {run_id} is complete, but its observable {obs!r} is neither "
                             f"published from its attempt {aid} nor held by it (removed or damaged), so its data "
                             "are gone; the layout was not changed past it. Fix: remove the folders "
                             f"{RUNS}/{run_id} and {ATTEMPTS}/{run_id} from the store, run store migrate again, "
                             "then run that study again.")
        out.append(obs)
    return out


def migrate(url: str, *, storage_options: dict | None = None) -> int:
    """Bring the store at ``url`` to this package's layout (module doc); return the layout version.

    Raises StoreError (one line) for a missing or garbage root, a store from a newer version, or a Zarr
    group this package did not write (nothing is changed then).
    """
    from reward_lens_spec.store.layout import check_layout

    b = store_handle(url, storage_options)
    b.check_not_file()
    try:
        doc = b.read_json(DOC)
    except ValueError as e:
        raise StoreError(f"store {url}: root zarr.json is not valid JSON ({e}).") from e
    if doc is None:
        raise StoreError(f"no result store at {url} (no zarr.json); nothing to migrate.")
    attrs = dict(doc.get("attributes") or {})
    version = attrs.get(LAYOUT_KEY)
    if version is None and not _ours(b, attrs) or version is not None and not isinstance(version, int):
        raise StoreError(f"store migrate: {url} is a Zarr group reward_lens_spec did not write (no "
                         f"{LAYOUT_KEY} attribute and no runs/ group of its own); nothing was changed. "
                         "Fix: point url= at a result store this package wrote.")
    if version is not None and version > LAYOUT_VERSION:
        return check_layout(b)                         # refuses: newer than this package
    if version != LAYOUT_VERSION:
        _move(b, OLD_LOG, LOG)
        _move(b, OLD_KEYS, KEYS)
        for run_id in b.list_runs():
            for child in b.list_dirs(f"{RUNS}/{run_id}"):
                if child.startswith(PREFIX):
                    _move(b, f"{RUNS}/{run_id}/{child}", f"{ATTEMPTS}/{run_id}/{child}")
    for run_id in b.list_runs():
        _publish_run(b, run_id)
    if version != LAYOUT_VERSION:
        doc = b.read_json(DOC) or doc
        doc["attributes"] = {**(doc.get("attributes") or {}), LAYOUT_KEY: LAYOUT_VERSION}
        b.write_atomic(DOC, json.dumps(doc, indent=2, sort_keys=True).encode())
    consolidate(b, rebuild=True)
    return check_layout(b)
