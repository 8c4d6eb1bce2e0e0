"""Preregistered studies: freeze predictions before data, run, adjudicate against the frozen copy.

A study is an experiment file ``conf/experiment/<name>.yaml`` (Hydra ``# @package
_global_``, selected with ``experiment=<name>``; its ``experiment:`` node is the
study — see ``example_dla_mlp.yaml``): ``name``, ``version``, ``design`` (config
keys the run must have, nested like the config: ``{model: {name: tiny_llama}}``)
and ``hypotheses``, each with ``predictions``: ``{id, metric: {variable, select,
reduce}, comparator, threshold}``. ``variable`` is an output of the run's
observable; ``select`` picks coordinates (``unit: mlp_L1`` matches the ``unit``
coord, any other key selects that dim's labels); ``reduce`` ∈ ``REDUCTIONS`` over
every remaining finite cell; ``comparator`` ∈ ``> < >= <=``.

The study hash is sha256 of the canonical JSON of the whole study (any edit
changes it); its id is ``<name>-<hash[:12]>``. Lifecycle (preregistration, after
Nosek et al. 2018, *The preregistration revolution*, PNAS):

1. ``freeze`` stores the study (run ``study-…``, observable ``study``, sealed)
   with its design *pins* (``trust.pins``: observable content hash, model
   fingerprint, dataset checksum — computed by composing the design and loading
   the model and the pairs; no result is read). It refuses when the store already
   holds a result run with those pins, of this study or of none: once results
   were seen, a prediction cannot be (re)frozen and still count as preregistered.
   That holds for an amendment too;
2. a run whose ``experiment`` is a frozen study is registered when its own pins
   equal the study's (derived on read, ``trust.evidence_chain``); a study edited after
   freezing is refused (``SpecError``) unless the edit is frozen as a dated
   amendment (``amend=True``), a new version — earlier versions and their
   adjudications stay in the store, never overwritten;
3. ``adjudicate`` re-verifies the stored study (seal and study hash; a tampered
   record is refused naming it), scores each prediction on the study's runs with
   that FROZEN copy, never the file, and stores the outcome (run
   ``adjudication-…``; trust ``adjudicated`` when, in every run, each variable
   the predictions read derives ``registered`` on read).
"""
from __future__ import annotations

import hashlib
from datetime import datetime, timezone

import numpy as np
import xarray as xr
import yaml

from ..errors import SpecError, StoreError
from ..result import Result
from ..levels import LEVELS
from .evidence import NOT_RESULTS, seal
from .evidence_chain import level_of

from .study_doc import COMPARATORS, REDUCTIONS, load_study, predictions, study_hash, study_id
import os
from .pins import design_run, pins
from ..inputs import load_dataset
from ..identity import observable_hash
from ..store import open_store, write_run


def _open(store_url, storage_options=None):
    try:
        return open_store(store_url, storage_options=storage_options)
    except StoreError:      # no store yet: nothing frozen, no runs
        return None


def _documents(store_url, storage_options=None) -> list[dict]:
    """Stored attrs of every complete run, in evidence-log order ([] when there is no store)."""
    st = _open(store_url, storage_options)
    if st is None:
        return []
    return st.evidence().ordered()


def frozen_studies(store_url: str, name: str | None = None, *, storage_options=None) -> list[dict]:
    """Stored attrs of every frozen study in the store (optionally one name), oldest first."""
    return [a for a in _documents(store_url, storage_options)
            if a.get("kind") == "study" and (name is None or a.get("study_name") == name)]


def matching_runs(store_url: str, pins: dict, *, storage_options=None) -> list[str]:
    """Ids of complete result runs whose pins all equal ``pins``."""
    return [a["run_id"] for a in _documents(store_url, storage_options)
            if a.get("kind") not in NOT_RESULTS and all(a.get(k) == v for k, v in pins.items())]


def runs_of_study(store_url: str, shash: str, *, storage_options=None) -> list[dict]:
    """Attrs of complete result runs that executed the study with hash ``shash`` (oldest first)."""
    out = []
    for a in _documents(store_url, storage_options):
        if a.get("kind") in NOT_RESULTS:
            continue
        h = a.get("study_hash")
        if h is None and a.get("config_yaml"):
            exp = (yaml.safe_load(a["config_yaml"]) or {}).get("experiment")
            h = study_hash(exp) if isinstance(exp, dict) else None
        if h == shash:
            out.append(a)
    return out


def peeked_runs(store_url: str, design, fingerprint: str, study: dict, base_dir=None, *, storage_options=None) -> list[str]:
    """Complete result runs on the same model fingerprint that already hold a value of a predicted variable
    on a pair of the design's data — whatever their observable is called or includes (a peek)."""
    wanted = {p["metric"]["variable"] for p in predictions(study)}
    docs = [a for a in _documents(store_url, storage_options) if a.get("kind") not in NOT_RESULTS
            and a.get("model_fingerprint") == fingerprint and wanted & set(a.get("gauge") or {})]
    if not docs:
        return []
    ids = set(load_dataset(design.dataset, base_dir).ids)
    st = _open(store_url, storage_options)
    out = []
    for a in docs:
        for res in st.load(a["run_id"], lazy=True).values():
            hit = [v for k, v in res.items() if k in wanted and "pair" in v.dims]
            if any(ids & {str(p) for p in v["pair"].values} for v in hit) or any(k in wanted and "pair" not in v.dims
                                                                               for k, v in res.items()):
                out.append(a["run_id"])
                break
    return out


def refutations(store_url: str, hashes, *, storage_options=None) -> list[dict]:
    """Refuted predictions of adjudications of the study versions ``hashes`` (carried into an amendment)."""
    out = []
    for a in _documents(store_url, storage_options):
        if a.get("kind") == "adjudication" and a.get("study_hash") in set(hashes):
            bad = sorted(k for k, v in (a.get("outcome") or {}).items() if v == "refuted")
            if bad:
                out.append({"study_hash": a["study_hash"], "adjudication": a["run_id"], "refuted": bad})
    return out


def freeze(experiment, store_url: str, *, amend: bool = False, base_dir: str | None = None,
           storage_options=None) -> dict:
    """Hash, pin and store a study before any matching result exists; return its frozen record (attrs).

    Reads no result. Idempotent for an unchanged study (the first freeze is kept).
    Raises ``SpecError`` when the store already holds a run of this study or any
    result run with the design's pins (too late to preregister, amendments
    included), or when another version of the study name is frozen and ``amend``
    is false. ``base_dir``: where relative dataset/model paths resolve (default cwd).
    """
    study = load_study(experiment)
    h, name = study_hash(study), study["name"]
    earlier = frozen_studies(store_url, name, storage_options=storage_options)
    for a in earlier:
        if a["study_hash"] == h:
            return {**a, "reused": True}
    if earlier and not amend:
        raise SpecError("experiment", f"study '{name}' is already frozen with different content "
                        f"(hash {earlier[-1]['study_hash'][:12]}, now {h[:12]}).",
                        fix="restore the frozen content, or freeze the edit as a dated amendment with amend=true.")
    if runs_of_study(store_url, h, storage_options=storage_options):
        raise SpecError("experiment", f"runs of study '{name}' ({h[:12]}) are already in the store: freezing "
                        "now would not be a preregistration.", fix="freeze a study before running it.")
    design = design_run(experiment, study)
    pinned = pins(design, base_dir or os.getcwd())
    seen = matching_runs(store_url, pinned, storage_options=storage_options)
    seen += [r for r in peeked_runs(store_url, design, pinned["model_fingerprint"], study, base_dir,
                                    storage_options=storage_options) if r not in seen]
    if seen:
        raise SpecError("experiment", f"the store already holds run(s) {seen[:3]} with this design's observable, "
                        f"model and dataset: {'amending' if earlier else 'freezing'} study '{name}' now would not "
                        "be a preregistration.", fix="preregister a new design (another dataset or model), "
                        "or report the edit as exploratory.")
    refuted = refutations(store_url, [a["study_hash"] for a in earlier], storage_options=storage_options)
    preds = predictions(study)
    ds = xr.Dataset({"threshold": ("prediction", [float(p["threshold"]) for p in preds], {"units": "as the metric"})},
                    coords={"prediction": [p["id"] for p in preds],
                            "comparator": ("prediction", [p["comparator"] for p in preds])})
    attrs = {"kind": "study", "study_name": name, "study_hash": h, "spec_hash": h, "study_id": study_id(study),
             "study": study, "amends": [a["study_hash"] for a in earlier], "pins": pinned,
             "amended_after_refutation": refuted,
             "version_index": len(earlier) + 1,
             "frozen_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
             "config_yaml": yaml.safe_dump({"experiment": study}, sort_keys=True)}
    rid = f"study-{name}-{h[:16]}"
    write_run(store_url, rid, {"study": ds}, seal(attrs), storage_options=storage_options)
    return {**frozen_studies(store_url, name, storage_options=storage_options)[-1], "reused": False}


def check_design(run, study: dict) -> None:
    """Raise ``SpecError`` naming the key where the run's config differs from ``study['design']``."""
    def walk(node, obj, prefix):
        for k, want in node.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if not hasattr(obj, k):
                raise SpecError(f"experiment.design.{key}", "no such config key.",
                                fix="remove it from the study's design, or name a key of the run config "
                                    "(e.g. model: {name: tiny_llama}).")
            got = getattr(obj, k)
            if isinstance(want, dict):
                walk(want, got, key)
                continue
            got = getattr(got, "value", got)
            if got != want and not (isinstance(got, (list, tuple)) and list(got) == want):
                raise SpecError(key, f"study '{study['name']}' was preregistered with {key}={want!r}; "
                                f"this run has {got!r}.", fix=f"drop the override or set {key}={want}.")
    walk(study.get("design") or {}, run, "")


def check_run(run, store_url, *, storage_options=None) -> dict | None:
    """The frozen record this run executes, or None (no study, or a study never frozen). ``store_url``: a store
    URL or the run's store handle (``store.store_handle``).

    Raises ``SpecError`` when the run's study was frozen but its content has
    changed since (hash mismatch, no matching amendment), or when the run's
    config departs from the study's ``design``.
    """
    if not run.experiment:
        return None
    study = load_study(dict(run.experiment))
    h = study_hash(study)
    frozen = frozen_studies(store_url, study["name"], storage_options=storage_options)
    if not frozen:
        return None
    match = [a for a in frozen if a["study_hash"] == h]
    if match:
        bad = _open(store_url, storage_options).evidence().study_error(match[0]["run_id"], match[0])
        if bad:
            raise StoreError(f"{bad}; the study cannot register runs. Fix: freeze the study file again in a "
                             "fresh store, or remove the damaged record.")
        pinned = (match[0].get("pins") or {}).get("observable_spec_hash")
        if pinned and pinned != observable_hash(run.observable):
            raise SpecError("observable", f"study '{study['name']}' pinned observable content "
                            f"{pinned[:12]}; this run's '{run.observable.name}' is "
                            f"{observable_hash(run.observable)[:12]} (a different instrument under the same name).",
                            fix="run the observable exactly as frozen (same steps, version and restrictions).")
    if not match:
        raise SpecError("experiment", f"study '{study['name']}' was edited after it was frozen (frozen "
                        f"{', '.join(a['study_hash'][:12] for a in frozen)}; now {h[:12]}): runs under it are refused.",
                        fix=f"restore the frozen file, or `reward-lens-spec freeze experiment={study['name']} "
                            "amend=true` to record the edit as a dated amendment.")
    check_design(run, study)
    return match[0]


def metric_value(pred: dict, ds) -> float:
    """Evaluate ``pred['metric']`` on a run's outputs (``Result`` or Dataset); NaN when nothing finite is left."""
    m = pred["metric"]
    var = m["variable"]
    if var not in ds:
        raise SpecError(f"experiment.predictions.{pred['id']}.metric.variable", f"the run has no '{var}'.",
                        value=var, options=list(ds.data_vars))
    da = ds[var]
    for k, v in (m.get("select") or {}).items():
        if k == "unit" and "unit" in da.coords:
            da = da.where(da.coords["unit"] == v)
        elif k in da.dims:
            da = da.sel({k: v if isinstance(v, list) else [v]})
        else:
            raise SpecError(f"experiment.predictions.{pred['id']}.metric.select.{k}", f"'{var}' has no dim '{k}'.",
                            value=k, options=list(da.dims) + (["unit"] if "unit" in da.coords else []))
    vals = np.asarray(da.values, np.float64).ravel()
    vals = vals[np.isfinite(vals)]
    return float(REDUCTIONS[m.get("reduce", "mean")](vals)) if vals.size else float("nan")


def adjudicate(experiment: str, store_url: str, *, run_ids=None, shash: str | None = None,
               storage_options=None) -> dict:
    """Score the FROZEN predictions of study ``experiment`` (a name) on its runs; store and return the record.

    Runs: ``run_ids``, else every complete run of the frozen study logged after it
    was frozen. Per prediction: ``confirmed`` (holds on every run), ``refuted``,
    or ``undetermined`` (metric not finite). An existing record for the same study
    version and runs is returned as it is (``reused``), never rewritten. Raises
    ``SpecError`` when the study was never frozen or no run of it exists;
    ``StoreError`` when the stored study fails verification (edited in the store).
    """
    name = experiment if isinstance(experiment, str) else load_study(experiment)["name"]
    frozen = [a for a in frozen_studies(store_url, name, storage_options=storage_options)
              if shash is None or a["study_hash"].startswith(shash)]
    if not frozen:
        raise SpecError("experiment", f"study '{name}' is not frozen in {store_url}.",
                        fix=f"reward-lens-spec freeze experiment={name} store.url=... (before running it).")
    rec = frozen[-1]
    ev = open_store(store_url, storage_options=storage_options).evidence()
    bad = ev.study_error(rec["run_id"], rec)
    if bad:
        raise StoreError(f"{bad}: refusing to adjudicate against it.")
    study, h = rec["study"], rec["study_hash"]
    runs = [a for a in runs_of_study(store_url, h, storage_options=storage_options)     # after it, in log order
            if ev.before(rec["run_id"], a["run_id"]) and (not run_ids or a["run_id"] in run_ids)]
    missing = sorted(set(run_ids or ()) - {a["run_id"] for a in runs})
    if missing:
        raise SpecError("runs", f"run(s) {missing} did not execute frozen study {rec['study_id']} after it was frozen.",
                        fix="drop them from runs=, or run the study after freezing it: "
                            f"reward-lens-spec experiment={name}")
    if not runs:
        raise SpecError("experiment", f"no run of study {rec['study_id']} since it was frozen.",
                        fix=f"run it first: reward-lens-spec experiment={name}")
    st = open_store(store_url, storage_options=storage_options)
    ids = sorted(a["run_id"] for a in runs)
    rid = f"adjudication-{name}-{h[:12]}-{hashlib.sha256(' '.join(ids).encode()).hexdigest()[:8]}"
    if rid in st.documents():
        return {**st.provenance(rid), "reused": True}
    preds = predictions(study)
    loaded = {a["run_id"]: Result({k: v for res in st.load(a["run_id"], lazy=False).values() for k, v in res.items()})
              for a in runs}
    values = np.array([[metric_value(p, loaded[a["run_id"]]) for a in runs] for p in preds])
    holds = np.array([[bool(COMPARATORS[p["comparator"]](v, p["threshold"])) for v in row]
                      for p, row in zip(preds, values)])
    outcome = {p["id"]: ("undetermined" if not np.isfinite(values[i]).all() else
                         "confirmed" if holds[i].all() else "refuted") for i, p in enumerate(preds)}
    variables = sorted({p["metric"]["variable"] for p in preds})
    derived = {a["run_id"]: level_of(st.trust(a["run_id"]), variables) for a in runs}
    lowest = min(LEVELS.index(t) for t in derived.values())
    trust = "adjudicated" if lowest >= LEVELS.index("registered") else LEVELS[lowest]
    ds = xr.Dataset({"value": (("prediction", "run"), values, {"units": "as the metric"}),
                     "holds": (("prediction", "run"), holds, {"units": "bool"})},
                    coords={"prediction": np.array([p["id"] for p in preds], dtype=str),
                            "run": np.array([a["run_id"] for a in runs], dtype=str)})
    attrs = {"kind": "adjudication", "study_name": name, "study_hash": h, "spec_hash": h,
             "study_id": rec["study_id"], "frozen_at": rec["frozen_at"], "runs": ids, "outcome": outcome,
             "predictions": [{k: p[k] for k in ("id", "hypothesis", "metric", "comparator", "threshold")}
                             for p in preds],
             "values": {p["id"]: [v if np.isfinite(v) else None for v in values[i].tolist()]
                        for i, p in enumerate(preds)},
             "trust": trust, "run_trust": derived,
             # what it scored: each run's sealed data digests, every array of which st.load checked as it read
             "scored": {a["run_id"]: a.get("data_digests") for a in runs},
             "amended_after_refutation": rec.get("amended_after_refutation") or [],
             "config_yaml": yaml.safe_dump({"adjudicate": {"study_id": rec["study_id"], "runs": ids}})}
    write_run(store_url, rid, {"adjudication": ds}, seal(attrs), storage_options=storage_options)
    return {**attrs, "run_id": rid, "reused": False}
