"""Writing runs into a shared result store: each writer its own attempt, completion publishes one.

1. **root** (once per store, create-if-absent): ``zarr.json`` with
   ``reward_lens_spec_layout: 4`` and ``runs/zarr.json``. Created exclusively; afterwards only its
   consolidated metadata is rewritten (``store.publish.consolidate``), and ``migrate`` stamps the layout.
2. **attempt**: the writer claims a lease and creates ``_internal/attempts/<run_id>/<attempt>/``
   (``store.attempts``): a prefix no other writer writes, outside the Zarr hierarchy plain readers
   open. Nothing is ever deleted to make room: not a crashed writer's attempt, not a complete run's
   attempt under ``force``.
3. **data**: each observable goes to the attempt's group ``<observable>``, one subgroup
   per variable with that variable's own coordinates (``store.groups``), via
   ``Dataset.to_zarr(mode="w-", consolidated=False)`` (created exclusively, never a mode that deletes),
   every chunk with a ``crc32c`` checksum codec. The digest of every stored array
   (``store.digest``) goes into the run document, under its seal when it has one.
   Streaming runs write pair-chunk regions instead (``reward_lens_spec.streaming``).
4. **complete** (``store.completion``): while its lease holds, under the run's ``publish`` lease, the
   writer publishes its attempt's observables as ``runs/<run_id>/<observable>`` (one plain xarray Dataset
   each, ``store.publish``), logs the run, replaces the run document ``runs/<run_id>/zarr.json`` atomically
   by one with ``complete: true`` and ``attempt: <its attempt>``, and consolidates the root's metadata.
   Readers list only complete runs and read the groups published from the attempt that document names,
   so a displaced, slow or killed writer never changes what they see: its data lie in a prefix nobody lists.
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone

import xarray as xr

from reward_lens_spec.errors import StoreError
from reward_lens_spec.result import Result
from reward_lens_spec.store._attrs import attrs_problem, check_json_safe
from reward_lens_spec.store._backend import DOC, RUN_NAME, RUNS, Backend, store_handle
from reward_lens_spec.store.attempts import ATTEMPTS, Attempt, list_attempts
from reward_lens_spec.store.completion import complete
from reward_lens_spec.store.groups import write_variables, written_digests
from reward_lens_spec.store.layout import check_layout
from reward_lens_spec.store.state import run_state  # noqa: F401  (defined in store.state; importable from here as before)
from reward_lens_spec.store.digest import result_digests
from reward_lens_spec.store.groups import open_variables

RESERVED = ("run_id", "observables", "created", "complete", "store_write_s", "writer", "attempt", "data_digests")


def check_name(kind: str, name) -> str:
    """Return ``name`` if it is a safe single path segment, else raise StoreError."""
    if not isinstance(name, str) or not RUN_NAME.match(name):
        raise StoreError(f"{kind} {name!r} is not a valid name: use letters, digits and "
                         "'._=+-' (no '/', not starting with '.' or '_').")
    return name


def check_storable(res, observable: str, ops: dict | None = None, run_id: str | None = None) -> None:
    """Refuse, before anything is written, attrs a store cannot hold (Zarr attrs are JSON): the Dataset's
    (``Result.attrs``: plain JSON only) and every variable's and coordinate's (a top-level numpy array or
    scalar is fine, xarray converts it; nothing nested). ``ops``: variable -> the operator that made it,
    named in the message. Raises ``StoreError`` naming the run, the observable, the variable and the attr key."""
    obs = f"run {run_id} observable {observable}" if run_id else f"observable {observable}"
    where = [(obs, getattr(res, "attrs", None) or {}, False)]
    for name, var in res.items():
        label = f"{obs}, variable {name!r}" + (f" (operator {ops[name]})" if name in (ops or {})
                                                                 else "")
        where.append((label, var.attrs, True))
        where += [(f"{label}, coord {c!r}", x.attrs, True) for c, x in var.coords.variables.items() if x.attrs]
    for label, attrs, numpy_top in where:
        found = attrs_problem(attrs, numpy_top=numpy_top)
        if found:
            key, value = found
            text = repr(value)
            raise StoreError(f"{label}: attr {key} holds {text[:60] + '…' if len(text) > 60 else text} "
                             f"({type(value).__module__}.{type(value).__name__}); a store's attrs are JSON, so "
                             "nothing was written. Fix: give it plain values (.tolist() for an array, .item() for a "
                             "numpy scalar, str() otherwise) or return the array as a variable of its own.")

def data_group(run_id: str, attrs: dict, observable: str) -> str:
    """The Zarr group holding ``observable`` of a complete run: the Dataset published in the run group."""
    return f"{RUNS}/{run_id}/{observable}"


def stored_digests(zstore, group: str, names=None) -> dict:
    """``{variable: digest}`` (``store.digest``) of the observable stored at ``group``, from the stored
    arrays as a reader decodes them (block by block, on their zarr chunk grid)."""
    return result_digests(open_variables(zstore, group, names, lazy=True))


def with_digests(attrs: dict, digests: dict) -> dict:
    """``attrs`` with ``data_digests`` (``{observable: {variable: digest}}``); a sealed document
    (``content_hash``) is sealed again, so its seal covers the digests."""
    out = {k: v for k, v in attrs.items() if k != "content_hash"}
    out["data_digests"] = digests
    if "content_hash" in attrs:
        from reward_lens_spec.trust.evidence import seal

        return seal(out)
    return out


def _write_observable(b: Backend, res, group: str, attrs: dict, zstore=None, root: str = "") -> dict | None:
    """Write one observable (``Result`` or Dataset) as the group ``group``, one subgroup per variable
    (``store.groups``); returns what ``write_variables`` returns (the chunk shapes of a direct write).

    Local stores and dask-backed (streamed) outputs are written in place. In-memory outputs bound
    for an object store are encoded into a memory store first and its objects uploaded in one
    concurrent batch: the same bytes, far fewer round trips than zarr's per-array parent checks.
    """
    res = Result.of(res)
    if b.local or any(v.chunks is not None for v in res.values()):
        return write_variables(zstore or b.zarr_store(), res, group, attrs)
    import zarr.storage

    staged: dict = {}
    chunks = write_variables(zarr.storage.MemoryStore(store_dict=staged), res, group, attrs)
    prefix, base = group + "/", f"{root}/" if root else ""
    files = {b.path(base + k): v.to_bytes() for k, v in staged.items() if k.startswith(prefix)}
    b.put_many(files)
    return chunks


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# content only (no time): a resumed or sharded run's group attrs equal an uninterrupted run's
READER_KEYS = ("run_id", "trust", "model", "model_fingerprint", "model_family", "dataset", "dataset_checksum",
               "observable", "observable_version", "spec_hash", "effective_n", "frame")


def observable_attrs(run_attrs: dict, ds) -> dict:
    """What a reader with plain xarray needs on the observable group itself: run id, trust, a provenance
    summary (``READER_KEYS`` of the run's attrs; the full record stays on the run group), and per
    variable its ``gauge`` and ``units``."""
    out = {k: run_attrs[k] for k in READER_KEYS if k in run_attrs}
    out["gauge"] = {v: str(ds[v].attrs.get("gauge", "")) for v in ds.data_vars}
    out["units"] = {v: str(ds[v].attrs.get("units", "")) for v in ds.data_vars}
    out["provenance"] = "full record in the attrs of the parent group runs/<run_id>"
    return {**ds.attrs, **out}


def write_run(url, run_id: str, results: dict, attrs: dict, *,
              storage_options: dict | None = None, force: bool = False) -> bool:
    """Write one run's observables and provenance into the store ``url`` (a URL or an open handle,
    ``store_handle``); True if written, False if reused.

    ``results`` maps observable name -> ``xarray.Dataset``; ``attrs`` is the
    run's JSON-safe provenance (config YAML, spec hash, fingerprints, ...).
    A run already complete is left alone (returns False) unless ``force``; a
    writer that finishes after another completed the same run id (no ``force``)
    discards its own attempt and returns False. Raises StoreError for invalid
    names, non-JSON attrs (naming the key), reserved attr keys, an unusable
    store, a symlinked run folder, or a failed write (this writer's attempt is
    then removed, best effort; nothing listed is touched, except that a ``force``
    write failing while it publishes leaves the run it replaces unlisted:
    ``store.completion``).
    """
    check_name("run_id", run_id)
    if not isinstance(results, dict) or not results:
        raise StoreError(f"run {run_id}: results must be a non-empty dict observable -> Dataset.")
    for obs, ds in results.items():
        check_name("observable", obs)
        if not isinstance(ds, (xr.Dataset, Result)):
            raise StoreError(f"run {run_id}: results[{obs!r}] is {type(ds).__name__}, "
                             "not an xarray.Dataset or a reward_lens_spec.Result.")
    if not isinstance(attrs, dict):
        raise StoreError(f"run {run_id}: attrs must be a dict, got {type(attrs).__name__}.")
    check_json_safe(attrs, "attrs")
    clash = sorted(set(attrs) & set(RESERVED))
    if clash:
        raise StoreError(f"run {run_id}: attrs key(s) {clash} are reserved by the store "
                         f"({', '.join(RESERVED)}). Fix: rename them.")

    b = store_handle(url, storage_options)
    check_layout(b, create=True)
    for obs, ds in results.items():                # before the run folder exists: nothing left behind
        check_storable(Result.of(ds), obs, run_id=run_id)
    b.check_inside(f"{RUNS}/{run_id}")
    state, _ = run_state(b, run_id)
    if state == "complete" and not force:
        return False
    t0 = time.perf_counter()
    att = Attempt.create(b, run_id, {"kind": "write"}, role="write")
    run_attrs = {**attrs, "run_id": run_id, "observables": sorted(results), "created": _now(),
                 "writer": att.writer}
    won = False
    try:
        digests = {}
        for obs in sorted(results):
            att.fence("write")
            try:
                res = Result.of(results[obs])
                chunks = _write_observable(b, res, obs, observable_attrs(run_attrs, res), att.zstore("write"),
                                           att.prefix)
                # digests of what was written, decoded as a reader decodes it; else read back
                digests[obs] = ((written_digests(res, chunks) if chunks is not None else None)
                                or stored_digests(att.zarr_store(), obs))
            except Exception as e:
                raise StoreError(f"store {b.url}: writing run {run_id} observable {obs} failed "
                                 f"({type(e).__name__}: {e}).") from e
        run_attrs = with_digests(run_attrs, digests)
        run_attrs["store_write_s"] = round(time.perf_counter() - t0, 3)
        won = complete(att, run_attrs, "write", force=force)
        att.release("write")
    except BaseException:
        if not won:
            _discard(att)
        raise
    finally:
        att.close()
    if not won:                       # another writer completed this run id first: its data stay listed
        _discard(att)
    return won


def _discard(att: Attempt) -> None:
    """Remove this process's own unlisted attempt (best effort; gc collects what is left)."""
    try:
        att.remove()
    except Exception:
        pass



def discard_unstarted(att: Attempt) -> bool:
    """After a failed streamed write: remove ``att`` when no chunk of it is stored and no other writer holds a
    role in it, then the run folder when nothing else is left there (its empty placeholder), so a run that
    failed before its first chunk leaves nothing behind. Best effort; True when the attempt went."""
    try:
        for role in list(att.leases()):
            if att.generation(role) is not None:
                att.release(role)             # ours: released, so only other writers' leases count as live
        if att.named() or att.chunks_done() or att.live_roles():
            return False
        att.close()
        att.remove()
        b, run = att.b, f"{RUNS}/{att.run_id}"
        if b.local:
            _rmdir_empty(b, f"{ATTEMPTS}/{att.run_id}")
        if not list_attempts(b, att.run_id) and run_state(b, att.run_id)[0] == "absent":
            b.remove_file(f"{run}/{DOC}")      # the empty placeholder; then the folder, only if empty
            if b.local:
                os.rmdir(b.path(run))
        return True
    except Exception:
        return False

def _rmdir_empty(b: Backend, key: str) -> None:
    try:
        os.rmdir(b.path(key))                 # only if empty
    except OSError:
        pass


def is_complete(url, run_id: str, *, storage_options: dict | None = None) -> bool:
    """True when ``runs/<run_id>`` exists in the store ``url`` (a URL or an open handle, ``store_handle``) and
    its run document says ``complete: true``.

    A missing store or run gives False; an unreachable store raises StoreError.
    """
    check_name("run_id", run_id)
    b = store_handle(url, storage_options)
    b.check_not_file()
    return run_state(b, run_id)[0] == "complete"
