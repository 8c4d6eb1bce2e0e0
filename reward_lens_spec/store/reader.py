"""Reading a result store: catalog, lazy loading, provenance, diff, export, gc.

Needs no model and no torch. Only runs whose run document
(``runs/<run_id>/zarr.json``) carries ``complete: true`` are results, read from
the Datasets published in the run group (``runs/<run_id>/<observable>``, ``store.published``); the rest
are in progress, crashed (``incomplete()``) or unreadable (``corrupt()``), and
none of them stops the good runs from being listed or loaded.

Catalog columns come from the run attrs the writer was given:
``model_fingerprint``, ``model`` (or ``model_name``; a dict's ``name``),
``dataset`` (or ``dataset_name``), ``dataset_checksum``, ``spec_hash``,
``wall_s``; plus the store's own ``run_id``, ``observables``, ``created``, and the derived
``trust`` and ``trust_verified``.
``Store.diff`` compares the ``config_yaml`` (or ``config``) attr.

Trust is never read from a stored label: ``trust`` (in ``runs()``,
``provenance``, each loaded variable's ``trust`` attr) is derived on every read
from the store's evidence chain (``trust.evidence``; variable attrs: sealed runs only);
``trust_verified`` is false,
with ``trust_reason``, when the stored label disagrees or a document fails to
verify. ``document(run_id)`` gives the attrs exactly as stored.
"""
from __future__ import annotations

import difflib
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import xarray as xr
import yaml

from reward_lens_spec.errors import StoreError, did_you_mean
from reward_lens_spec.result import Result
from reward_lens_spec.store._attrs import encode_json_attrs
from reward_lens_spec.store._backend import Backend, store_handle
from reward_lens_spec.store.gc import GC_AGE_S, collect_run
from reward_lens_spec.store.published import open_published
from reward_lens_spec.store.layout import check_layout
from reward_lens_spec.store.writer import check_name, data_group, run_state
from reward_lens_spec.store.digest import DigestError, KEY
from reward_lens_spec.store.log import read_log
from reward_lens_spec.trust.evidence import seal_error
from reward_lens_spec.trust.evidence_chain import Evidence, derive_all

COLUMNS = ("run_id", "observables", "model_fingerprint", "model", "dataset", "dataset_checksum",
           "spec_hash", "trust", "trust_verified", "created", "wall_s")
_SOURCES = {"model_fingerprint": ("model_fingerprint",), "model": ("model", "model_name"),
            "dataset": ("dataset", "dataset_name"), "dataset_checksum": ("dataset_checksum",),
            "spec_hash": ("spec_hash",), "wall_s": ("wall_s",)}
CONFIG_KEYS = ("config_yaml", "config")


def _pick(attrs: dict, keys: tuple[str, ...]):
    for k in keys:
        if k in attrs:
            v = attrs[k]
            if isinstance(v, dict):
                return v.get("name", json.dumps(v, sort_keys=True))
            return v
    return None


def open_store(url, *, storage_options: dict | None = None) -> "Store":
    """Open an existing store read-side: ``url`` a store URL (local path or fsspec URL, opened with
    ``storage_options``) or an open store handle (``store_handle``); raises StoreError (see ``check_layout``)."""
    b = store_handle(url, storage_options)
    check_layout(b)
    return Store(b)


class Store:
    """A result store opened for reading (and for removing incomplete runs)."""

    def __init__(self, backend: Backend):
        self._b = backend
        self.url = backend.url
        self._data_bad: dict[str, str] = {}       # run id -> why its stored data fail their sealed digests

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # -- catalog -------------------------------------------------------------------
    def _scan(self) -> dict[str, tuple[str, dict | None]]:
        ids = self._b.list_runs()
        workers = 1 if self._b.local else min(16, max(1, len(ids)))
        with ThreadPoolExecutor(workers) as pool:
            states = list(pool.map(lambda r: run_state(self._b, r), ids))
        return dict(zip(ids, states))

    def _complete(self) -> dict[str, dict]:
        return {r: a for r, (s, a) in self._scan().items() if s == "complete"}

    def runs(self, **filters) -> pd.DataFrame:
        """One row per complete run (columns ``COLUMNS``), oldest first.

        Filters are equality on a column, except ``observable=NAME`` which keeps
        runs that hold that observable. Unknown filter -> StoreError.
        """
        allowed = set(COLUMNS) | {"observable"}
        for k in filters:
            if k not in allowed:
                raise StoreError(f"runs(): unknown filter {k!r}.{did_you_mean(k, allowed)} "
                                 f"Valid: {', '.join(sorted(allowed))}.")
        rows = []
        docs = self._complete()
        derived = derive_all(docs, self.log())
        for run_id, a in docs.items():
            row = {c: _pick(a, src) for c, src in _SOURCES.items()}
            d = self._data_verdict(run_id, derived[run_id], a)
            row.update(run_id=run_id, observables=list(a.get("observables", [])),
                       created=a.get("created"), trust=d["trust"], trust_verified=d["trust_verified"])
            rows.append(row)
        df = pd.DataFrame(rows, columns=list(COLUMNS))
        df["created"] = pd.to_datetime(df["created"], utc=True, errors="coerce")
        for k, v in filters.items():
            # masks are cast to bool: on an empty frame map() yields an object-dtype Series,
            # which pandas would read as a column selection and drop every column
            if k == "observable":
                df = df.loc[df["observables"].map(lambda obs: v in obs).astype(bool)]
            elif k == "trust_verified":
                want = str(v).lower() in ("true", "1", "yes") if isinstance(v, str) else bool(v)
                df = df.loc[(df[k] == want).astype(bool)]
            elif k == "created":
                df = df.loc[(df["created"] == pd.to_datetime(v, utc=True)).astype(bool)]
            else:
                df = df.loc[df[k].map(lambda x: x == v).astype(bool)]
        return df.sort_values(["created", "run_id"]).reset_index(drop=True)

    def incomplete(self) -> list[str]:
        """Run ids that are not complete: in progress, crashed, or corrupt."""
        return sorted(r for r, (s, _) in self._scan().items() if s not in ("complete", "absent"))

    def corrupt(self) -> list[str]:
        """Run ids whose run document cannot be parsed (a subset of ``incomplete()``)."""
        return sorted(r for r, (s, _) in self._scan().items() if s == "corrupt")

    def remove_incomplete(self, *, older_than_s: float = GC_AGE_S) -> list[str]:
        """Collect garbage: delete what no live writer holds and no reader lists. Returns what went.

        Removed: attempts that no complete run document names, whose leases are all
        released or dead (``store.attempts.lease_live``) and whose last heartbeat is older
        than ``older_than_s`` (default one hour; 0 = any age, still never a live writer's);
        then a run folder left with no attempt and no result. A run written before
        attempts (no leases) ages from its document's ``created``; one with no readable
        document counts as old. A complete run and the attempt it names are never
        touched, nor is anything behind a symlink (links are skipped, not followed).
        Each attempt's leases are re-read right before it is deleted. Returned entries
        are run ids (whole runs) and ``<run_id>/<attempt>`` (an unlisted attempt of a
        run that stays).
        """
        removed = []
        for run_id in self._b.list_runs():
            removed += collect_run(self._b, run_id, older_than_s)
        return removed

    # -- one run -------------------------------------------------------------------
    def _attrs(self, run_id: str) -> dict:
        try:
            state, attrs = run_state(self._b, check_name("run_id", run_id))
        except StoreError:
            state, attrs = "absent", None
        if state == "complete":
            return attrs
        if state == "absent":
            known = self._complete()
            raise StoreError(f"store {self.url}: no run {run_id!r}."
                             f"{did_you_mean(str(run_id), known)} ({len(known)} complete runs; "
                             "`reward-lens-spec store ls url=...` lists them.)")
        raise StoreError(f"store {self.url}: run {run_id!r} is {state} (crashed, still being "
                         "written, or damaged); it is not a result. `store gc` removes it.")

    def document(self, run_id: str) -> dict:
        """The run's attrs exactly as stored (a stored ``trust`` label included, unverified)."""
        return dict(self._attrs(run_id))

    def documents(self) -> dict[str, dict]:
        """Stored attrs of every complete run, by run id (one scan of the store)."""
        return self._complete()

    def evidence(self):
        """The store's evidence chain (``trust.evidence_chain.Evidence``) from one scan of its run documents:
        pass it to ``trust`` / ``provenance`` to derive many runs without rescanning."""
        return Evidence(self._complete(), self.log())

    def log(self):
        """The store's evidence log, read and verified now (``store.log.LogView``)."""
        return read_log(self._b)

    def trust(self, run_id: str, *, evidence=None) -> dict:
        """Derived trust of one run: ``{trust, trust_by_variable, trust_verified, trust_reason,
        trust_stored, trust_scope}`` (see ``trust.evidence``). Reads only. ``evidence``: from
        ``evidence()``, else scanned here."""
        attrs = self._attrs(run_id)                # StoreError for an unknown or incomplete run
        return self._data_verdict(run_id, (evidence or self.evidence()).derive(run_id), attrs)

    def _data_verdict(self, run_id: str, verdict: dict, attrs: dict | None = None) -> dict:
        """``verdict`` unless this reader found the run's stored data failing their sealed digests: then
        exploratory, ``trust_verified`` false, ``trust_reason`` saying which array. An adjudication record
        (``attrs``) re-reads every array of the runs it scored (``verify``) each time it is read, and is void
        when one fails its digest."""
        why = self._data_bad.get(run_id)
        if why is None and (attrs or {}).get("kind") == "adjudication" and verdict["trust"] != "exploratory":
            for r in attrs.get("runs") or ():
                if r not in self._data_bad:
                    try:
                        self.verify(r)
                    except StoreError as e:
                        self._data_bad.setdefault(r, str(e))
                if r in self._data_bad:
                    why = f"adjudication void: run {r} it scored: {self._data_bad[r]}"
                    break
        if why is None:
            return verdict
        return {**verdict, "trust": "exploratory",
                "trust_by_variable": {v: "exploratory" for v in verdict.get("trust_by_variable") or {}},
                "trust_verified": False, "trust_reason": f"stored data fail their sealed digests: {why}"}

    def verify(self, run_id: str) -> dict:
        """Read every array of a complete run and check it against the digests in its sealed document.

        Returns ``{run_id, ok, status, detail}``: status ``verified`` (every array matches its digest, and the
        document's seal verifies when it has one), ``no-digests`` (written before data digests: only the
        checksums of its chunks were checked), or ``FAILED`` (``detail`` names the array). A failure also
        makes this reader's derived trust of the run unverified.
        """
        attrs = self._attrs(run_id)
        try:
            for obs in attrs.get("observables", []):
                self._open(run_id, obs, False)
        except StoreError as e:
            return {"run_id": run_id, "ok": False, "status": "FAILED", "detail": str(e)}
        if attrs.get("content_hash") and seal_error(attrs):
            why = seal_error(attrs)
            self._data_bad.setdefault(run_id, why)
            return {"run_id": run_id, "ok": False, "status": "FAILED", "detail": why}
        if not attrs.get(KEY):
            return {"run_id": run_id, "ok": True, "status": "no-digests",
                    "detail": "written before data digests; chunks decoded (checksums where stored)"}
        n = sum(len(v) for v in attrs[KEY].values())
        return {"run_id": run_id, "ok": True, "status": "verified", "detail": f"{n} arrays match their digests"}

    def provenance(self, run_id: str, *, evidence=None) -> dict:
        """The run's attrs (config, hashes, fingerprints, versions, ...) with trust derived on read.

        ``trust`` is the verified level, never the stored label (that is ``trust_stored``).
        """
        return {**self._attrs(run_id), **self.trust(run_id, evidence=evidence)}

    def observables(self, run_id: str) -> list[str]:
        """Observable names stored in a complete run."""
        return list(self._attrs(run_id).get("observables", []))

    def load(self, run_id: str, observable: str | None = None, *, lazy: bool | int = True, verdict: dict | None = None):
        """One observable's ``Result`` (variable → DataArray, each with its own coordinates), or
        (``observable=None``) a dict of all of them.

        ``lazy=True`` gives dask-backed arrays (nothing read until used); an int reads each variable of at
        most that many bytes now and leaves larger ones dask-backed. ``verdict``: the run's derived trust
        (``trust(run_id)`` or ``provenance(run_id)``) when the caller has it already; else derived here.
        Raises StoreError for an unknown/incomplete run, an unknown observable,
        or a group that cannot be read (naming the run and observable).
        """
        names = self.observables(run_id)
        if observable is not None and observable not in names:
            raise StoreError(f"run {run_id} has no observable {observable!r}."
                             f"{did_you_mean(observable, names)} Valid: {', '.join(names)}.")
        # sealed (trust-bearing) runs: each variable's ``trust`` attr is its derived level, not the cache
        sealed = bool(self._attrs(run_id).get("content_hash"))
        opened = {o: self._open(run_id, o, lazy) for o in names if observable in (None, o)}   # digests checked
        verdict = (verdict if verdict is not None else self.trust(run_id)) if sealed else None
        out = {o: self._with_trust(res, verdict) for o, res in opened.items()}
        return out if observable is None else out[observable]

    @staticmethod
    def _with_trust(res: Result, verdict: dict | None) -> Result:
        if verdict is None or verdict["trust"] is None:
            return res
        for v in res:
            res[v].attrs["trust"] = (verdict.get("trust_by_variable") or {}).get(v, verdict["trust"])
        return res

    def _open(self, run_id: str, obs: str, lazy: bool) -> Result:
        """One observable; with the run's sealed ``data_digests`` each array is checked as it is read
        (coords now, data now or block by block when computed): a mismatch raises StoreError naming run
        and variable and marks the run's derived trust unverified for this reader."""
        attrs = self._attrs(run_id)
        recorded = attrs.get(KEY)
        digests = None
        if isinstance(recorded, dict):
            digests = recorded.get(obs)
            if digests is None:
                self._data_bad[run_id] = f"observable {obs} has no sealed digest"
                raise StoreError(f"store {self.url}: run {run_id} observable {obs}: the run's sealed data digests "
                                 "do not list it; the stored data were changed after the run was written.")
        try:
            return open_published(self._b.zarr_store(), data_group(run_id, attrs, obs), lazy=lazy,
                                  digests=digests, where=f"run {run_id} observable {obs}")
        except DigestError as e:
            self._data_bad[run_id] = str(e)
            raise StoreError(f"store {self.url}: {e}") from e
        except Exception as e:
            if digests is not None:               # a chunk failing its checksum, deleted metadata, ...
                self._data_bad[run_id] = f"observable {obs} cannot be read ({type(e).__name__}: {e})"
            raise StoreError(f"store {self.url}: cannot read run {run_id} observable {obs} "
                             f"({type(e).__name__}: {e}).") from e

    def config_yaml(self, run_id: str) -> str:
        """The run's resolved config as YAML text (attr ``config_yaml`` or ``config``)."""
        attrs = self._attrs(run_id)
        for k in CONFIG_KEYS:
            if k in attrs:
                v = attrs[k]
                return v if isinstance(v, str) else yaml.safe_dump(v, sort_keys=True)
        raise StoreError(f"run {run_id} has no resolved config attr ({' or '.join(CONFIG_KEYS)}).")

    def diff(self, run_a: str, run_b: str) -> list[str]:
        """Unified diff (lines) of two runs' resolved config YAML; [] when equal."""
        a, b = self.config_yaml(run_a), self.config_yaml(run_b)
        return list(difflib.unified_diff(a.splitlines(), b.splitlines(), fromfile=run_a,
                                         tofile=run_b, lineterm=""))

    def export(self, run_id: str, observable: str, path: str, *, variable: str | None = None) -> str:
        """Write one observable (or one ``variable`` of it) to ``path`` (``.nc`` netCDF or ``.csv``).

        netCDF: attrs netCDF cannot hold are JSON strings listed in ``_json_attrs``
        (engine netCDF4/h5netcdf if installed, else scipy). CSV: ``to_dataframe``,
        one row per coordinate combination. Returns the path. Raises StoreError for another suffix,
        an unknown variable, an observable whose variables have different coordinate sets and no
        ``variable`` (one file would pad them with NaN), or a failed write.
        """
        ext = os.path.splitext(str(path))[1].lower()
        if ext not in (".nc", ".csv"):
            raise StoreError(f"export: out={path} must end in .nc or .csv.")
        res = self.load(run_id, observable, lazy=False)
        if variable is not None:
            if variable not in res:
                raise StoreError(f"export: observable {observable} of run {run_id} has no variable {variable!r}."
                                 f"{did_you_mean(variable, res)} Valid: {', '.join(res)}.")
            res = Result({variable: res[variable]}, res.attrs)
        try:
            xr.align(*res.values(), join="exact")
        except ValueError as e:
            raise StoreError(f"export: the variables of observable {observable} have different coordinate sets "
                             f"({e}); one file would pad them with NaN. Fix: add var=NAME, one of "
                             f"{', '.join(res)}.") from e
        ds = res.to_dataset()
        try:
            if ext == ".csv":
                ds.to_dataframe().to_csv(path)
            else:
                engine = None
                try:
                    import netCDF4  # noqa: F401
                except ImportError:
                    try:
                        import h5netcdf  # noqa: F401
                    except ImportError:
                        engine = "scipy"
                encode_json_attrs(ds).to_netcdf(path, engine=engine)
        except Exception as e:
            raise StoreError(f"export of run {run_id} observable {observable} to {path} failed "
                             f"({type(e).__name__}: {e}). Fix: try .csv.") from e
        return str(path)
