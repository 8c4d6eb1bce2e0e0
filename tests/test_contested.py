"""Contested pairs (ops/contested_margin, ops/contested_direction): worked cases, organisms, errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from reward_lens_spec.data.pairs import make_meta
from reward_lens_spec.errors import SpecError
from reward_lens_spec.organisms.organisms import Organism
from reward_lens_spec.organisms.preference_organisms import annotator_organisms
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.contested_direction import contrast_top
from reward_lens_spec.ops.contested_margin import contested_mask
from reward_lens_spec.spec import ObservableSpec
from reward_lens_spec.trust.scorecard import evaluate, grade


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def mixture():
    return annotator_organisms("annotator_mixture", (0.0, 1.0))


def test_contested_mask_thresholds():
    a = np.array([1.0, 0.0, 0.75, 0.5, np.nan, 0.8])
    np.testing.assert_array_equal(contested_mask(a, 1.0), [False, False, True, True, False, True])
    np.testing.assert_array_equal(contested_mask(a, 0.75), [False, False, False, True, False, False])


def test_contrast_top_worked_and_against_a_dense_eigh():
    d = 5
    e1, e2 = np.eye(d)[0], np.eye(d)[1]
    Z = np.array([3 * e1, -3 * e1, 2 * e2, -2 * e2, 2 * e2])         # S_c = 9 e1e1ᵀ, S_u = 4 e2e2ᵀ
    lam, v = contrast_top(Z, np.array([True, True, False, False, False]))
    assert lam == pytest.approx(9.0, abs=1e-12) and abs(v @ e1) == pytest.approx(1.0, abs=1e-12)
    rng = np.random.default_rng(0)
    for n, dd in ((12, 30), (40, 6)):                                  # n < d and n > d
        Z = rng.normal(size=(n, dd))
        c = rng.random(n) < 0.4
        M = Z[c].T @ Z[c] / c.sum() - Z[~c].T @ Z[~c] / (~c).sum()
        w, V = np.linalg.eigh(M)
        lam, v = contrast_top(Z, c)
        assert lam == pytest.approx(w[-1], rel=1e-10) and abs(v @ V[:, -1]) == pytest.approx(1.0, abs=1e-9)
        perm = rng.permutation(c)
        a = rng.normal(size=dd)
        a /= np.linalg.norm(a)
        _, _, lam_null, cos_null = contrast_top(Z, c, perm[None, :], a)
        Mp = Z[perm].T @ Z[perm] / perm.sum() - Z[~perm].T @ Z[~perm] / (~perm).sum()
        wp, Vp = np.linalg.eigh(Mp)
        assert lam_null[0] == pytest.approx(wp[-1], rel=1e-10)
        assert cos_null[0] == pytest.approx(abs(Vp[:, -1] @ a), abs=1e-9)


def test_contested_margin_matches_a_direct_computation():
    org = annotator_organisms("annotator_agreement", (1.0,))[0]
    obs = load_observable("contested")
    obs.outputs = list(obs.outputs) + ["margin"]
    ds = evaluate(obs, org)
    m = np.abs(ds["margin"].values)
    votes = [np.mean(json.loads(p.meta_dict()["votes"])) for p in org.pairs]
    c = np.array([0 < v < 1 for v in votes])
    cm = ds["contested_margin"].sel(bound="estimate")
    assert float(cm.sel(contested_statistic="abs_margin_contested")) == pytest.approx(m[c].mean(), rel=1e-12)
    assert float(cm.sel(contested_statistic="abs_margin_unanimous")) == pytest.approx(m[~c].mean(), rel=1e-12)
    assert float(cm.sel(contested_statistic="n_contested")) == c.sum()
    gap = ds["contested_margin"].sel(contested_statistic="abs_margin_gap")
    assert float(gap.sel(bound="ci_high")) < 0                           # annotators split where Δ is small


def test_mixture_organism_recovers_a_disagreement_direction_orthogonal_to_w_r(mixture):
    obs = load_observable("contested")
    lo, hi = (evaluate(obs, o) for o in mixture)
    truth = np.asarray(mixture[1].truth["disagreement_direction"])
    v = hi["contested_direction"]
    assert v.attrs["gauge"] == f"frame:whitened:{v.attrs['frame_id']}" == hi["contested_direction_stats"].attrs["gauge"]
    assert abs(float(v.values @ truth)) >= 0.9
    st = hi["contested_direction_stats"]
    cos = lambda k: float(st.sel(direction_statistic=k))   # noqa: E731
    assert cos("abs_cosine_w_r") <= cos("null_abs_cosine_q95") and cos("abs_cosine_w_r") <= cos("perm_abs_cosine_q95")
    assert float(st.sel(direction_statistic="p_value_contrast")) <= 0.05
    assert float(lo["contested_direction_stats"].sel(direction_statistic="p_value_contrast")) > 0.05


def test_errors_name_the_field(mixture):
    from reward_lens_spec.models.families import family_for
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    h = {"name": "h", "op": "capture", "site": "readout"}
    info = PlanInfo(family=family_for("llama"), n_layers=4, n_objectives=2, objectives=("a", "b"))
    for extra, key in (({}, "objective"), ({"objective": "c"}, "objective"), ({"objective": "a", "unanimous": 0.4},
                                                                             "unanimous")):
        obs = ObservableSpec(name="t", steps=[h, {"name": "d", "op": "contested_direction", "input": "h", **extra}],
                             outputs=["d"])
        with pytest.raises(SpecError, match=rf"steps\.d\.{key}"):
            build_plan(obs, info)
    o = mixture[0]
    bare = o.pairs.__class__(name="bare", pairs=tuple(p.__class__(**{**p.__dict__, "meta": make_meta({})})
                                                      for p in o.pairs), checksum="x", n_unique=1, n_prompt_clusters=1)
    with pytest.raises(SpecError, match=r"dataset\.fields\.agreement"):
        evaluate(load_observable("contested"), Organism(o.kind, 0.0, o.lm, bare))


def test_contested_criteria_pass_on_their_organisms():
    for kind, crit in (("annotator_mixture", "contested_direction"), ("annotator_agreement", "contested_margin")):
        card = grade("contested", organisms=annotator_organisms(kind, (0.0, 0.5, 1.0)))
        assert list(card.readings) == [crit] and card.passed, card.describe()


def test_a_gated_head_is_compared_with_its_mean_effective_direction(mixture):
    from reward_lens_spec.models.gated_head import attach_gated_head
    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.models.tiny import build_tiny
    model, tok = build_tiny("tiny_llama", seed=0)
    lm = wrap_model("gated", attach_gated_head(model, 3, seed=0), tok)
    obs = load_observable("contested")
    obs.outputs = ["contested_direction_stats", "contested_direction", "h"]
    ds = evaluate(obs, Organism("annotator_mixture", 1.0, lm, mixture[1].pairs))
    st = ds["contested_direction_stats"]
    assert st.attrs["objective"].startswith("gated")
    from reward_lens_spec.frames.fit import fit_whitened
    h = ds["h"].values.astype(np.float64)
    frame = fit_whitened(h.reshape(-1, h.shape[-1]), "gated")                # the readout frame, refitted
    w = np.mean([lm.head.gate(x) @ lm.head.W for x in h.reshape(-1, h.shape[-1])], 0)
    wt = frame.direction_to_frame(w, "gated")
    direct = abs(ds["contested_direction"].values @ wt) / np.linalg.norm(wt)
    assert float(st.sel(direction_statistic="abs_cosine_w_r")) == pytest.approx(direct, rel=1e-6)
