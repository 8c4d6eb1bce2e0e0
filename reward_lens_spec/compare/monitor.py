"""Anytime-valid monitor of a checkpoint sequence: has the model's margin (or accuracy) moved?

``reward-lens-spec monitor url=STORE observable=NAME [model=] [statistic=margin|accuracy] [alpha=0.05]
[min_change=0] [dimensions=a,b]``. Reads the sequence's runs as ``drift`` does (``compare.drift.
sequence_runs``: one observable, checkpoint order, chain checked) and tests each interval k (checkpoint
k−1 → k) from the per-pair changes on the same pairs:

  statistic=margin     d_i = Δ_k(i) − Δ_{k−1}(i) (reward units). H0_k: the per-pair change's median lies
                       in [−min_change, +min_change] (for a symmetric change, its mean); pairs independent.
  statistic=accuracy   d_i = 1[Δ_k(i) > 0] − 1[Δ_{k−1}(i) > 0] ∈ {−1, 0, 1}. H0_k: E[d] = 0 (accuracy
                       unchanged); ``min_change`` is not used.

Method: testing by betting (Shafer 2021, JRSS A 184:407; Waudby-Smith & Ramdas 2024, "Estimating means
of bounded random variables by betting", JRSS B 86:1). For each side, bets x_i ∈ [−1, 1] with E[x_i] ≤ 0
under H0 (margin: x_i = +1 when d_i > min_change, else −1, and the mirror for the down side; accuracy:
x_i = ±d_i), the wealth ∏ (1 + λ x_i) is a nonnegative supermartingale over pairs for every fixed λ ∈
(0, 1); its average over the grid ``LAMBDAS`` is too, and the e-value is the mean of the up and down
sides' averages. By Ville's inequality it exceeds 1/a with probability ≤ a under H0 at any number of
pairs (Ville 1939). Across intervals, interval k is given the share a_k = alpha · 6 / (π² k²) (Σ a_k =
alpha) and alarms when e_k ≥ 1 / a_k: by Markov's inequality and the union bound, the chance of any
false alarm over the whole, ever-growing sequence is ≤ alpha, whatever the dependence between intervals
(e-values and their calibration: Vovk & Wang 2021, Ann. Stat. 49:1736). So a user may look after every
new checkpoint and stop at the first alarm.

Output (dim ``interval``, the later checkpoint's index k ≥ 1; coords ``step_from``, ``step_to``):
``e_value`` (e-value), ``threshold`` (1/a_k), ``alarm`` (1/0), ``n_up``, ``n_down`` (pairs whose change
bets up / down), ``n_pairs`` (count). attrs ``first_alarm`` ("step A -> step B" or "none"), ``alpha``,
``statistic``, ``min_change``, ``method``. Stored as run ``monitor-<hash>``. Deterministic (no random
step). Raises ``SpecError`` (no sequence, fewer than two checkpoints, runs without a margin, pairs that
differ between checkpoints, a bad key or value).
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import xarray as xr

from ..errors import SpecError
import sys
from .cli import parse_args
from ..errors import RewardLensError
from .runs import run_variables
from .. import __version__
from .drift import sequence_runs
from ..store import is_complete, open_store, write_run

OBSERVABLE = "monitor"
LAMBDAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
STATISTICS = ("margin", "accuracy")


def betting_e_value(x) -> float:
    """Mixture-of-bets e-value ``mean_λ ∏ (1 + λ x_i)`` over ``LAMBDAS``, bets ``x`` in [−1, 1] (module doc)."""
    x = np.clip(np.asarray(x, np.float64), -1.0, 1.0)
    return float(np.mean([math.exp(float(np.sum(np.log1p(lam * x)))) for lam in LAMBDAS]))


def spend(k: int, alpha: float) -> float:
    """Interval k's share of alpha: alpha · 6 / (π² k²), k ≥ 1 (the shares sum to alpha)."""
    return alpha * 6.0 / (math.pi ** 2 * k * k)


def interval_test(before: np.ndarray, after: np.ndarray, statistic: str, min_change: float) -> dict:
    """e-value and counts of one interval from two margin vectors over the same pairs (module doc)."""
    if statistic == "accuracy":
        d = (after > 0).astype(float) - (before > 0).astype(float)
        up, down = d, -d
    else:
        d = after - before
        up, down = np.where(d > min_change, 1.0, -1.0), np.where(d < -min_change, 1.0, -1.0)
    return {"e_value": 0.5 * (betting_e_value(up) + betting_e_value(down)), "n_up": int((up > 0).sum()),
            "n_down": int((down > 0).sum()), "n_pairs": int(d.size)}


def monitor_series(margins: list[np.ndarray], *, statistic: str = "margin", alpha: float = 0.05,
                   min_change: float = 0.0) -> dict:
    """Per interval k = 1..K−1: e-value, threshold, alarm and counts from K aligned margin vectors."""
    if statistic not in STATISTICS:
        raise SpecError("statistic", f"unknown statistic {statistic!r}.", value=statistic, options=STATISTICS)
    if not 0 < alpha < 1:
        raise SpecError("alpha", f"must lie in (0, 1), got {alpha}.", fix="e.g. alpha=0.05.")
    if not (min_change >= 0 and math.isfinite(min_change)):
        raise SpecError("min_change", f"must be a finite number ≥ 0 (reward units), got {min_change}.",
                        fix="e.g. min_change=0 (any change counts) or min_change=0.5.")
    rows = [interval_test(margins[k - 1], margins[k], statistic, min_change) for k in range(1, len(margins))]
    out = {key: [r[key] for r in rows] for key in ("e_value", "n_up", "n_down", "n_pairs")}
    out["threshold"] = [1.0 / spend(k, alpha) for k in range(1, len(margins))]
    out["alarm"] = [int(e >= t) for e, t in zip(out["e_value"], out["threshold"])]
    return out


def _margins(st, runs, dimensions) -> tuple[list[np.ndarray], int]:
    vecs, ids = [], None
    for rid, _ in runs:
        m = run_variables(st, rid).get("margin")
        if m is None:
            raise SpecError("observable", f"run {rid} stores no margin to monitor.",
                            fix="monitor runs of an observable that stores the margin (e.g. score).")
        if dimensions and "dimension" not in m.coords:
            raise SpecError("dimensions", f"run {rid}'s pairs carry no subset labels to select from.",
                            fix="drop dimensions=.")
        if dimensions:
            m = m.isel(pair=np.isin([str(x) for x in m["dimension"].values], list(dimensions)))
        m = m.sortby("pair")
        if m.dims != ("pair",) or not m.sizes["pair"]:
            raise SpecError("observable", f"run {rid}: the margin has dims {m.dims} and {m.sizes.get('pair', 0)} "
                            "pairs here; the monitor reads one margin per pair.", fix="check dimensions=.")
        here = [str(x) for x in m["pair"].values]
        if ids is not None and here != ids:
            raise SpecError("observable", f"run {rid} holds other pairs than the sequence's first run.",
                            fix="run every checkpoint on one dataset config.")
        ids = here
        vecs.append(np.asarray(m.values, np.float64))
    return vecs, len(ids or [])


def monitor(url: str, observable: str, model: str | None = None, *, statistic: str = "margin",
            alpha: float = 0.05, min_change: float = 0.0, dimensions=None,
            storage_options: dict | None = None) -> tuple[str, xr.Dataset, bool]:
    """Monitor one stored checkpoint sequence (module doc); ``(run_id, Dataset, written)``."""
    so = dict(storage_options or {})
    st = open_store(url, storage_options=so)
    runs = sequence_runs(st, observable, model)
    if len(runs) < 2:
        raise SpecError("observable", f"the sequence holds {len(runs)} checkpoint run(s); a change needs two.",
                        fix="run more checkpoints (model.checkpoint=all).")
    params = {"statistic": statistic, "alpha": alpha, "min_change": min_change,
              "dimensions": sorted(dimensions or [])}
    rid = f"{OBSERVABLE}-" + hashlib.sha256(json.dumps(
        {"runs": [r for r, _ in runs], "spec": [p.get("spec_hash") for _, p in runs], "params": params,
         "version": __version__}, sort_keys=True).encode()).hexdigest()[:20]
    if is_complete(url, rid, storage_options=so):
        res = st.load(rid, OBSERVABLE, lazy=False)
        return rid, (res.to_dataset() if hasattr(res, "to_dataset") else res), False
    vecs, _ = _margins(st, runs, dimensions)
    res = monitor_series(vecs, statistic=statistic, alpha=alpha, min_change=min_change)
    steps = [p["checkpoint"]["step"] for _, p in runs]
    label = [f"step{s}" if s is not None else str(p["checkpoint"]["label"]) for s, (_, p) in zip(steps, runs)]
    units = {"e_value": "e-value", "threshold": "e-value", "alarm": "indicator"}
    ds = xr.Dataset({k: xr.DataArray(np.asarray(v), dims=("interval",), attrs={"units": units.get(k, "count"),
                                                                              "gauge": "invariant"})
                     for k, v in res.items()},
                    coords={"interval": list(range(1, len(runs))), "step_from": ("interval", label[:-1]),
                            "step_to": ("interval", label[1:])})
    first = next((f"{label[k - 1]} -> {label[k]}" for k, a in zip(ds["interval"].values, res["alarm"]) if a), "none")
    ds.attrs = {"first_alarm": first, **params, "dimensions": params["dimensions"],
                "method": "testing by betting (mixture over lambda), alpha spent as alpha*6/(pi^2 k^2) over intervals"}
    attrs = {"observable": OBSERVABLE, "runs": [r for r, _ in runs], "read_observable": observable,
             "model": str(runs[0][1].get("model", "")).split("@", 1)[0] + " (checkpoints)",
             "dataset_checksum": runs[0][1].get("dataset_checksum"), "params": params, "first_alarm": first,
             "trust": "exploratory", "package_version": __version__}
    write_run(url, rid, {OBSERVABLE: ds}, attrs, storage_options=so)
    return rid, ds, True


KEYS = ("url", "observable", "model", "statistic", "alpha", "min_change", "dimensions")
USAGE = ("reward-lens-spec monitor url=STORE observable=NAME [model=NAME] [statistic=margin|accuracy] "
         "[alpha=0.05] [min_change=0] [dimensions=a,b]")


def main(argv: list[str] | None = None) -> int:
    """The ``monitor`` command: one line per interval, then the first alarm. 0, or 2 after a one-line error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv, KEYS, ("url", "observable"), USAGE)
        kw = {}
        for key in ("alpha", "min_change"):
            if key in args:
                try:
                    kw[key] = float(args[key])
                except ValueError:
                    raise SpecError(key, f"must be a number, got {args[key]!r}.",
                                    fix=f"e.g. {key}={0.05 if key == 'alpha' else 0}.") from None
        dims = [d for d in args.get("dimensions", "").split(",") if d] or None
        rid, ds, written = monitor(args["url"], args["observable"], args.get("model"),
                                   statistic=args.get("statistic", "margin"), dimensions=dims, **kw)
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for i in range(ds.sizes["interval"]):
        r = ds.isel(interval=i)
        print(f"{r['step_from'].item()} -> {r['step_to'].item():<10} e {float(r['e_value']):>12.4g}  threshold "
              f"{float(r['threshold']):>10.4g}  {'ALARM' if int(r['alarm']) else 'ok':<5}  up {int(r['n_up'])}  "
              f"down {int(r['n_down'])}  n={int(r['n_pairs'])}")
    print(f"first alarm: {ds.attrs.get('first_alarm')} (statistic {ds.attrs.get('statistic')}, alpha "
          f"{ds.attrs.get('alpha')}, any false alarm over the whole sequence <= alpha)")
    print(f"{'stored' if written else 'already stored (reused)'}: {args['url']} run {rid}")
    return 0
