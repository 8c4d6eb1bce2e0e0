"""Drift across a checkpoint sequence: the stored runs of every checkpoint, compared in training order.

Reads the complete runs of one observable whose provenance carries a ``checkpoint`` record
(``models.checkpoints``; a ``-m model.checkpoint=all`` sweep writes one run per checkpoint into one
store), checks their chain (``c_i = H(c_{i-1}, d_i)`` between consecutive runs, and every run's own
record), and compares each checkpoint with the ``previous`` one and with the ``last``. Needs no model.

Per checkpoint (dim ``checkpoint``, coords ``step``, ``label``, ``run_id``), from what the runs store
(``conf/observable/examples/checkpoint_dynamics.yaml`` stores all of it; a variable a run lacks is
skipped, listed in attrs ``skipped``):

  mean_margin, accuracy          of ``margin`` over the pairs (reward units; fraction, ties ½)
  crystallization_fraction       median over pairs of the stored per-pair fraction (fraction)
  vs ``reference`` ∈ {previous, last} (NaN where there is none, e.g. checkpoint 0 vs previous):
  margin_spearman (+ _ci_low/_ci_high)   Spearman ρ of the margins over pairs, percentile-bootstrap CI
                                 (``ops.margin_agreement.compare_margins``, as ``compare`` uses)
  cka, procrustes_residual       of the readout activations ``h`` (both sides stacked: 2·pairs rows;
                                 ``compare.similarity``)
  w_r_cosine, margin_direction_cosine (+ _null_q95, _p_value)
                                 cosine of the reward direction (covector) and of the mean chosen −
                                 rejected direction of ``h`` (vector) in a SHARED frame fitted for the two
                                 checkpoints on those same activations (``frames.fit_shared``: each whitened,
                                 then orthogonal Procrustes), beside the random-direction null of
                                 ``frames.compare_directions``; ``frame_underdetermined`` where rows ≤ d_model
                                 (the alignment is then fixed on the data span only: read such cosines as such)

attrs ``largest_change``: for each series, the step interval where it moved most between consecutive
checkpoints (accuracy / mean margin: largest |jump|; similarities: lowest) — where training changed
the model. The result is stored as run ``drift-<hash>`` (variables ``drift``) with provenance (runs,
models, fingerprints, chain hashes, dataset checksum, params). Raises ``SpecError`` (no runs, several
sequences, two runs of one checkpoint, a broken chain, pairs that differ, activations not in the
native frame), ``StoreError``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr

from ..errors import SpecError
from .similarity import linear_cka, procrustes_residual
import sys
from .cli import parse_args
from ..errors import RewardLensError
from ..models.checkpoints import link
from ..ops.margin_agreement import compare_margins
from .runs import run_variables
from ..levels import LEVELS
from ..frames import as_direction, compare_directions, fit_shared
from .. import __version__
from ..store import is_complete, open_store, write_run

OBSERVABLE = "drift"
REFERENCES = ("previous", "last")


@dataclass(frozen=True)
class DriftParams:
    n_null: int = 1000
    n_boot: int = 200
    n_perm: int = 0
    seed: int = 0
    ci: float = 0.95


def sequence_runs(st, observable: str, model: str | None = None) -> list[tuple[str, dict]]:
    """``[(run_id, provenance)]`` of one checkpoint sequence's runs of ``observable``, in checkpoint order;
    the chain checked (see the module doc). ``model``: the sequence's model name (before ``@``)."""
    groups: dict = {}
    for rid in list(st.runs()["run_id"]):
        prov = st.provenance(rid)
        cp = prov.get("checkpoint")
        if not isinstance(cp, dict) or prov.get("observable") != observable:
            continue
        base = str(prov.get("model", "")).split("@", 1)[0]
        if model is not None and base != model:
            continue
        groups.setdefault((base, cp["n"], cp["digests"][0], prov.get("dataset_checksum")), []).append((rid, prov))
    if not groups:
        raise SpecError("observable", f"no complete run of '{observable}' on a checkpoint sequence"
                        + (f" of model '{model}'" if model else "") + " in this store.",
                        fix="run the sequence first: reward-lens-spec -m model=<sequence> model.checkpoint=all "
                            f"observable={observable} store.url=<this store>")
    if len(groups) > 1:
        names = sorted(f"{k[0]} ({k[1]} checkpoints, data {str(k[3])[:12]})" for k in groups)
        raise SpecError("model", f"the store holds several checkpoint sequences of '{observable}': {names}.",
                        fix="name one: model=<name>, or keep one sequence per store.")
    runs = sorted(next(iter(groups.values())), key=lambda r: r[1]["checkpoint"]["index"])
    seen: dict = {}
    for rid, prov in runs:
        cp = prov["checkpoint"]
        c = None
        for d in cp["digests"]:
            c = link(c, d)
        if c != cp["chain_sha256"] or cp["digests"][-1] != cp["content_sha256"]:
            raise SpecError("checkpoint", f"run {rid}: its chain record does not hash to its chain_sha256.",
                            fix="the record was altered; rerun that checkpoint (store.force=true).")
        if cp["index"] in seen:
            raise SpecError("checkpoint", f"runs {seen[cp['index']]} and {rid} both hold checkpoint {cp['index']} "
                            "(a checkpoint changed between sweeps?).", fix="sweep into a fresh store.")
        seen[cp["index"]] = rid
    for (ra, pa), (rb, pb) in zip(runs, runs[1:]):
        a, b = pa["checkpoint"], pb["checkpoint"]
        if b["digests"][: a["index"] + 1] != a["digests"]:
            raise SpecError("checkpoint", f"runs {ra} and {rb} disagree on checkpoints 0..{a['index']}: not one chain.",
                            fix="sweep the sequence again into a fresh store.")
    return runs


def _h_rows(h: xr.DataArray, model: str) -> np.ndarray:
    g = str(h.attrs.get("gauge", ""))
    if g and not g.startswith("frame:native:"):
        raise SpecError("h", f"the readout activations of {model} are stored in {g}; drift fits its own shared "
                        "frames from native activations.", fix="run the sequence with frame=native (the default).")
    return np.asarray(h.transpose("pair", "side", "d_model").values, np.float64).reshape(-1, h.sizes["d_model"])


def _directions(va, vb, name_a, name_b, ha, hb, p: DriftParams) -> dict:
    """Cosines of w_r and of the mean margin-difference direction in a shared frame of two checkpoints."""
    out = {}
    frame = fit_shared(ha, hb, (name_a, name_b))
    out["frame_underdetermined"] = float(bool(frame.provenance.get("underdetermined")))
    if "w_r" in va and "w_r" in vb:
        wa = np.asarray(va["w_r"].values, np.float64).reshape(-1, frame.d)[0]
        wb = np.asarray(vb["w_r"].values, np.float64).reshape(-1, frame.d)[0]
        res = compare_directions(as_direction(wa, name_a, "w_r"), as_direction(wb, name_b, "w_r"), frame,
                                 n_null=p.n_null, seed=p.seed)
        out.update(w_r_cosine=float(res["cosine"]), w_r_null_q95=float(res["null_abs_cosine"].sel(quantile=0.95)),
                   w_r_p_value=float(res["p_value"]))
    if "margin_direction" in va and "margin_direction" in vb:
        da = frame.to_frame(np.asarray(va["margin_direction"].values, np.float64).reshape(-1), name_a, center=False)
        db = frame.to_frame(np.asarray(vb["margin_direction"].values, np.float64).reshape(-1), name_b, center=False)
        wrap = [xr.DataArray(v, dims=("d_model",), name="margin_direction", attrs={"gauge": frame.gauge})
                for v in (da, db)]
        res = compare_directions(*wrap, frame, n_null=p.n_null, seed=p.seed)
        out.update(margin_direction_cosine=float(res["cosine"]),
                   margin_direction_null_q95=float(res["null_abs_cosine"].sel(quantile=0.95)),
                   margin_direction_p_value=float(res["p_value"]))
    return out


def _margin_vector(v: xr.DataArray) -> xr.DataArray:
    extra = [d for d in v.dims if d != "pair"]
    if any(v.sizes[d] != 1 for d in extra):
        raise SpecError("margin", f"margin has dims {v.dims}; drift reads one objective.",
                        fix="run the sequence with one objective (model.num_labels=1 or model.objectives=[name]).")
    return v.squeeze(extra, drop=True) if extra else v


def _pairwise(va, vb, name_a, name_b, p: DriftParams) -> dict:
    out = {}
    if "margin" in va and "margin" in vb:
        ma, mb = _margin_vector(va["margin"]), _margin_vector(vb["margin"])
        if list(ma["pair"].values) != list(mb["pair"].values):
            raise SpecError("margin", f"{name_a} and {name_b} were scored on different pairs.",
                            fix="run every checkpoint on one dataset config.")
        res = compare_margins(ma.reset_coords(drop=True), mb.reset_coords(drop=True), n_boot=p.n_boot,
                              n_perm=p.n_perm, seed=p.seed, ci=p.ci).sel(statistic="spearman")
        out.update(margin_spearman=float(res["estimate"]), margin_spearman_ci_low=float(res["ci_low"]),
                   margin_spearman_ci_high=float(res["ci_high"]))
    if "h" in va and "h" in vb:
        ha, hb = _h_rows(va["h"], name_a), _h_rows(vb["h"], name_b)
        out.update(cka=linear_cka(ha, hb), procrustes_residual=procrustes_residual(ha, hb))
        out.update(_directions(va, vb, name_a, name_b, ha, hb, p))
    return out


def _single(v: dict) -> dict:
    out = {}
    if "margin" in v:
        m = np.asarray(_margin_vector(v["margin"]).values, np.float64)
        out.update(mean_margin=float(np.nanmean(m)), accuracy=float(np.mean((m > 0) + 0.5 * (m == 0))))
    if "crystallization_fraction" in v:
        c = np.asarray(v["crystallization_fraction"].values, np.float64)
        out["crystallization_fraction"] = float(np.nanmedian(c)) if np.isfinite(c).any() else float("nan")
    return out


VARIABLES = ("mean_margin", "accuracy", "crystallization_fraction", "margin_spearman", "margin_spearman_ci_low",
             "margin_spearman_ci_high", "cka", "procrustes_residual", "frame_underdetermined", "w_r_cosine",
             "w_r_null_q95", "w_r_p_value", "margin_direction_cosine", "margin_direction_null_q95",
             "margin_direction_p_value")   # every variable a drift run can store (trust.coverage grades or explains)
UNITS = {"mean_margin": "reward", "accuracy": "fraction", "crystallization_fraction": "fraction",
         "cka": "fraction", "procrustes_residual": "fraction", "frame_underdetermined": "boolean"}


def _largest_change(ds: xr.Dataset) -> dict:
    steps, out = [str(s) for s in ds["label"].values], {}
    for name, how in (("accuracy", "jump"), ("mean_margin", "jump"), ("cka", "low"), ("margin_spearman", "low"),
                      ("w_r_cosine", "low"), ("margin_direction_cosine", "low"), ("procrustes_residual", "high")):
        if name not in ds or ds.sizes["checkpoint"] < 2:
            continue
        if how == "jump":
            v = np.abs(np.diff(ds[name].values))
            k = int(np.nanargmax(v)) + 1 if np.isfinite(v).any() else None
        else:
            v = ds[name].sel(reference="previous").values[1:]
            k = (int(np.nanargmin(v) if how == "low" else np.nanargmax(v)) + 1) if np.isfinite(v).any() else None
        if k is not None:
            out[name] = f"{steps[k - 1]} -> {steps[k]}"
    return out


def drift(url: str, observable: str, model: str | None = None, params: DriftParams = DriftParams(), *,
          storage_options: dict | None = None) -> tuple[str, xr.Dataset, bool]:
    """Drift of one checkpoint sequence's runs of ``observable`` in store ``url`` (see the module doc).
    Returns ``(run_id, Dataset, written)``; ``written`` False when the same drift was stored before."""
    so = dict(storage_options or {})
    st = open_store(url, storage_options=so)
    runs = sequence_runs(st, observable, model)
    rids = [r for r, _ in runs]
    rid = f"{OBSERVABLE}-" + hashlib.sha256(json.dumps(
        {"runs": rids, "spec": [p.get("spec_hash") for _, p in runs], "params": asdict(params),
         "version": __version__}, sort_keys=True).encode()).hexdigest()[:20]
    if is_complete(url, rid, storage_options=so):
        res = st.load(rid, OBSERVABLE, lazy=False)
        return rid, (res.to_dataset() if hasattr(res, "to_dataset") else res), False
    names = [str(p["model"]) for _, p in runs]
    vs = [run_variables(st, r) for r in rids]
    K = len(runs)
    single = [_single(v) for v in vs]
    pair = {ref: [None] * K for ref in REFERENCES}
    for i in range(K):
        if i:
            pair["previous"][i] = _pairwise(vs[i - 1], vs[i], names[i - 1], names[i], params)
        pair["last"][i] = _pairwise(vs[i], vs[-1], names[i], names[-1], params) if i < K - 1 else None
    keys = sorted({k for d in pair["previous"] + pair["last"] if d for k in d})
    coords = {"checkpoint": [p["checkpoint"]["index"] for _, p in runs],
              "step": ("checkpoint", [-1 if p["checkpoint"]["step"] is None else p["checkpoint"]["step"]
                                      for _, p in runs]),
              "label": ("checkpoint", [p["checkpoint"]["label"] for _, p in runs]),
              "run_id": ("checkpoint", rids)}
    data = {}
    for k in sorted({k for d in single for k in d}):
        data[k] = xr.DataArray([d.get(k, np.nan) for d in single], dims=("checkpoint",),
                               attrs={"units": UNITS.get(k, "cosine"), "gauge": "invariant"})
    for k in keys:
        vals = [[(pair[ref][i] or {}).get(k, np.nan) for ref in REFERENCES] for i in range(K)]
        units = UNITS.get(k, "probability" if k.endswith("p_value") else
                          ("correlation" if k.startswith("margin_spearman") else "cosine"))
        data[k] = xr.DataArray(np.asarray(vals, np.float64), dims=("checkpoint", "reference"),
                               attrs={"units": units, "gauge": "invariant"})
    if not data:
        raise SpecError("observable", f"runs of '{observable}' store none of margin, h, w_r, margin_direction, "
                        "crystallization_fraction: nothing to follow over training.",
                        fix="observable=examples/checkpoint_dynamics")
    ds = xr.Dataset(data, coords={**coords, "reference": list(REFERENCES)})
    ds.attrs["largest_change"] = _largest_change(ds)
    wanted = ("margin", "h", "w_r", "margin_direction", "crystallization_fraction")
    skipped = [n for n in wanted if not all(n in v for v in vs)]
    levels = [LEVELS.index(p.get("trust")) if p.get("trust") in LEVELS else 0 for _, p in runs]
    attrs = {"observable": OBSERVABLE, "runs": rids, "read_observable": observable, "models": names,
             "model": names[0].split("@", 1)[0] + " (checkpoints)",
             "model_fingerprints": [p.get("model_fingerprint") for _, p in runs],
             "chain": [p["checkpoint"]["chain_sha256"] for _, p in runs],
             "spec_hashes": [p.get("spec_hash") for _, p in runs], "dataset": runs[0][1].get("dataset"),
             "dataset_checksum": runs[0][1].get("dataset_checksum"), "params": asdict(params),
             "skipped": skipped, "largest_change": ds.attrs["largest_change"], "trust": LEVELS[min(levels)],
             "package_version": __version__}
    write_run(url, rid, {OBSERVABLE: ds}, attrs, storage_options=so)
    return rid, ds, True


KEYS = ("url", "observable", "model", "n_null", "n_boot", "n_perm", "seed", "ci")
USAGE = "reward-lens-spec drift url=STORE observable=NAME [model=NAME] [n_null= n_boot= n_perm= seed= ci=]"


def parse(argv: list[str]) -> dict:
    """``drift``'s arguments (``compare.cli.parse_args``); ``SpecError`` naming a bad key or value."""
    return parse_args(argv, KEYS, ("url", "observable"), USAGE)


def main(argv: list[str] | None = None) -> int:
    """The ``drift`` command: compute (or find) and store the drift, print one line per checkpoint. 0, or 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
        params = DriftParams(**{k: args[k] for k in ("n_null", "n_boot", "n_perm", "seed", "ci") if k in args})
        rid, ds, written = drift(args["url"], args["observable"], args.get("model"), params)
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cols = [c for c in ("accuracy", "mean_margin", "margin_spearman", "cka", "procrustes_residual", "w_r_cosine",
                        "margin_direction_cosine", "crystallization_fraction") if c in ds]
    print(f"{'checkpoint':<12}" + "".join(f"{c[:14]:>15}" for c in cols) + "   (vs previous)")
    for i in range(ds.sizes["checkpoint"]):
        row = ds.isel(checkpoint=i)
        vals = [row[c].sel(reference="previous") if "reference" in row[c].dims else row[c] for c in cols]
        print(f"{str(row['label'].item()):<12}" + "".join(f"{float(v):>15.4f}" for v in vals))
    for name, where in ds.attrs.get("largest_change", {}).items():
        print(f"largest change of {name}: {where}")
    print(f"{'stored' if written else 'already stored (reused)'}: {args['url']} run {rid}")
    return 0
