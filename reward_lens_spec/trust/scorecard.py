"""Calibration scorecards: grade an observable on model organisms against planted truth.

An observable is identified by its canonical spec hash
(``spec_hash(canonical_observable(obs))``: expanded steps, outputs, version,
restrictions) — the same hash the gate recomputes for a run. It is run, through
the ordinary plan and capture path, on every strength of an organism family
(``organisms.organisms``), and each *criterion* whose variables the observable
outputs turns the result into one reading per strength:

=================  ===================  ==========================================  =====================
criterion          needs                reading (mean over pairs)                   floor at strength 1
=================  ===================  ==========================================  =====================
dla_share          dla                  planted unit's DLA / Σ|DLA| over units      reading ≥ 0.5
patch_share        patch_effect         planted unit's effect / Σ|effect| attn+mlp  reading ≥ 0.5
attribution_share  attribution_patch_…  same, attribution patching (approximate)    reading ≥ 0.5
ablation_share     ablation_effect      −(planted unit's effect) / Σ|effect|        reading ≥ 0.5
group_stats        accuracy_by_dim…,    effect size d_z per group (mean over        every accuracy
                   effect_size_by_dim…  groups; accuracy saturates)                 ci_low ≥ 0.5
path_separation    path_patch_effect    direct unit's direct + indirect unit's      their share of
                                        indirect path (organism planted_paths)      Σ|paths| ≥ 0.5
null_excess        observed_effect,     observed effect − the null's 95th           1 − p ≥ 0.95
                   null_draws, p_value  percentile, at the planted layer
steer_alignment    steer_slope,         slope of Δ steering along a fitted          reading ≥ 0.5
                   steer_slope_head     direction / slope along w_r (same layer)
lens_jump          lens                 normed-lens jump at the planted layer       reading ≥ 0.5
                                        · sign(Δ) / Σ|jumps| over depth
crystallization    lens, crystal…layer  lens_jump (the layer itself is discrete)    ≥ 0.8 of pairs cross
                                                                                    at/after planted layer
score              margin               mean σ(Δ) (Bradley–Terry p)                 detection AUC ≥ 0.8
                                                                                    (P(Δ>0) + ½P(Δ=0))
=================  ===================  ==========================================  =====================

Intervention criteria: ``ablation_share``, ``steer_alignment`` and ``null_excess`` on ``planted``;
``path_separation`` on ``planted_paths``; ``group_stats`` on any organism (``trained_length`` passes;
on ``planted`` and ``trained_keyword`` accuracy saturates and d_z is not monotone, so it fails there).
Share criteria read a head grid (pair × layer × head) as units (layer, head); it is graded on the
``planted_head`` organism (truth names the head), and is NaN — failing — on one without a planted head.

Preference-structure criteria (``PREFERENCE_CRITERIA``) grade only their own organism kind
(``models/preference_organisms``): ``label_cycles`` (hodge_pooled: labels' non-gradient fraction;
floor: above its null's 95% quantile) and ``cyclic_gain`` (preference_rank; floor: CI above 0) on
``planted_cycle``; ``contested_direction`` (|cos| to the planted direction ≥ 0.8) on
``annotator_mixture``; ``contested_margin`` (1 − contested/unanimous |Δ|; floor: gap CI below 0)
on ``annotator_agreement``; ``effective_objectives`` (participation ratio within 1% of the
planted one) and ``scalar_cost`` (margin-weighted sign disagreement; floor: plain ≥ 0.5) on
``multi_objective``.

Criteria of the other reward signals and the representation instruments (``trust.kind_criteria``) grade
only their own organism kinds (``organisms.kind_organisms``): ``verdict_margin`` on ``judge_planted``,
``prm_bad_step``, ``prm_step_reward`` and ``prm_step_margin`` (every step) on ``prm_planted``,
``ensemble_reward`` and ``ensemble_member_margin`` on ``ensemble_planted``, ``implicit_log_ratio`` on ``implicit_planted``, ``leace_removal`` and
``leace_specificity`` on ``concept``, ``curvature_direction`` on ``curvature``.

A criterion passes when its readings rise monotonically with strength —
Spearman ρ(strength, reading) ≥ ``MIN_SPEARMAN`` (0.9; with 5 strengths one
adjacent swap gives 0.9) — AND its floor holds at full strength AND, on a
planted organism, its *magnitude* matches the truth: the planted unit's reading
in reward units (DLA, patch effect, attribution effect, lens jump at the planted
layer, the margin for ``score``), minus the same reading at strength 0. For the
exact instruments (``Criterion.exact``) the truth is the same cells recomputed by (``trust.reference``)
``reference_dataset`` — plain HF forwards, batch of one, forward hooks, none of
the capture or operator code — and the tolerance is float error
(``MAG_RTOL_EXACT`` = 1e-3 relative); attribution patching (first order) keeps
its band (``Criterion.rtol``, 25%) against the planted margin change ``Δ(s) − Δ(0)``
(``planted_margins``). Every organism run also checks the observable's
exactness identities (``trust.identities``: outputs named ``reward``/``margin``
equal the head's own output, Σ dla = margin, …) and every kept cell of a
``dla``/``lens``/``lens_raw``/``patch_effect``/``patch_restored`` grid — whole or
restricted — against the plain-forward cell (``reference_identities``); a
restricted grid no reference reproduces is refused (``SpecError`` with a Fix).
Criteria with a ``cells`` recomputation (``Criterion.cells``; ``trust.cell_truth``) also read their
output cell by cell at full strength against plain HF forwards of the organism: the card's ``cells[criterion]``
(worst 1 − max |err| / RMS over its outputs) must be ≥ ``CELL_FLOOR`` (0.999), so a reading 5 % off or one
position shifted fails even where the criterion's summary (a share, a ratio, an AUC) keeps its floor.
A broken identity fails the card. The card records ``code_hash``
(``trust.evidence.code_hash``: operator and capture modules, package version);
a reader whose code hashes otherwise does not accept it. A card passes only when every applicable
criterion passes. Unit criteria need an organism with a planted unit
(``planted``); ``score`` applies to all. An observable with no applicable
criterion raises ``SpecError``. Readings that are not finite fail. A criterion that cannot read the output
(a step or token missing, a dimension absent, any error while reading) does not stop grading: the card
records why in ``reading_errors`` and that criterion, hence the card, fails (``evidence.card_verdict``). Output
variables no criterion reads are listed as ``ungraded`` and stay exploratory in
runs. The card records its ``scope`` (family, organism kind, base, strengths,
number of pairs). Cards go to the store sealed (``trust.evidence.seal``) with
``write_run`` (observable name ``scorecard``); readers re-derive ``passed``.
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import asdict, asdict as as_dict, replace

import numpy as np
import xarray as xr
import yaml

from ..errors import SpecError, StoreError
from ..identity import git_sha, observable_hash, versions
from ..models.fingerprint import model_fingerprint
from ..models.loading import DTYPES, wrap_model
from ..observables import load_observable
from ..ops.base import PlanInfo
from ..organisms.kind_organisms import STRENGTHS, Organism, organism_family   # every organism kind
from ..registries import CRITERIA       # the built-in criteria (trust.criteria) and any registered since
from ..registry import build_plan, expand_steps
from ..run.executor import compute
from ..store import open_store, write_run
from .card import Scorecard
from .coverage import why_not
from .evidence import MIN_SPEARMAN, seal
from .grading import grade_readings
from .identities import check_identities
from .reference import planted_margins, reference_dataset, reference_identities

CARD_OBSERVABLE = "scorecard"
UNIT_KINDS = ("planted", "planted_head", "planted_paths", "judge_planted")   # truth names a planted unit
N_PAIRS_KINDS = UNIT_KINDS + ("prm_planted", "implicit_planted", "concept", "curvature", "ensemble_planted",
                                 "sparse_feature")   # take n_pairs


def evaluate(obs, org: Organism) -> xr.Dataset:
    """Run observable ``obs`` (an ``ObservableSpec``) on one organism; the plan's outputs as a Dataset.

    ``attrs["identities"]``: the run's exactness-identity records (``trust.identities``).
    """
    lm = org.lm
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name,
                    layers=tuple(obs.layers) if obs.layers is not None else None,
                    components=tuple(obs.components) if obs.components else None, pairs=obs.pairs,
                    gated=lm.head.gate is not None)
    plan = build_plan(obs, info, load_observable)
    kw = {"template": org.params["template"]} if "template" in org.params else {}   # e.g. the PRM organism's
    res, ctx, enc = compute(lm, org.pairs, plan, info, batch_size=32, **kw)      # the one executor, in memory
    out = xr.Dataset({o: res[o] for o in plan.outputs})
    out.attrs["sae"] = _sae_steps(plan, ctx)
    out.attrs["identities"] = check_identities(out, ctx.capture.logits, enc.pair_ids, n_layers=lm.n_layers,
                                               objectives=lm.head.objectives, dtype=str(lm.dtype),
                                               signal=getattr(lm, "signal", None))
    return out


def _sae_steps(plan, ctx) -> dict:
    """The dictionaries the run's ``sae_attribution`` steps used (digest → SAE) and each step's params, for the
    SAE criteria (``trust.sae_criteria``) to rebuild every cell from the planted truth."""
    saes = {v[0].digest(): v[0] for k, v in ctx.memo.items() if isinstance(k, tuple) and k and k[0] == "sae"}
    steps = {s.name: as_dict(s.op.p) for s in plan.steps if type(s.op).__name__ == "SaeAttribution"}
    return {"dictionaries": saes, "steps": steps} if steps else {}


def grade(observable, *, organism: str = "planted", base: str = "tiny_llama", strengths=STRENGTHS,
          seed: int = 0, n_pairs: int = 12, organisms: list[Organism] | None = None,
          dtype: str = "float32") -> Scorecard:
    """Grade ``observable`` (a name under ``conf/observable`` or an ``ObservableSpec``); see module doc.

    ``organisms`` overrides the built family (tests pass hand-made ones). ``dtype`` (``float32``, ``bfloat16``,
    ``float16``): the organisms are cast to it before grading, and the card lifts runs in that dtype only
    (``trust.evidence``: numerics are part of the evidence).
    Raises ``SpecError`` when no criterion applies to the observable's outputs, or for a ``dtype`` other than those
    (or not float32 for an organism kind with its own reward signal).
    """
    t0 = time.perf_counter()
    obs = load_observable(observable) if isinstance(observable, str) else observable
    _, outputs = expand_steps(obs, load_observable)
    has_unit = organism in UNIT_KINDS if organisms is None else "layer" in organisms[0].truth
    kind = organism if organisms is None else organisms[0].kind
    crits = [c for c in CRITERIA.values() if set(c.needs) <= set(outputs) and (has_unit or not c.needs_unit)
             and (not c.kinds or kind in c.kinds)]
    if not crits:
        raise SpecError("observable", f"'{obs.name}' outputs {outputs}: no calibration criterion reads them on "
                        f"organism '{organism}'.", fix="criteria: " + "; ".join(
                            f"{c.name} needs {list(c.needs)}" for c in CRITERIA.values())
                        + " (unit criteria need organism=planted; judge/PRM/implicit/LEACE/curvature criteria "
                        "their own organism kinds, trust.kind_criteria).")
    if organisms is None:
        kw = {"n_pairs": n_pairs} if organism in N_PAIRS_KINDS else {}
        organisms = organism_family(organism, tuple(strengths), base=base, seed=seed, **kw)
    organisms = [in_dtype(o, dtype) for o in organisms]
    results = [evaluate(obs, o) for o in organisms]
    refs = []                          # per organism: the plain-forward cells each referenced variable matched
    for ds, o in zip(results, organisms):
        try:
            ref = reference_dataset(o, ds)
            recs, sel = reference_identities(ds, ref, o) if len(ref.data_vars) else ([], xr.Dataset())
        except Exception as exc:       # noqa: BLE001  a reading whose cells cannot be matched fails, with why
            recs, sel = [{"variable": "*", "identity": f"kept cells = a plain HF forward: could not compare "
                          f"({type(exc).__name__}: {exc})", "max_abs_err": None, "scale": 1.0,
                          "dtype": str(o.lm.dtype), "n": 0}], xr.Dataset()
        ds.attrs["identities"] = list(ds.attrs.get("identities") or []) + recs
        refs.append(sel)
    n_layers = organisms[0].lm.n_layers
    for c in crits:                    # a restricted grid no plain forward reproduces: its identities are off
        for v in c.needs:
            da = results[0][v] if v in results[0] else None
            if (da is not None and c.exact and v != "margin" and v not in refs[0].data_vars and "layer" in da.dims
                    and not set(range(n_layers)) <= {int(x) for x in da.layer.values}):
                raise SpecError("observable", f"'{obs.name}' output '{v}' covers layers "
                                f"{[int(x) for x in da.layer.values]} of {n_layers} and no independent forward "
                                f"reproduces its cells, so its exactness identities cannot be checked.",
                                fix=f"calibrate the full grid (drop the layer restriction or the select on '{v}'), "
                                    "or output the grid in its usual shape (pair × layer × component).")
    s = [o.strength for o in organisms]
    zero = int(np.argmin(s)) if min(s) == 0 else None      # the unplanted twin: reference for magnitudes
    planted = "layer" in organisms[0].truth
    card = Scorecard(observable=obs.name, spec_hash=observable_hash(obs), version=int(obs.version),
                     model_family=organisms[0].family, organism=organisms[0].kind,
                     base=organisms[0].params.get("base", base), strengths=s,
                     truth=organisms[0].truth, organism_checksum=organisms[0].pairs.checksum,
                     organism_params=dict(organisms[0].params),
                     organism_fingerprints=[model_fingerprint(o.lm.model, o.lm.tokenizer) for o in organisms])
    used = {v for c in crits for v in c.needs}
    card.ungraded = [o for o in outputs if o not in used]
    card.graded = [o for o in outputs if o in used]
    card.why_not = {o: why_not(o, card.organism) for o in card.ungraded}
    card.identities = [ds.attrs["identities"] for ds in results]
    card.dtype = str(organisms[0].lm.dtype)
    card.scope = {"family": card.model_family, "organism": card.organism, "base": card.base,
                  "strengths": s, "n_pairs": len(organisms[0].pairs)}
    top = int(np.argmax(s))
    truth_effect = None
    if planted and zero is not None:
        truth_effect = float(np.mean(planted_margins(organisms[top]) - planted_margins(organisms[zero])))
    grade_readings(card, crits, results, [o.truth for o in organisms], refs, truth_effect, organisms, obs)
    card.wall_s = round(time.perf_counter() - t0, 3)
    return card


def in_dtype(org: Organism, dtype: str) -> Organism:
    """``org`` with its model cast to ``dtype`` (the same weights, rounded; ``org`` itself when already in it)."""
    if dtype not in DTYPES:
        raise SpecError("dtype", f"unknown dtype {dtype!r}.", value=dtype, options=list(DTYPES))
    lm = org.lm
    if str(lm.dtype) == dtype:
        return org
    if getattr(lm, "signal", None) is not None or type(lm).__name__ != "LoadedModel" or lm.head.gate is not None:
        raise SpecError("dtype", f"organism kind {org.kind!r} is graded in float32 only.",
                        fix="calibrate a classifier organism (planted, planted_head, ...) in another dtype.")
    return replace(org, lm=wrap_model(lm.name, copy.deepcopy(lm.model), lm.tokenizer, dtype=dtype, device=lm.device,
                                      objectives=lm.head.objectives))


def card_run_id(card: Scorecard) -> str:
    key = [card.spec_hash, card.model_family, card.organism, card.base, card.strengths,
           card.organism_checksum, card.organism_params, card.organism_fingerprints]
    key = json.dumps(key + ([card.dtype] if card.dtype != "float32" else []), sort_keys=True)   # float32: ids as before
    name = card.observable.replace("/", ".")
    return f"scorecard-{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def write_card(card: Scorecard, store_url: str, *, force: bool = True, storage_options=None) -> str:
    """Write ``card`` to the store as run ``card_run_id(card)`` (observable ``scorecard``); return the id.

    ``force`` (default) replaces an earlier card with the same id, so the store
    holds the latest grading of this observable on this organism.
    """
    crit = list(card.readings)
    reading = np.array([[np.nan if v is None else v for v in card.readings[c]] for c in crit], np.float64)
    ds = xr.Dataset(
        {"reading": (("criterion", "strength"), reading, {"units": "reading", "gauge": "invariant"}),
         "spearman": (("criterion",), np.array([np.nan if card.spearman[c] is None else card.spearman[c]
                                                for c in crit]), {"units": "correlation", "gauge": "invariant"}),
         "passed": (("criterion",), np.array([card.criteria_passed[c] for c in crit]), {"units": "bool"})},
        coords={"criterion": np.array(crit, dtype=str), "strength": np.array(card.strengths, np.float64)})
    attrs = asdict(card)
    attrs.update(kind="scorecard", observable_spec_hash=card.spec_hash, observable_version=card.version,
                 min_spearman=MIN_SPEARMAN, versions=versions(), git_sha=git_sha(),
                 config_yaml=yaml.safe_dump({"calibrate": {"observable": card.observable, "organism": card.organism,
                                                           "base": card.base, "strengths": card.strengths}}))
    attrs.pop("version")
    run_id = card_run_id(card)
    write_run(store_url, run_id, {CARD_OBSERVABLE: ds}, seal(attrs), storage_options=storage_options, force=force)
    return run_id


def find_cards(store_url: str, *, spec_hash: str | None = None, storage_options=None) -> list[dict]:
    """Stored attrs of every complete scorecard (optionally for one observable hash), in log order.

    As stored: validity is judged by ``trust.evidence`` (seal, re-derived verdict).

    A store that does not exist yet holds no cards (``[]``); other store errors propagate.
    """
    try:
        st = open_store(store_url, storage_options=storage_options)
    except StoreError:
        return []
    docs = st.evidence().ordered()                    # evidence-log order
    return [a for a in docs if a.get("kind") == "scorecard"
            and (spec_hash is None or a.get("observable_spec_hash") == spec_hash)]
