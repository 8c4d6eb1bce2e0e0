"""Reuse decided before any heavy import: a complete run found from the bytes its id depends on.

A run id (``run.identity``) hashes the model's fingerprint, the pairs, the tokens the model sees and
the observable — so finding it means loading a tokenizer and tokenizing every pair (seconds of
torch and transformers imports on the embedded model). Every one of those is a function of a
smaller set of bytes, hashed here into a *reuse key*:

- the resolved config (``OmegaConf.to_yaml`` of the composed run: model, dataset, observable,
  frame, store — what ``config_yaml`` in the run's attrs holds);
- the dataset file's sha256 (the built-in ``diagnostic.jsonl`` or ``dataset.path``; every file of a
  folder), each remembered while the file's (device, inode, size, mtime, ctime) are unchanged
  (``models.fingerprint_cache.file_sha256``);
- the weights key (``models.fingerprint_cache.weights_key``: the checkpoint's files, or the code of a
  built-in model), and a checkpoint sequence's chain up to this checkpoint;
- every source and data file of this package, and the installed versions of the libraries that
  tokenize and compute (torch, transformers, tokenizers, numpy);
- the study the run is registered under, if any;
- every YAML of the config folders, built-in and the user's (``run.compose.folders_digest``), and the
  bytes of every observable file included, transitively, by name or by path (``include_files``): the
  resolved config keeps ``include:`` unexpanded, so an edited included observable must change the key.

The key maps to the run id a previous execution computed the slow way (``remember_run``), in the
per-user signed cache (``signed_cache``, kind ``runs``). A key is made only where every input is a local
file: a hub model, a frame other than native, or ``store.force`` make none, and the run is decided by
loading. A remembered id is used only when the store holds that run complete *and* its sealed attrs
agree with the bytes there now: the same resolved config, the sha256 of the data file the run read
(``dataset_file.sha256``) equal to the current one, the checkpoint chain (a ``model.checkpoints``
sequence) equal to the current one, and the model fingerprint remembered for the current weights key.
So a stale, corrupt, planted or edited cache entry, or a file edited under its old size and mtime, can
only cost a load, never reuse another run's numbers.
"""
from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from ..signed_cache import package_digest, read_signed, write_signed
from ..data.files import resolve_path
from ..models.checkpoints import chain
from ..models.fingerprint_cache import file_sha256, remembered, weights_key
from .compose import folders_digest
from ..observables import load_observable, observable_path
from ..store.run_doc import complete_provenance
from ..data.loaders import DIAGNOSTIC_FILE

LIBRARIES = ("torch", "transformers", "tokenizers", "numpy")


def _versions() -> dict:
    out = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def dataset_files(ds, base_dir: str | None) -> list[Path] | None:
    """The files ``load_pairs`` reads for a ``DatasetSpec`` (``None``: not a local file, or not there)."""
    if ds.kind == "diagnostic":
        return [Path(__file__).resolve().parent.parent / "data" / DIAGNOSTIC_FILE]
    if not ds.path:
        return None
    p = resolve_path(ds.path, base_dir)
    if p.is_file():
        return [p]
    if p.is_dir():
        return [f for f in sorted(p.rglob("*")) if f.is_file()]
    return None


def reuse_key(run, resolved_yaml: str, base_dir: str | None, study_hash: str | None) -> str | None:
    """The reuse key of a composed run (see the module doc), or ``None`` when it has none."""
    if run.store.force or run.frame.name.value != "native":
        return None
    files = dataset_files(run.dataset, base_dir)
    wkey = weights_key(run.model, base_dir)
    if files is None or wkey is None:
        return None
    doc = {"config": resolved_yaml, "data": [[str(f), file_sha256(f)] for f in files], "weights": wkey,
           "checkpoint": chain(run.model, base_dir), "package": package_digest(), "libraries": _versions(),
           "study": study_hash, "folders": folders_digest(), "includes": include_files(run.observable)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def include_files(obs) -> list[list[str]]:
    """``[[path, sha256], ...]`` of every observable file ``obs`` includes, transitively, by option name or by
    path (a path may lie outside every config folder; the resolved config keeps ``include:`` unexpanded)."""
    seen: dict[str, str] = {}
    todo = [str(r) for r in (obs.include or ())]
    while todo:
        ref = todo.pop()
        path = observable_path(ref, "observable.include")
        if str(path) in seen:
            continue
        seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        todo += [str(r) for r in (load_observable(ref).include or ())]
    return sorted([k, v] for k, v in seen.items())


def validate_key(run, resolved_yaml: str, base_dir: str | None) -> str | None:
    """The key ``validate``'s output is remembered under (``signed_cache``, kind ``validate``): the reuse key's
    inputs (config, data, weights, package, libraries) and every YAML of the config folders, which plan-time
    readers search (an observable named by another); ``None`` where the run has no reuse key."""
    key = reuse_key(run, resolved_yaml, base_dir, None)
    if key is None:
        return None
    doc = {"reuse_key": key, "folders": folders_digest(), "base_dir": base_dir}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def remember_run(key: str | None, run_id: str) -> None:
    """Remember that ``key`` identifies ``run_id`` (signed; a cache that cannot be written is only slower)."""
    if key is not None:
        write_signed("runs", key, {"run_id": run_id})


def same_inputs(run, prov: dict, base_dir: str | None) -> bool:
    """Whether the stored run read the bytes ``run`` would read now: the sha256 of the data file it read
    (``dataset_file.sha256``) is the current digest of one of ``run``'s dataset files, and its checkpoint
    chain (``None`` outside a ``model.checkpoints`` sequence) is the current one."""
    files = dataset_files(run.dataset, base_dir)
    stored = (prov.get("dataset_file") or {}).get("sha256")
    if files is None or not isinstance(stored, str) or stored not in {file_sha256(f) for f in files}:
        return False
    now = chain(run.model, base_dir)
    return json.dumps(prov.get("checkpoint"), sort_keys=True) == json.dumps(now, sort_keys=True)


def reused_run(run, key: str | None, resolved_yaml: str, base_dir: str | None, store) -> tuple[str, dict] | None:
    """``(run id, its stored provenance)`` remembered under ``key`` when the store holds it complete with this
    resolved config (``store``: the run's store handle, ``store.store_handle``), the data and checkpoint digests of the files there now (``same_inputs``) and the
    fingerprint remembered for these weights; else ``None`` (decide by loading).
    The provenance is read from the store's JSON documents (``store.run_doc``: no xarray), or through the
    reader where those do not suffice."""
    if key is None:
        return None
    doc = read_signed("runs", key)
    run_id = doc.get("run_id") if doc is not None else None
    if not isinstance(run_id, str):
        return None
    prov = complete_provenance(store, run_id)
    if prov is None:
        from ..store import is_complete, open_store     # xarray: only when the JSON documents do not suffice
        try:
            if not is_complete(store, run_id):
                return None
            prov = open_store(store).provenance(run_id)
        except Exception:                               # unreadable: decide by loading
            return None
    fp = remembered(weights_key(run.model, base_dir))
    if (prov.get("config_yaml") != resolved_yaml or fp is None or prov.get("model_fingerprint") != fp
            or not same_inputs(run, prov, base_dir)):
        return None
    return run_id, prov
