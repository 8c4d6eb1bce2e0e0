"""Catalog rows of the HTML report: one ``Entry`` per complete run, read through the public reader.

Trust comes from the reader's catalog row: ``trust`` is the level shown; where the reader
verifies trust against its evidence it adds ``trust_verified`` (``False`` flags a stored label
that the evidence does not support) and ``trust_reason`` (the evidence), and optionally
``trust_scope``; without those columns the level is shown as the stored label, not verified.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import numpy as np
import warnings
from .arrays import first_objective, mean_ci
from .summary_stats import summary_cell


@dataclass(frozen=True)
class Trust:
    """The trust shown for a run: ``level``, ``verified`` (True/False/None = not checked), evidence, scope."""

    level: str
    verified: bool | None
    evidence: str
    scope: str

    @property
    def status(self) -> str:
        return {True: "verified", False: "NOT verified", None: "stored label"}[self.verified]


@dataclass(frozen=True)
class Entry:
    """One catalog row."""

    run_id: str
    model: str
    dataset: str
    observable: str
    pairs: int | None
    trust: Trust
    created: str
    numbers: str = ""                 # key numbers (``key_numbers``): margin mean [CI], accuracy, top DLA cells

    @property
    def anchor(self) -> str:
        return f"run-{self.run_id}"


def _clean(v):
    """A catalog cell as a plain Python value; NaN/NaT/None -> None."""
    if v is None:
        return None
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):              # lists, dicts
        pass
    return v


def _short(x, n: int = 12) -> str:
    return str(x)[:n] if x else "?"


def trust_of(row: dict, prov: dict) -> Trust:
    """The ``Trust`` of a catalog row (reader columns first, then the run's provenance)."""
    level = _clean(row.get("trust")) or prov.get("trust")
    if level is None:                             # scorecards, frames: evidence, not results
        kind = prov.get("kind") or prov.get("observable") or "record"
        passed = f" (passed: {prov['passed']})" if "passed" in prov else ""
        return Trust("none", None, f"this run is a {kind}{passed}, not a graded result; it carries no trust level",
                     f"observable {prov.get('observable')} (spec {_short(prov.get('observable_spec_hash'))}) on "
                     f"family {prov.get('model_family', '?')}, organism {prov.get('organism', '?')}")
    verified = _clean(row.get("trust_verified", prov.get("trust_verified")))
    verified = None if verified is None else bool(verified)
    reason = _clean(row.get("trust_reason", prov.get("trust_reason")))
    scope = _clean(row.get("trust_scope", prov.get("trust_scope"))) or None     # an empty scope says nothing
    if reason is None:
        if verified is None:
            reason = "label stored with the run; this reader does not re-verify it"
            if prov.get("study_hash"):
                reason += f"; executes study {_short(prov['study_hash'])}"
        else:
            reason = "verified by the store reader" if verified else "the stored label disagrees with its evidence"
    if isinstance(scope, (list, tuple)):
        scope = "; ".join(map(str, scope))
    if scope is None:
        obs = prov.get("observable") or ",".join(prov.get("observables", []))
        family = f" (family {prov['model_family']})" if prov.get("model_family") else ""
        scope = (f"observable {obs} (spec {_short(prov.get('spec_hash'))}) on model {prov.get('model')}{family}, "
                 f"dataset {prov.get('dataset')} ({_short(prov.get('dataset_checksum'))})")
    return Trust(str(level), verified, reason if isinstance(reason, str) else json.dumps(reason),
                 scope if isinstance(scope, str) else json.dumps(scope, sort_keys=True))


def pair_count(prov: dict, datasets: dict) -> int | None:
    """Pairs the run scored: ``effective_n.n_scored`` (else ``n``); a scorecard's pairs per strength;
    else the largest ``pair`` dim stored, else a comparison's ``n_pairs``; None when none is known."""
    eff = prov.get("effective_n")
    if isinstance(eff, dict):
        for k in ("n_scored", "n"):
            if isinstance(eff.get(k), int):
                return eff[k]
    org = prov.get("organism_params")              # scorecards: pairs per organism strength
    if isinstance(org, dict) and isinstance(org.get("n_pairs"), int):
        return org["n_pairs"]
    sizes = [ds.sizes["pair"] for ds in datasets.values() if "pair" in ds.sizes]
    if sizes:
        return int(max(sizes))
    for ds in datasets.values():                  # comparison runs store n_pairs per statistic
        if "n_pairs" in ds and ds["n_pairs"].size == 1:
            return int(ds["n_pairs"].values)
    return None


TOP_DLA = 3


MAX_HEADLINES = 6


def headline(var) -> str:
    """One output's headline: for a numeric variable with a ``pair`` dim whose fitting statistic is a mean
    (``summary_stats.summary_cell``), the mean over pairs of each pair's mean over its other dims with a 95%
    CI (1.96 s.e.) and n; otherwise that statistic (a share per component, an off-diagonal, an estimate with
    its interval)."""
    if not np.issubdtype(var.dtype, np.number) or var.size == 0:
        return ""
    cell = summary_cell(var)
    if "pair" not in var.dims or not cell.startswith("mean "):
        return cell
    other = [d for d in var.dims if d != "pair"]
    per_pair = var.where(np.isfinite(var)).mean(other, skipna=True) if other else var
    v = np.asarray(per_pair.values, float)
    v = v[np.isfinite(v)]
    if not v.size:
        return cell
    m, lo, hi = (float(x) for x in mean_ci(v))
    return f"mean {m:.3g} [{lo:.3g}, {hi:.3g}] (n={v.size})"


def key_numbers(datasets: dict) -> str:
    """A run's key numbers for the catalog, from its stored variables, for any observable: ``margin`` mean
    with its 95% CI (1.96 s.e.) and n; accuracy = share of finite margins > 0 (chosen preferred, by the pairs'
    labels); the top ``TOP_DLA`` layer × component cells by |mean dla| over pairs; then, up to
    ``MAX_HEADLINES`` in all, every other output's ``headline``. First objective only; "" when nothing
    numeric is stored."""
    parts: list[str] = []
    done: set[str] = set()
    for ds in datasets.values():
        if "margin" in ds and "pair" in ds["margin"].dims and "margin" not in done:
            done.add("margin")
            da, tag = first_objective(ds["margin"])
            v = np.asarray(da.values, float).ravel()
            v = v[np.isfinite(v)]
            if v.size:
                m, lo, hi = (float(x) for x in mean_ci(v))
                parts.append(f"margin{tag} {m:.3g} [{lo:.3g}, {hi:.3g}] (n={v.size})")
                parts.append(f"accuracy {(v > 0).mean():.3f} ({int((v > 0).sum())}/{v.size} margin > 0)")
        if "dla" in ds and {"pair", "layer", "component"} <= set(ds["dla"].dims) and "dla" not in done:
            done.add("dla")
            da = first_objective(ds["dla"])[0].transpose("pair", "layer", "component")
            vals = np.asarray(da.values, float)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)          # cells undefined in every pair stay NaN
                mean = np.nanmean(vals, 0)
            flat = [(abs(mean[i, j]), mean[i, j], i, j) for i in range(mean.shape[0]) for j in range(mean.shape[1])
                    if np.isfinite(mean[i, j])]
            top = sorted(flat, key=lambda t: -t[0])[:TOP_DLA]
            layers, comps = da["layer"].values, da["component"].values
            if top:
                parts.append("top dla " + ", ".join(f"{comps[j]}_L{layers[i]} {v:+.3g}" for _, v, i, j in top))
    for ds in datasets.values():
        for name in sorted(map(str, ds.data_vars)):
            if name in done or len(parts) >= MAX_HEADLINES:
                continue
            done.add(name)
            cell = headline(first_objective(ds[name])[0])
            if cell:
                parts.append(f"{name} {cell}")
    return "; ".join(parts)


def entry(row: dict, prov: dict, datasets: dict) -> Entry:
    created = _clean(row.get("created"))
    created = created.isoformat(timespec="seconds") if hasattr(created, "isoformat") else str(prov.get("created", ""))
    obs = prov.get("observable") or ",".join(map(str, row.get("observables") or []))
    if prov.get("kind") == "scorecard":          # a card's ``observable`` attr names what it graded
        obs = f"scorecard:{obs}"
    organism = f"organism {prov['organism']}" if prov.get("organism") else None
    return Entry(run_id=str(row["run_id"]),
                 model=str(_clean(row.get("model")) or prov.get("model") or prov.get("base") or "?"),
                 dataset=str(_clean(row.get("dataset")) or prov.get("dataset") or organism or "?"), observable=str(obs),
                 pairs=pair_count(prov, datasets), trust=trust_of(row, prov), created=created,
                 numbers=key_numbers(datasets))
