"""Calibration scorecards: grade an observable on model organisms against planted truth.

An observable is identified by its canonical spec hash
(``spec_hash(canonical_observable(obs))``: expanded steps, outputs, version,
restrictions) — the same hash the gate recomputes for a run. It is run, through
the ordinary plan and capture path, on every strength of an organism family
(``models.organisms``), and each *criterion* whose variables the observable
outputs turns the result into one reading per strength:

=================  ===================  ==========================================  =====================
criterion          needs                reading (mean over pairs)                   floor at strength 1
=================  ===================  ==========================================  =====================
dla_share          dla                  planted unit's DLA / Σ|DLA| over units      reading ≥ 0.5
patch_share        patch_effect         planted unit's effect / Σ|effect| attn+mlp  reading ≥ 0.5
attribution_share  attribution_patch_…  same, attribution patching (approximate)    reading ≥ 0.5
lens_jump          lens                 normed-lens jump at the planted layer       reading ≥ 0.5
                                        · sign(Δ) / Σ|jumps| over depth
crystallization    lens, crystal…layer  lens_jump (the layer itself is discrete)    ≥ 0.8 of pairs cross
                                                                                    at/after planted layer
score              margin               mean σ(Δ) (Bradley–Terry p)                 detection AUC ≥ 0.8
                                                                                    (P(Δ>0) + ½P(Δ=0))
=================  ===================  ==========================================  =====================

Preference-structure criteria (``PREFERENCE_CRITERIA``) grade only their own organism kind
(``models/preference_organisms``): ``label_cycles`` (hodge_pooled: labels' non-gradient fraction;
floor: above its null's 95% quantile) and ``cyclic_gain`` (preference_rank; floor: CI above 0) on
``planted_cycle``; ``contested_direction`` (|cos| to the planted direction ≥ 0.8) on
``annotator_mixture``; ``contested_margin`` (1 − contested/unanimous |Δ|; floor: gap CI below 0)
on ``annotator_agreement``; ``effective_objectives`` (participation ratio within 1% of the
planted one) and ``scalar_cost`` (margin-weighted sign disagreement; floor: plain ≥ 0.5) on
``multi_objective``.

A criterion passes when its readings rise monotonically with strength —
Spearman ρ(strength, reading) ≥ ``MIN_SPEARMAN`` (0.9; with 5 strengths one
adjacent swap gives 0.9) — AND its floor holds at full strength. A card passes
only when every applicable criterion passes. Unit criteria need an organism with
a planted unit (``planted``); ``score`` applies to all. An observable with no
applicable criterion raises ``SpecError``. Readings that are not finite fail.
Cards go to the store with ``write_run`` (observable name ``scorecard``).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import xarray as xr

from ..errors import SpecError
from ..models.organisms import STRENGTHS, Organism, organism_family

MIN_SPEARMAN = 0.9
CARD_OBSERVABLE = "scorecard"


def observable_hash(obs) -> str:
    """Canonical spec hash of an ``ObservableSpec`` (what a card and the gate compare)."""
    from ..identity import canonical_observable, spec_hash
    return spec_hash(canonical_observable(obs))


def _units(da: xr.DataArray, comps=None) -> xr.DataArray:
    """pair × unit, unit = (layer, component), NaN cells (e.g. attn at the embedding) dropped."""
    if comps is not None:
        da = da.sel(component=[c for c in comps if c in da.component.values])
    return da.stack(u=("layer", "component")).dropna("u", how="all")


def _share(da: xr.DataArray, truth: dict, comps=None) -> np.ndarray:
    u = _units(da, comps)
    hit = (u.layer.values == truth["layer"]) & (u.component.values == truth["component"])
    if not hit.any():
        return np.full(u.sizes["pair"], np.nan)
    vals = np.asarray(u.transpose("pair", "u").values, np.float64)
    return vals[:, hit].sum(1) / np.abs(vals).sum(1)


def _lens_jump(ds, truth) -> np.ndarray:
    lens = np.asarray(ds["lens"].transpose("pair", "layer").values, np.float64)
    jumps = np.diff(np.concatenate([np.zeros((lens.shape[0], 1)), lens], 1), axis=1)
    col = list(ds["lens"].layer.values).index(truth["layer"])
    return jumps[:, col] * np.sign(lens[:, -1]) / np.abs(jumps).sum(1)


def _auc(ds, truth) -> float:
    m = np.asarray(ds["margin"].values, np.float64).ravel()
    return float((m > 0).mean() + 0.5 * (m == 0).mean())


@dataclass(frozen=True)
class Criterion:
    name: str
    needs: tuple
    reading: object          # (Dataset, truth) -> per-pair array
    floor_value: object      # (Dataset at strength 1, truth) -> float
    floor: float
    floor_what: str
    needs_unit: bool = True
    kinds: tuple = ()        # organism kinds it grades (empty: any, subject to needs_unit)


def _mean(f):
    return lambda ds, t: float(np.mean(f(ds, t)))


def _hodge(ds, t, stat="non_gradient_fraction"):
    return float(ds["hodge_pooled"].sel(flow="labels", hodge_statistic=stat))


def _rank(ds, bound):
    return float(ds["preference_rank"].sel(rank_statistic="cyclic_gain", bound=bound))


def _contested(ds, stat, bound="estimate"):
    return float(ds["contested_margin"].sel(contested_statistic=stat, bound=bound))


def _pr(ds, t):
    return float(ds["effective_objectives"].sel(effective_statistic="participation_ratio"))


def _cost(ds, stat):
    return float(ds["scalar_cost"].sel(scalar_cost_statistic=stat, bound="estimate"))


PREFERENCE_CRITERIA = (   # preference structure (ops/hodge_rank, …), graded on organisms with that truth
    Criterion("label_cycles", ("hodge_pooled",), _hodge,
              lambda ds, t: _hodge(ds, t) - _hodge(ds, t, "null_q95"), 0.0,
              "labels' pooled non-gradient fraction above its transitive null's 95% quantile",
              needs_unit=False, kinds=("planted_cycle",)),
    Criterion("cyclic_gain", ("preference_rank",), lambda ds, t: _rank(ds, "estimate"),
              lambda ds, t: _rank(ds, "ci_low"), 1e-9,
              "held-out cyclic_gain's 95% CI above 0 (nats)", needs_unit=False, kinds=("planted_cycle",)),
    Criterion("contested_direction", ("contested_direction",),
              lambda ds, t: abs(float(np.asarray(ds["contested_direction"].values) @ np.asarray(t["disagreement_direction"]))),
              lambda ds, t: abs(float(np.asarray(ds["contested_direction"].values) @ np.asarray(t["disagreement_direction"]))),
              0.8, "|cos| of the recovered and the planted disagreement direction (whitened) ≥ 0.8",
              needs_unit=False, kinds=("annotator_mixture",)),
    Criterion("contested_margin", ("contested_margin",), lambda ds, t: 1.0 - _contested(ds, "abs_margin_contested")
              / _contested(ds, "abs_margin_unanimous"), lambda ds, t: -_contested(ds, "abs_margin_gap", "ci_high"),
              1e-9, "contested-minus-unanimous |margin| gap's 95% CI below 0", needs_unit=False,
              kinds=("annotator_agreement",)),
    Criterion("effective_objectives", ("effective_objectives",), _pr,
              lambda ds, t: 1.0 - abs(_pr(ds, t) - t["participation_ratio"]) / t["participation_ratio"], 0.99,
              "participation ratio within 1% of the planted one", needs_unit=False, kinds=("multi_objective",)),
    Criterion("scalar_cost", ("scalar_cost",), lambda ds, t: _cost(ds, "sign_disagreement_weighted"),
              lambda ds, t: _cost(ds, "sign_disagreement"), 0.5,
              "share of pairs whose objectives disagree in sign ≥ 0.5 (K uncorrelated rows)", needs_unit=False,
              kinds=("multi_objective",)),
)

CRITERIA = (
    Criterion("dla_share", ("dla",), lambda ds, t: _share(ds["dla"], t), _mean(lambda ds, t: _share(ds["dla"], t)),
              0.5, "planted unit's signed DLA share ≥ 0.5"),
    Criterion("patch_share", ("patch_effect",), lambda ds, t: _share(ds["patch_effect"], t, ("attn", "mlp")),
              _mean(lambda ds, t: _share(ds["patch_effect"], t, ("attn", "mlp"))), 0.5,
              "planted unit's signed share of |patch effect| over attn/mlp units ≥ 0.5"),
    Criterion("attribution_share", ("attribution_patch_effect",),
              lambda ds, t: _share(ds["attribution_patch_effect"], t, ("attn", "mlp")),
              _mean(lambda ds, t: _share(ds["attribution_patch_effect"], t, ("attn", "mlp"))), 0.5,
              "planted unit's signed share of |attribution patch effect| ≥ 0.5"),
    Criterion("lens_jump", ("lens",), _lens_jump, _mean(_lens_jump), 0.5,
              "share of the normed lens' total movement made at the planted layer ≥ 0.5"),
    Criterion("crystallization", ("lens", "crystallization_layer"), _lens_jump,
              lambda ds, t: float((np.asarray(ds["crystallization_layer"].values) >= t["layer"]).mean()), 0.8,
              "fraction of pairs crystallizing at or after the planted layer ≥ 0.8"),
    Criterion("score", ("margin",), lambda ds, t: 1.0 / (1.0 + np.exp(-np.asarray(ds["margin"].values, float))),
              _auc, 0.8, "detection AUC P(Δ>0) + ½P(Δ=0) ≥ 0.8", needs_unit=False),
) + PREFERENCE_CRITERIA


def spearman(x, y) -> float:
    """Spearman ρ with average ranks for ties (Spearman 1904); NaN if a side is constant or not finite."""
    from scipy.stats import spearmanr
    x, y = np.asarray(x, float), np.asarray(y, float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def evaluate(obs, org: Organism) -> xr.Dataset:
    """Run observable ``obs`` (an ``ObservableSpec``) on one organism; the plan's outputs as a Dataset."""
    from ..context import RunContext
    from ..models.capture import capture
    from ..models.formatting import encode_pairs
    from ..ops.base import PlanInfo
    from ..registry import build_plan
    from ..observables import load_observable

    lm = org.lm
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name,
                    layers=tuple(obs.layers) if obs.layers is not None else None,
                    components=tuple(obs.components) if obs.components else None, pairs=obs.pairs,
                    gated=lm.head.gate is not None)
    plan = build_plan(obs, info, load_observable)
    enc = encode_pairs(lm.tokenizer, list(org.pairs), model_name=lm.name)
    cap = capture(lm, enc, plan.sites, batch_size=32)
    ctx = RunContext(lm=lm, pairs=org.pairs, encoded=enc, capture=cap, info=info)
    values: dict[str, xr.DataArray] = {}
    for step in plan.steps:
        values[step.name] = step.op.run(ctx, *[values[s] for s in step.inputs])
    return xr.Dataset({o: values[o] for o in plan.outputs})


def _finite(x):                 # store attrs must be JSON: NaN -> None
    return float(x) if np.isfinite(x) else None


@dataclass
class Scorecard:
    """One graded observable; ``readings[criterion]`` has one value per strength (None = not finite)."""

    observable: str
    spec_hash: str
    version: int
    model_family: str
    organism: str
    base: str
    strengths: list
    readings: dict = field(default_factory=dict)
    spearman: dict = field(default_factory=dict)
    floors: dict = field(default_factory=dict)
    criteria_passed: dict = field(default_factory=dict)
    passed: bool = False
    ungraded: list = field(default_factory=list)
    truth: dict = field(default_factory=dict)
    organism_checksum: str = ""
    organism_params: dict = field(default_factory=dict)
    organism_fingerprints: list = field(default_factory=list)     # model_fingerprint per strength
    wall_s: float = 0.0

    def describe(self) -> str:
        lines = [f"scorecard {self.observable} v{self.version} [{self.spec_hash[:12]}] on {self.organism} "
                 f"({self.base}, family {self.model_family}); truth {self.truth}"]
        lines.append(f"  {'criterion':<18}" + "".join(f"{'s=' + format(s, 'g'):>9}" for s in self.strengths)
                     + f"{'spearman':>10}  floor")
        for c, vals in self.readings.items():
            fl = self.floors[c]
            row = "".join(f"{v:9.3f}" if v is not None else f"{'nan':>9}" for v in vals)
            rho = self.spearman[c]
            lines.append(f"  {c:<18}{row}{rho if rho is None else round(rho, 3):>10}  "
                         f"{fl['value'] if fl['value'] is None else round(fl['value'], 3)} "
                         f"(needs {fl['what']}) -> {'pass' if self.criteria_passed[c] else 'FAIL'}")
        if self.ungraded:
            lines.append(f"  not graded (no planted truth to compare): {', '.join(self.ungraded)}")
        lines.append(f"  => {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)


def grade(observable, *, organism: str = "planted", base: str = "tiny_llama", strengths=STRENGTHS,
          seed: int = 0, n_pairs: int = 12, organisms: list[Organism] | None = None) -> Scorecard:
    """Grade ``observable`` (a name under ``conf/observable`` or an ``ObservableSpec``); see module doc.

    ``organisms`` overrides the built family (tests pass hand-made ones).
    Raises ``SpecError`` when no criterion applies to the observable's outputs.
    """
    from ..models.fingerprint import model_fingerprint
    from ..registry import expand_steps
    from ..observables import load_observable

    t0 = time.perf_counter()
    obs = load_observable(observable) if isinstance(observable, str) else observable
    _, outputs = expand_steps(obs, load_observable)
    has_unit = organism == "planted" if organisms is None else "layer" in organisms[0].truth
    kind = organism if organisms is None else organisms[0].kind
    crits = [c for c in CRITERIA if set(c.needs) <= set(outputs) and (has_unit or not c.needs_unit)
             and (not c.kinds or kind in c.kinds)]
    if not crits:
        raise SpecError("observable", f"'{obs.name}' outputs {outputs}: no calibration criterion reads them on "
                        f"organism '{organism}'.", fix="criteria: " + "; ".join(
                            f"{c.name} needs {list(c.needs)}" for c in CRITERIA)
                        + " (unit criteria need organism=planted).")
    if organisms is None:
        kw = {"n_pairs": n_pairs} if organism == "planted" else {}
        organisms = organism_family(organism, tuple(strengths), base=base, seed=seed, **kw)
    results = [evaluate(obs, o) for o in organisms]
    s = [o.strength for o in organisms]
    card = Scorecard(observable=obs.name, spec_hash=observable_hash(obs), version=int(obs.version),
                     model_family=organisms[0].family, organism=organisms[0].kind,
                     base=organisms[0].params.get("base", base), strengths=s,
                     truth=organisms[0].truth, organism_checksum=organisms[0].pairs.checksum,
                     organism_params=dict(organisms[0].params),
                     organism_fingerprints=[model_fingerprint(o.lm.model, o.lm.tokenizer) for o in organisms])
    used = {v for c in crits for v in c.needs}
    card.ungraded = [o for o in outputs if o not in used]
    for c in crits:
        vals = [float(np.mean(c.reading(ds, o.truth))) for ds, o in zip(results, organisms)]
        rho = spearman(s, vals)
        top = int(np.argmax(s))
        fv = float(c.floor_value(results[top], organisms[top].truth))
        ok = bool(np.isfinite(rho) and rho >= MIN_SPEARMAN and np.isfinite(fv) and fv >= c.floor)
        card.readings[c.name] = [_finite(v) for v in vals]
        card.spearman[c.name] = _finite(rho)
        card.floors[c.name] = {"value": _finite(fv), "floor": c.floor, "what": c.floor_what,
                               "at_strength": s[top]}
        card.criteria_passed[c.name] = ok
    card.passed = all(card.criteria_passed.values())
    card.wall_s = round(time.perf_counter() - t0, 3)
    return card


def card_run_id(card: Scorecard) -> str:
    key = json.dumps([card.spec_hash, card.model_family, card.organism, card.base, card.strengths,
                      card.organism_checksum, card.organism_params, card.organism_fingerprints], sort_keys=True)
    name = card.observable.replace("/", ".")
    return f"scorecard-{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def write_card(card: Scorecard, store_url: str, *, force: bool = True, storage_options=None) -> str:
    """Write ``card`` to the store as run ``card_run_id(card)`` (observable ``scorecard``); return the id.

    ``force`` (default) replaces an earlier card with the same id, so the store
    holds the latest grading of this observable on this organism.
    """
    import yaml

    from ..identity import git_sha, versions
    from ..store import write_run

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
    write_run(store_url, run_id, {CARD_OBSERVABLE: ds}, attrs, storage_options=storage_options, force=force)
    return run_id


def find_cards(store_url: str, *, spec_hash: str | None = None, storage_options=None) -> list[dict]:
    """Attrs of every complete scorecard in the store (optionally for one observable hash), oldest first.

    A store that does not exist yet holds no cards (``[]``); other store errors propagate.
    """
    from ..errors import StoreError
    from ..store import open_store

    try:
        st = open_store(store_url, storage_options=storage_options)
    except StoreError:
        return []
    out = []
    for run_id in st.runs(observable=CARD_OBSERVABLE)["run_id"]:
        a = st.provenance(run_id)
        if a.get("kind") == "scorecard" and (spec_hash is None or a.get("observable_spec_hash") == spec_hash):
            out.append(a)
    return out
