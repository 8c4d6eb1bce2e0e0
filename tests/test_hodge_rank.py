"""HodgeRank (ops/hodge_rank): worked flows, an independent Hodge-Laplacian check, the op on organisms."""
from __future__ import annotations

import json

import numpy as np
import pytest

from reward_lens_spec.data import load_pairs
from reward_lens_spec.errors import SpecError
from reward_lens_spec.organisms.preference_organisms import cycle_organisms
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.hodge_rank import build_graph, decompose
from reward_lens_spec.spec import ObservableSpec
from reward_lens_spec.trust.scorecard import evaluate, grade


pytestmark = pytest.mark.usefixtures("one_thread")


def fractions(winners, losers, values):
    g = build_graph(winners, losers, values)
    e = decompose(g, g.y)
    return e / e.sum()


def test_pure_three_cycle_is_all_curl_and_potentials_are_all_gradient():
    grad, curl, harm = fractions("abc", "bca", [1.0, 1.0, 1.0])
    assert curl == pytest.approx(1.0, abs=1e-12) and grad == pytest.approx(0.0, abs=1e-12)
    assert harm == pytest.approx(0.0, abs=1e-12)
    s = {"a": 2.0, "b": 0.5, "c": -1.0, "d": 0.3}
    W, L = list("abcabda"), list("bcdcdad")                 # a repeated edge (a, d) weighs 2
    grad, curl, harm = fractions(W, L, [s[x] - s[y] for x, y in zip(W, L)])
    assert grad == pytest.approx(1.0, abs=1e-12) and curl + harm == pytest.approx(0.0, abs=1e-12)


def test_binary_transitive_triangle_has_one_ninth_and_a_square_cycle_is_harmonic():
    assert fractions("aba", "bcc", [1.0, 1.0, 1.0])[1:].sum() == pytest.approx(1 / 9, abs=1e-12)
    grad, curl, harm = fractions("abcd", "bcda", [1.0] * 4)   # no triangle: the cycle is harmonic
    assert harm == pytest.approx(1.0, abs=1e-12) and curl == 0.0


def test_split_matches_least_squares_and_the_hodge_laplacian_kernel():
    """Independent check: gradient by weighted least squares on a hand-built incidence, harmonic by
    the kernel of the weighted Hodge Laplacian L1 (numpy eigh), curl = the rest; random graph."""
    rng = np.random.default_rng(3)
    V = 7          # cycle rank 10 − 7 + 1 = 4: two triangles (curl) and two longer cycles (harmonic)
    edges = [(0, 1), (0, 2), (0, 6), (1, 2), (1, 3), (2, 3), (2, 5), (3, 4), (4, 5), (5, 6)]
    W, L, vals = [], [], []
    for (i, j) in edges:
        for _ in range(int(rng.integers(1, 4))):            # 1-3 comparisons per edge, either orientation
            v = float(rng.normal())
            (W.append(i), L.append(j), vals.append(v)) if rng.random() < 0.5 else (W.append(j), L.append(i),
                                                                                   vals.append(-v))
    g = build_graph(W, L, vals)
    mine = decompose(g, g.y)
    # naive: per-edge mean flow and count, written out again
    E = len(edges)
    y = np.array([np.mean([v if (a, b) == e else -v for a, b, v in zip(W, L, vals) if {a, b} == set(e)])
                  for e in edges])
    w = np.array([sum({a, b} == set(e) for a, b in zip(W, L)) for e in edges], float)
    B = np.zeros((E, V))
    for k, (i, j) in enumerate(edges):
        B[k, i], B[k, j] = 1, -1
    sw = np.sqrt(w)
    s, *_ = np.linalg.lstsq(B * sw[:, None], y * sw, rcond=None)
    grad_e = float(w @ (B @ s) ** 2)
    tris = [(i, j, k) for i in range(V) for j in range(i + 1, V) for k in range(j + 1, V)
            if {(i, j), (j, k), (i, k)} <= set(edges)]
    C = np.zeros((len(tris), E))
    for t, (i, j, k) in enumerate(tris):
        C[t, edges.index((i, j))], C[t, edges.index((j, k))], C[t, edges.index((i, k))] = 1, 1, -1
    Bt, Ct = B * sw[:, None], C / sw[None, :]
    lap = Bt @ Bt.T + Ct.T @ Ct
    lam, vec = np.linalg.eigh(lap)
    ker = vec[:, lam < 1e-9]
    harm_e = float(np.sum((ker.T @ (y * sw)) ** 2))
    total = float(w @ y ** 2)
    assert len(tris) >= 1 and ker.shape[1] >= 1                  # both non-gradient parts are exercised
    np.testing.assert_allclose(mine, [grad_e, total - grad_e - harm_e, harm_e], rtol=1e-9, atol=1e-12)


def _hodge(org, pooled):
    obs = load_observable("preference_cycles")
    ds = evaluate(obs, org)
    return ds["hodge_pooled" if pooled else "hodge_by_group"]


def test_cycle_organism_labels_cycle_and_a_scalar_models_margins_are_a_gradient():
    orgs = cycle_organisms((0.0, 1.0), n_groups=12, noise=0.0)
    lo, hi = _hodge(orgs[0], False), _hodge(orgs[1], False)
    assert hi.sizes["group"] == 12
    ng = lambda a, f: a.sel(flow=f, hodge_statistic="non_gradient_fraction").values   # noqa: E731
    np.testing.assert_allclose(ng(hi, "labels"), 1.0, atol=1e-12)              # every group a pure 3-cycle
    np.testing.assert_allclose(ng(lo, "labels"), 1 / 9, atol=1e-12)            # transitive, coded ±1
    assert np.abs(ng(hi, "model")).max() < 1e-9 and np.abs(ng(lo, "model")).max() < 1e-9
    p_hi = hi.sel(flow="labels", hodge_statistic="p_value").values
    np.testing.assert_allclose(p_hi, 1 / 1001)                                 # above every transitive order
    np.testing.assert_allclose(lo.sel(flow="labels", hodge_statistic="p_value").values, 1.0)
    pooled = _hodge(orgs[1], True)
    assert float(pooled.sel(flow="labels", hodge_statistic="n_groups")) == 12
    assert float(pooled.sel(flow="labels", hodge_statistic="cycle_rank")) == 12


def test_groups_and_agreement_come_from_dataset_fields(tmp_path):
    rows = []
    for k, (c, r, a) in enumerate([("x", "y", 1.0), ("y", "z", 1.0), ("z", "x", 0.5)]):
        rows.append({"id": f"r{k}", "prompt": f"prompt {k}", "chosen": c, "rejected": r, "set_id": "S",
                     "share": a})
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    ps = load_pairs("jsonl", path=str(f), fields={"group": "set_id", "agreement": "share"})
    assert ps[0].meta_dict()["group"] == "S" and ps[2].meta_dict()["agreement"] == 0.5
    from reward_lens_spec.organisms.organisms import Organism
    base = cycle_organisms((0.0,), n_groups=1)[0]
    arr = _hodge(Organism("planted_cycle", 0.0, base.lm, ps), False)
    assert list(arr.group.values) == ["S"]              # three prompts, one group
    # labels flow on the triangle: x>y 1, y>z 1, z–x 2·0.5 − 1 = 0; curl 2, so curl energy (2/√3)² = 4/3
    # of a total 2: gradient 1/3, curl 2/3 (the unanimous z>x of the plain labels would be a pure cycle)
    cell = arr.sel(flow="labels", group="S")
    assert float(cell.sel(hodge_statistic="gradient_fraction")) == pytest.approx(1 / 3, abs=1e-12)
    assert float(cell.sel(hodge_statistic="curl_fraction")) == pytest.approx(2 / 3, abs=1e-12)
    with pytest.raises(SpecError, match="dataset.fields.agreement"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({**rows[0], "share": 1.5}))
        ps2 = load_pairs("jsonl", path=str(bad), fields={"agreement": "share"})
        _hodge(Organism("planted_cycle", 0.0, base.lm, ps2), False)


def test_plan_time_errors_name_the_step():
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.models.families import family_for
    info = PlanInfo(family=family_for("llama"), n_layers=4, n_objectives=1, objectives=("reward",))
    steps = [{"name": "h", "op": "capture", "site": "readout"},
             {"name": "reward", "op": "project", "input": "h", "direction": "head"}]
    bad = ObservableSpec(name="t", steps=steps + [{"name": "c", "op": "hodge_rank", "input": "reward"}], outputs=["c"])
    with pytest.raises(SpecError, match=r"steps\.c\.input"):
        build_plan(bad, info)
    bad = ObservableSpec(name="t", steps=steps + [{"name": "m", "op": "diff", "input": "reward"},
                                                  {"name": "c", "op": "hodge_rank", "input": "m", "min_responses": 2}],
                         outputs=["c"])
    with pytest.raises(SpecError, match=r"steps\.c\.min_responses"):
        build_plan(bad, info)


def test_label_cycles_criterion_passes_on_the_cycle_organism():
    card = grade("preference_cycles", organisms=cycle_organisms(n_groups=24))
    assert list(card.readings) == ["label_cycles"]
    assert card.criteria_passed["label_cycles"] and card.spearman["label_cycles"] >= 0.9
