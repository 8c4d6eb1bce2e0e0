"""Verification by recomputation (``reward-lens-spec store verify url=... recompute=K``).

A seal says the stored numbers are the ones written; recomputing says they are the ones the code gives.

* a **result run**: its stored resolved config (``config_yaml``) is composed and validated again
  (``run.compose.finish``), its dataset loaded (``inputs``), K of its stored pairs sampled
  (seeded, reproducible) and the plan executed on those pairs alone, in memory, through the one
  executor (``run.executor.compute``). Every stored per-pair output is compared with the recomputed one
  on those pairs: max |Δ| per variable, within ``RTOL`` × the variable's largest stored |value|
  (float error of another batch composition). A dim whose size depends on the data (PRM steps, response
  positions) is sized over the sample alone, so the recomputed rows are NaN-padded to the stored width
  first (``run.stream_arrays.pad_widths``): stored values past the sample's width then mismatch. The
  descriptive fields (dataset name and checksum, the counts ``effective_n`` incl. ``n_scored``,
  ``data_flags``, the ``excluded`` and flagged pair ids) are re-derived from the data file and the tokenizer
  over every pair and must equal the stored ones (``descriptive_mismatches``). Outputs that reduce over
  pairs, or that are expressed in
  a fitted frame, cannot be recomputed from a sample and are named as skipped. A run whose model (or
  dataset file) is not at hand is skipped, saying why; a mismatch fails.
* a **scorecard**: its organism check is graded again (``trust.scorecard.grade``: same observable,
  organism kind, base, seed and pair count) and every reading compared with the stored one (same
  ``RTOL``); the organism must rebuild to the stored checksum.

Returns lines for ``store verify`` and whether everything recomputed agreed.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from ..data.accounting import accounting
import yaml
from ..errors import RewardLensError
from ..run.executor import compute
from ..inputs import encode, load_dataset, load_lm
from omegaconf import OmegaConf
from ..observables import load_observable
from ..run.compose import finish
from ..planning import data_dims, plan_for
from ..run.stream_arrays import pad_widths
from ..identity import observable_hash
from .scorecard import grade

RTOL = 1e-3


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    d = np.where(both_nan, 0.0, np.abs(a - b))
    return float(np.nanmax(np.where(np.isnan(d), np.inf, d))) if d.size else 0.0


def recompute_run(store, run_id: str, k: int, *, base_dir: str, seed: int = 0) -> tuple[bool | None, str]:
    """``(True | False | None (skipped), detail)`` for one result run; see the module doc."""
    attrs = store.document(run_id)
    text = attrs.get("config_yaml")
    if not isinstance(text, str) or "observable" not in (yaml.safe_load(text) or {}):
        return None, "no resolved run config to recompute from"
    try:
        run, _ = finish(OmegaConf.create(text), [])
        plan, info = plan_for(run, base_dir)
        pairs = load_dataset(run.dataset, base_dir)
        lm = load_lm(run.model, base_dir)
        enc = encode(lm, pairs, run.model)
    except (RewardLensError, OSError, ValueError) as e:
        return None, f"not recomputed: model or data not at hand ({type(e).__name__}: {str(e)[:160]})"
    wrong = descriptive_mismatches(attrs, run, pairs, enc)
    described = "descriptive fields " + ("MISMATCH: " + "; ".join(wrong) if wrong else "agree")
    stored = store.load(run_id, run.observable.name, lazy=False)           # digest-checked as read
    expressed = set((attrs.get("frame") or {}).get("expressed_outputs") or ())
    per_pair = [v for v in stored if "pair" in stored[v].dims and v not in expressed]
    if not per_pair:
        return (False if wrong else None), f"{described}; no per-pair output to recompute on a sample"
    have = [str(p) for p in stored[per_pair[0]]["pair"].values]
    ids = [i for i in pairs.ids if i in set(have)]
    rng = np.random.default_rng(seed)
    chosen = set(rng.choice(ids, size=min(k, len(ids)), replace=False).tolist()) if ids else set()
    sub = dataclasses.replace(pairs, pairs=tuple(p for p in pairs if p.id in chosen))
    m = run.model
    bs = attrs.get("batch_size") if isinstance(attrs.get("batch_size"), int) else m.batch_size   # auto: as run
    result, _, _ = compute(lm, sub, plan, info, fmt=m.format.value, template=m.template, max_length=m.max_length,
                           batch_size=bs if isinstance(bs, int) else 1, max_tokens=m.max_tokens, padding_side=m.padding_side.value)
    ok, parts = True, []
    for v in per_pair:
        if v not in result:
            ok = False
            parts.append(f"{v}: not recomputed")
            continue
        keep = [i for i in (str(p) for p in result[v]["pair"].values) if i in chosen]
        got = result[v].sel(pair=keep)
        want = stored[v].sel(pair=keep).transpose(*got.dims)
        wider = {d: want.sizes[d] for d in data_dims(plan).get(v, ()) if want.sizes[d] > got.sizes[d]}
        got = pad_widths(got, wider, v)
        if got.shape != want.shape:
            ok = False
            parts.append(f"{v}: shape {dict(got.sizes)} recomputed, {dict(want.sizes)} stored MISMATCH")
            continue
        scale = float(np.nanmax(np.abs(np.asarray(stored[v].values, np.float64)), initial=0.0))
        diff = _max_diff(got.values, want.values)
        good = diff <= RTOL * max(scale, 1e-6)
        ok &= good
        parts.append(f"{v} max|Δ| {diff:.3g}" + ("" if good else f" > {RTOL:g} × {scale:.3g} MISMATCH"))
    skipped = sorted(set(stored) - set(per_pair))
    return ok and not wrong, (f"{described}; recomputed {len(chosen)} pair(s): " + ", ".join(parts)
                              + (f"; not recomputable from a sample: {', '.join(skipped)}" if skipped else ""))


def _plain(x):
    """``x`` as its JSON round trip (what a stored document holds)."""
    return json.loads(json.dumps(x, sort_keys=True, default=str))


def descriptive_mismatches(attrs: dict, run, pairs, enc) -> list[str]:
    """The run document's descriptive fields that differ from the ones re-derived from its config, its data
    file and the model's tokenizer (as ``run.executor`` derives them): ``dataset``, ``dataset_checksum``,
    ``observable``, ``model``, ``effective_n`` (``n``, ``n_scored``, ``n_unique``, ``n_prompt_clusters``),
    ``data_flags``, ``excluded`` and ``pair_flags`` (ids). One ``"key: stored X, re-derived Y"`` each."""
    acc = accounting(pairs, enc)
    want = {"dataset": run.dataset.name, "dataset_checksum": pairs.checksum, "observable": run.observable.name,
            "model": run.model.name,
            "effective_n": {"n": len(pairs), "n_scored": len(enc.pair_ids), "n_unique": pairs.n_unique,
                            "n_prompt_clusters": pairs.n_prompt_clusters},
            "data_flags": {k: len(v) for k, v in pairs.flags.items()},
            "excluded": acc["excluded"], "pair_flags": acc["pair_flags"]}
    out = []
    for key, value in _plain(want).items():
        got = _plain(attrs.get(key))
        if isinstance(value, dict) and isinstance(got, dict):
            out += [f"{key}.{k}: stored {str(got.get(k))[:60]}, re-derived {str(v)[:60]}"
                    for k, v in sorted({**{k: None for k in got}, **value}.items()) if got.get(k) != v]
        elif got != value:
            out.append(f"{key}: stored {str(got)[:60]}, re-derived {str(value)[:60]}")
    return out


def recompute_card(store, card_id: str) -> tuple[bool | None, str]:
    """Grade a scorecard's organism check again and compare every reading; see the module doc."""
    a = store.document(card_id)
    try:
        obs = load_observable(a.get("observable"))
    except RewardLensError as e:
        return None, f"observable not at hand ({str(e)[:120]})"
    if observable_hash(obs) != a.get("observable_spec_hash"):
        return None, f"observable {a.get('observable')!r} here is not the instrument this card graded"
    scope = a.get("scope") or {}
    try:
        new = grade(obs, organism=a.get("organism", "planted"), base=a.get("base", "tiny_llama"),
                    strengths=tuple(a.get("strengths") or ()), seed=int((a.get("organism_params") or {}).get("seed", 0)),
                    n_pairs=int(scope.get("n_pairs") or 12), dtype=str(a.get("dtype") or "float32"))
    except (RewardLensError, OSError) as e:
        return None, f"organism not rebuilt here ({type(e).__name__}: {str(e)[:120]})"
    if a.get("organism_checksum") and new.organism_checksum != a.get("organism_checksum"):
        return False, "the organism rebuilds to another checksum than the card records"
    ok, parts = True, []
    for c, vals in (a.get("readings") or {}).items():
        got = (new.readings or {}).get(c)
        if got is None or len(got) != len(vals):
            ok = False
            parts.append(f"{c}: not recomputed")
            continue
        want = np.array([np.nan if v is None else v for v in vals], np.float64)
        mine = np.array([np.nan if v is None else v for v in got], np.float64)
        diff = _max_diff(mine, want)
        good = diff <= RTOL * max(float(np.nanmax(np.abs(want), initial=0.0)), 1e-6)
        ok &= good
        parts.append(f"{c} max|Δ| {diff:.3g}" + ("" if good else " MISMATCH"))
    return ok, "organism check regraded: " + ", ".join(parts)
