"""Compare two stored runs (two models, same pairs): invariants always, directions only in one frame.

For each variable the two runs share (or those named):

  invariant, with a ``pair`` dim   ``compare_margins``: Pearson r and Spearman ρ over pairs with a
                                   percentile-bootstrap CI and a shuffled-pairs permutation p, per
                                   cell of any other dims (e.g. ``objective``, ``layer``; inner join)
  frame-dependent                  both runs must hold it in ONE frame: the same whitened frame, or a
                                   shared frame fitted for both models (``frame=shared``); else
                                   ``GaugeError`` naming the variable and the fix. Directions
                                   (units ``direction``) then get ``compare_directions``: the cosine
                                   beside a random-direction null drawn under the frame's reference
                                   covariance (identity in whitened coordinates). Native frames are
                                   refused even for one model: their null needs Σ̂ (use frame=whitened).

Paired accuracy (``paired``, default ``[margin]`` when the margin is compared): for each named
invariant per-pair variable, ``compare.paired.paired_accuracy`` (McNemar's exact test, a paired
bootstrap CI of the accuracy difference, Holm and Šidák across subsets and cells), stored as
observable ``paired_<variable>``. It needs both runs to hold the variable on the same pair set.

The result is stored as run ``compare-<hash>`` (one observable per variable) with provenance (both
run ids, models, fingerprints, dataset checksum, parameters) and ``trust`` = the lower of the two
runs' levels. Raises ``SpecError`` (unknown or identical runs, a frame or comparison run, an unknown
variable, pair-dim variables from different datasets, a paired variable a run lacks or runs
holding different pairs, a shared frame fitted on fewer activations than dims, nothing to compare),
``GaugeError`` (frames), ``StoreError``; nothing is written when any variable fails.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import xarray as xr

from ..errors import GaugeError, SpecError, did_you_mean
from ..frames.compare import compare_directions
from ..frames.gate import gauge_of, is_frame_dependent, require_shared_frame
from ..ops.margin_agreement import compare_margins
from ..levels import LEVELS
from .paired import paired_accuracy
from ..frames.io import load_frame
from .. import __version__
from ..store import is_complete, open_store, write_run

OBSERVABLE = "compare"


@dataclass(frozen=True)
class CompareParams:
    n_boot: int = 1000
    n_perm: int = 1000
    n_null: int = 1000
    seed: int = 0
    ci: float = 0.95


def run_variables(st, run_id: str) -> dict[str, xr.DataArray]:
    out = {}
    for obs in st.observables(run_id):
        ds = st.load(run_id, obs, lazy=False)
        for v in ds.data_vars:
            out.setdefault(str(v), ds[v])
    return out


def _cells(arr: xr.DataArray, keep: tuple[str, ...]):
    """(label dict, sub-array with dims ``keep``) for every cell of the other dims."""
    rest = [d for d in arr.dims if d not in keep]
    if not rest:
        yield {}, arr
        return
    stacked = arr.stack(_cell=rest)
    for i in range(stacked.sizes["_cell"]):
        cell = stacked.isel(_cell=i)
        yield {d: cell[d].item() for d in rest}, cell.drop_vars(["_cell", *rest], errors="ignore")


def _per_cell(a: xr.DataArray, b: xr.DataArray, keep: tuple[str, ...], fn) -> xr.Dataset:
    """Apply ``fn(cell_a, cell_b) -> Dataset`` to aligned cells; concat back over the other dims."""
    rest = [d for d in a.dims if d not in keep]
    if sorted(a.dims) != sorted(b.dims):
        raise SpecError("vars", f"'{a.name}' has dims {a.dims} in run a but {b.dims} in run b.",
                        fix="compare runs whose heads have the same objectives (model.num_labels), or other vars.")
    b = b.transpose(*a.dims)                          # cells of a and b pair up in one order
    a, b = xr.align(a, b, join="inner", exclude=set(keep))
    if any(a.sizes[d] == 0 for d in rest):
        raise SpecError("vars", f"'{a.name}': the runs share no coordinates along {rest}.",
                        fix="compare runs of one observable config (e.g. the same observable.layers), or other vars.")
    done, absent = [], []          # (label, result); labels of cells NaN for every entry in both runs
    for (label, ca), (_, cb) in zip(_cells(a, keep), _cells(b, keep)):
        if label and bool(ca.isnull().all()) and bool(cb.isnull().all()):
            absent.append(label)   # a cell that does not exist by design (e.g. DLA: layer -1 holds only embed)
            continue
        done.append((label, fn(ca, cb)))
    if not done:
        raise SpecError("vars", f"'{a.name}' is NaN in every cell of both runs: nothing to compare.",
                        fix="name a variable that holds values in both runs (vars=margin,...).")
    parts = []
    for label, res in done + [(lab, None) for lab in absent]:
        if res is None:            # keep the grid whole for combine: NaN statistics, n_pairs 0
            res = done[0][1].copy()
            for v in res.data_vars:
                res[v] = xr.zeros_like(res[v]) if v == "n_pairs" else xr.full_like(res[v], float("nan"), dtype=float)
        parts.append(res.expand_dims({d: [v] for d, v in label.items()}) if label else res)
    out = parts[0] if len(parts) == 1 else xr.combine_by_coords(parts, combine_attrs="override")
    if rest:
        def fmt(label):
            return ", ".join(f"{d}={v}" for d, v in label.items())
        out.attrs["cells_compared"] = [fmt(lab) for lab, _ in done]
        out.attrs["cells_skipped"] = [fmt(lab) for lab in absent]
        if absent:
            out.attrs["cells_skipped_reason"] = "NaN for every entry in both runs (the cell does not exist)"
    return out


def _margins(a, b, p: CompareParams) -> xr.Dataset:
    def fn(ca, cb):
        res = compare_margins(ca.reset_coords(drop=True), cb.reset_coords(drop=True), n_boot=p.n_boot,
                              n_perm=p.n_perm, seed=p.seed, ci=p.ci)
        return res.assign(n_pairs=xr.DataArray(res.attrs["n"], attrs={"units": "count", "gauge": "invariant"}))
    return _per_cell(a, b, ("pair",), fn)


def _directions(a, b, p: CompareParams) -> xr.Dataset:
    def fn(ca, cb):
        res = compare_directions(ca.assign_attrs(gauge=gauge_of(a)), cb.assign_attrs(gauge=gauge_of(b)),
                                 n_null=p.n_null, seed=p.seed)
        return res.drop_vars(["a_in_frame", "b_in_frame"])
    return _per_cell(a, b, ("d_model",), fn)


def check_frame(name, a, b, prov_a, prov_b, url, so) -> str:
    """Pass the gauge gate for a frame-dependent variable; return the shared gauge."""
    models = {prov_a.get("model"), prov_b.get("model")}
    if len(models) == 1 and gauge_of(a) != gauge_of(b):
        raise GaugeError(f"compare: '{name}' is in {gauge_of(a)} in run a but {gauge_of(b)} in run b, for the one "
                         f"model '{prov_a.get('model')}'. Fix: run both with the same frame (e.g. frame=whitened), "
                         "or compare only invariant variables (vars=margin).")
    gauge = require_shared_frame(a, b, names=[f"{name} (run a)", f"{name} (run b)"], op="compare")
    if gauge.startswith("frame:native:"):
        if prov_a.get("model_fingerprint") != prov_b.get("model_fingerprint"):
            raise GaugeError(f"compare: '{name}' is in {gauge} in both runs, but the two runs' models share a name "
                             "and differ in weights, so their native bases differ. Fix: give the models distinct "
                             "names and fit a shared frame for them (frame=shared frame.partner=...).")
        raise SpecError(f"vars.{name}", f"'{name}' is in a native frame; a direction comparison is reported beside "
                        "a null drawn under the activations' covariance, which a native-frame run does not store.",
                        fix="rerun both with frame=whitened (one model) or frame=shared (two models).")
    frame = load_frame(url, gauge.rsplit(":", 1)[1], storage_options=so)
    if frame.provenance.get("underdetermined"):
        raise SpecError(f"vars.{name}", f"shared frame {frame.id[:12]} was fitted from {frame.provenance.get('n_pairs')} "
                        f"pairs for d_model {frame.d}: its alignment is fixed only on the data's span, so a cosine "
                        "there means nothing.", fix=f"refit with frame.reference_limit above {frame.d // 2}.")
    if not models <= set(frame.models):
        raise GaugeError(f"compare: '{name}' is in frame {frame.id[:12]}, fitted for {list(frame.models)}, not for "
                         f"both models {sorted(map(str, models))}. Fix: frame=shared with frame.partner=<the other "
                         "model> in both runs.")
    return gauge


def _paired_names(paired, names, va, vb, run_a, run_b) -> list[str]:
    """The variables that get the paired accuracy test: ``paired`` as given (each held by both runs), or by
    default ``["margin"]`` when the margin is among the compared variables."""
    if paired is None:
        return ["margin"] if "margin" in names else []
    for n in dict.fromkeys(paired):
        for rid, v in ((run_a, va), (run_b, vb)):
            if n not in v:
                raise SpecError("paired", f"run {rid} has no '{n}': a paired accuracy test needs both runs' "
                                "margins.", fix="name runs that store a margin (e.g. observable=score), or drop "
                                "paired=.")
    return list(dict.fromkeys(paired))


def compare_runs(url: str, run_a: str, run_b: str, variables=None, params: CompareParams = CompareParams(), *,
                 paired=None, storage_options: dict | None = None) -> tuple[str, dict[str, xr.Dataset], bool]:
    """Compare ``run_a`` and ``run_b`` in store ``url``; see the module doc.

    ``paired``: the variables given the paired accuracy test (None: ``margin`` when compared; [] none).

    Returns ``(run_id, {variable: Dataset}, written)``; ``written`` is False when the same
    comparison was already stored (it is then loaded, not recomputed).
    """
    so = dict(storage_options or {})
    st = open_store(url, storage_options=so)
    known = set(st.runs()["run_id"])
    for key, rid in (("a", run_a), ("b", run_b)):
        if rid not in known:
            raise SpecError(key, f"no complete run '{rid}' in {url}.{did_you_mean(rid, sorted(known))}",
                            fix="list runs with `reward-lens-spec store ls url=...`.")
    if run_a == run_b:
        raise SpecError("b", f"a and b are the same run ({run_a}).", fix="name two runs, one per model.")
    prov_a, prov_b = st.provenance(run_a), st.provenance(run_b)
    for key, rid, prov in (("a", run_a, prov_a), ("b", run_b, prov_b)):
        if prov.get("observable") in ("frame", OBSERVABLE):
            raise SpecError(key, f"run {rid} is a stored {prov.get('observable')}, not a model's run.",
                            fix="name runs of observables (e.g. observable=reward_direction).")
    same_data = prov_a.get("dataset_checksum") == prov_b.get("dataset_checksum")
    va, vb = run_variables(st, run_a), run_variables(st, run_b)
    shared = sorted(set(va) & set(vb))
    names = list(dict.fromkeys(variables)) if variables else shared
    for n in names:
        if n not in shared:
            raise SpecError("vars", f"variable '{n}' is not in both runs.{did_you_mean(n, shared)}", options=shared)
    paired = _paired_names(paired, names, va, vb, run_a, run_b)
    rid = f"{OBSERVABLE}-" + hashlib.sha256(json.dumps(
        {"a": run_a, "b": run_b, "spec": [prov_a.get("spec_hash"), prov_b.get("spec_hash")], "vars": names,
         "paired": paired, "params": asdict(params), "version": __version__}, sort_keys=True).encode()).hexdigest()[:20]
    if is_complete(url, rid, storage_options=so):
        def as_dataset(r):                     # the store hands back a Result; callers stack/select like a Dataset
            return r.to_dataset() if hasattr(r, "to_dataset") else r
        return rid, {n: as_dataset(st.load(rid, n, lazy=False)) for n in st.observables(rid)}, False
    results, skipped, gauges = {}, {}, {}
    for n in names:
        a, b = va[n].rename(n), vb[n].rename(n)
        if not (is_frame_dependent(gauge_of(a)) or is_frame_dependent(gauge_of(b))):
            if "pair" in a.dims and "pair" in b.dims:
                if not same_data:
                    raise SpecError("b", f"runs {run_a} and {run_b} were computed on different datasets (checksums "
                                    f"{str(prov_a.get('dataset_checksum'))[:12]} vs "
                                    f"{str(prov_b.get('dataset_checksum'))[:12]}); '{n}' is compared pair by pair.",
                                    fix="run both models on the same dataset config, or compare directions only.")
                results[n], gauges[n] = _margins(a, b, params), "invariant"
            else:
                skipped[n] = "invariant but has no pair dim: nothing to correlate"
            continue
        gauge = check_frame(n, a, b, prov_a, prov_b, url, so)
        if a.attrs.get("units") == "direction" and "d_model" in a.dims:
            results[n], gauges[n] = _directions(a, b, params), gauge
        else:
            skipped[n] = f"frame-dependent {a.attrs.get('units')!r}: no cross-model statistic defined"
    for n in paired:
        a, b = va[n], vb[n]
        if is_frame_dependent(gauge_of(a)) or is_frame_dependent(gauge_of(b)):
            raise SpecError("paired", f"'{n}' is frame-dependent ({gauge_of(a)}); accuracy is read from a margin.",
                            fix="name an invariant per-pair margin (paired=margin).")
        if not same_data:
            raise SpecError("b", f"runs {run_a} and {run_b} were computed on different datasets; the paired test "
                            f"of '{n}' needs the same pairs.", fix="run both models on the same dataset config.")
        results[f"paired_{n}"] = paired_accuracy(a, b, n_boot=params.n_boot, seed=params.seed, ci=params.ci,
                                                 name=n, runs=(run_a, run_b))
        gauges[f"paired_{n}"] = "invariant"
    bad = [n for n in (variables or []) if n in skipped]
    if bad:
        raise SpecError("vars", f"cannot compare {bad}: {[skipped[n] for n in bad]}.",
                        fix="name margins (invariant, pair dim) or directions (units direction).")
    if not results:
        raise SpecError("vars", f"nothing comparable in runs {run_a} and {run_b}: {skipped}.",
                        fix="compare runs that store a margin or a direction (e.g. observable=reward_direction).")
    levels = [LEVELS.index(p.get("trust")) if p.get("trust") in LEVELS else 0 for p in (prov_a, prov_b)]
    attrs = {"observable": OBSERVABLE, "runs": [run_a, run_b],
             "model": f"{prov_a.get('model')} vs {prov_b.get('model')}",
             "models": [prov_a.get("model"), prov_b.get("model")],
             "model_fingerprints": [prov_a.get("model_fingerprint"), prov_b.get("model_fingerprint")],
             "spec_hashes": [prov_a.get("spec_hash"), prov_b.get("spec_hash")],
             "dataset": prov_a.get("dataset"), "dataset_checksum": prov_a.get("dataset_checksum"),
             "params": asdict(params), "variables": sorted(results), "paired": paired, "skipped": skipped,
             "gauge": gauges,
             "trust": LEVELS[min(levels)], "package_version": __version__}
    write_run(url, rid, results, attrs, storage_options=so)
    return rid, results, True
