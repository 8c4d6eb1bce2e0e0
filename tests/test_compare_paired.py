"""Paired comparison of two models on the same pairs (issue 41 item 1): McNemar's exact test, the paired
bootstrap CI of the accuracy difference and Holm / Šidák adjustment, checked against statsmodels, scipy and
naive formulas; the refusals (different pair sets, a run without margins, mismatched subset labels)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import xarray as xr

from reward_lens_spec.compare import CompareParams, compare_runs
from reward_lens_spec.compare.cli import main as compare_main
from reward_lens_spec.compare.paired import holm, mcnemar_exact, sidak
from reward_lens_spec.errors import SpecError
from reward_lens_spec.store import open_store, write_run

sm_tables = pytest.importorskip("statsmodels.stats.contingency_tables", reason="statsmodels (the test extra)")
sm_multitest = pytest.importorskip("statsmodels.stats.multitest", reason="statsmodels (the test extra)")

FAST = CompareParams(n_boot=2000, n_perm=50, seed=11)
SUBSETS = ("chat", "code", "math", "safety")


def _run(url, rid, values, ids, subsets, *, var="margin", dims=("pair",), extra=None, checksum="sha-d"):
    coords = {"pair": list(ids), "dimension": ("pair", list(subsets)), **(extra or {})}
    ds = xr.Dataset({var: (dims, np.asarray(values, float), {"units": "reward", "gauge": "invariant"})}, coords=coords)
    write_run(url, rid, {"score": ds}, {"model": f"m-{rid}", "spec_hash": f"s-{rid}", "model_fingerprint": f"f-{rid}",
                                        "dataset": "d", "dataset_checksum": checksum, "trust": "exploratory"})
    return rid


def _planted(n=240, seed=0):
    """Two models' margins on n pairs in four subsets; model a is right more often in 'math'."""
    rng = np.random.default_rng(seed)
    ids = [f"p{i:03d}" for i in range(n)]
    subsets = [SUBSETS[i % 4] for i in range(n)]
    a = rng.normal(0.4, 1.0, n)
    b = a + rng.normal(0, 0.8, n)
    math_rows = np.array([s == "math" for s in subsets])
    b[math_rows] -= 1.0                                           # b loses accuracy on math
    a[5], b[6] = 0.0, 0.0                                         # an exact tie counts as wrong
    return ids, subsets, a, b


def _naive_table(a, b):
    ca, cb = [x > 0 for x in a], [x > 0 for x in b]
    n10 = sum(1 for x, y in zip(ca, cb) if x and not y)
    n01 = sum(1 for x, y in zip(ca, cb) if y and not x)
    n11 = sum(1 for x, y in zip(ca, cb) if x and y)
    return n11, n10, n01, len(ca) - n11 - n10 - n01


def _naive_mcnemar(b, c):
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n)


@pytest.mark.parametrize("b,c", [(0, 0), (0, 3), (5, 5), (1, 12), (17, 4), (40, 61), (300, 251)])
def test_mcnemar_exact_matches_statsmodels_and_the_binomial_sum(b, c):
    ours = mcnemar_exact(b, c)
    sm = sm_tables.mcnemar([[10, b], [c, 7]], exact=True).pvalue
    assert ours == pytest.approx(sm, rel=1e-12, abs=1e-15)
    assert ours == pytest.approx(_naive_mcnemar(b, c), rel=1e-9, abs=1e-15)


def test_holm_and_sidak_match_statsmodels_and_nan_rows_stay_out_of_the_family():
    rng = np.random.default_rng(3)
    for p in (rng.uniform(0, 1, 23), rng.uniform(0, 0.05, 9), np.array([0.01, 0.01, 0.04, 0.5, 1.0, 0.0])):
        assert np.allclose(holm(p), sm_multitest.multipletests(p, method="holm")[1], rtol=1e-12, atol=0)
        assert np.allclose(sidak(p), sm_multitest.multipletests(p, method="sidak")[1], rtol=1e-12, atol=1e-15)
    p = np.array([0.01, np.nan, 0.04])
    assert np.isnan(holm(p)[1]) and np.isnan(sidak(p)[1])
    np.testing.assert_allclose(holm(p)[[0, 2]], sm_multitest.multipletests([0.01, 0.04], method="holm")[1])
    np.testing.assert_allclose(sidak(p)[[0, 2]], sm_multitest.multipletests([0.01, 0.04], method="sidak")[1])


def test_sidak_worked_example_of_reward_bench_270():
    """A 'significant' subset win at p = 0.009 picked from 23 subsets: 1 − (1 − 0.009)^23 = 0.1877."""
    adjusted = sidak([0.009] + [0.6] * 22)[0]
    assert adjusted == pytest.approx(0.18774189578921, abs=1e-12)
    assert round(adjusted, 2) == 0.19 and adjusted > 0.05


@pytest.mark.slow
def test_paired_accuracy_per_subset_agrees_with_naive_counts_statsmodels_and_scipy(tmp_path):
    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted()
    ra, rb = _run(url, "ra", a, ids, subsets), _run(url, "rb", b[::-1], ids[::-1], subsets[::-1])  # b stored reversed
    rid, res, written = compare_runs(url, ra, rb, params=FAST)
    ds = res["paired_margin"]
    assert written and list(ds["subset"].values) == [*SUBSETS, "all"]
    assert ds.attrs["seed"] == 11 and ds.attrs["n_boot"] == 2000
    assert open_store(url).provenance(rid)["paired"] == ["margin"]
    p_sub = []
    for s in [*SUBSETS, "all"]:
        rows = [i for i, x in enumerate(subsets) if s in ("all", x)]
        n11, n10, n01, n00 = _naive_table(a[rows], b[rows])
        r = ds.sel(subset=s)
        assert [int(r[k]) for k in ("n_both_correct", "n_a_only", "n_b_only", "n_both_wrong")] == [n11, n10, n01, n00]
        n = len(rows)
        assert float(r["accuracy_a"]) == pytest.approx((n11 + n10) / n) and float(r["agreement"]) == pytest.approx(
            (n11 + n00) / n)
        assert float(r["accuracy_diff"]) == pytest.approx(np.mean(a[rows] > 0) - np.mean(b[rows] > 0))
        table = [[n11, n10], [n01, n00]]
        assert float(r["p_mcnemar"]) == pytest.approx(sm_tables.mcnemar(table, exact=True).pvalue, rel=1e-12)
        boot = scipy.stats.bootstrap((a[rows] > 0, b[rows] > 0), lambda x, y, axis=-1: x.mean(axis) - y.mean(axis),
                                     paired=True, vectorized=True, method="percentile", n_resamples=5000,
                                     confidence_level=0.95, random_state=np.random.default_rng(5))
        ci = boot.confidence_interval
        assert float(r["diff_ci_low"]) == pytest.approx(ci.low, abs=0.03)
        assert float(r["diff_ci_high"]) == pytest.approx(ci.high, abs=0.03)
        if s != "all":
            p_sub.append(float(r["p_mcnemar"]))
    assert float(ds.sel(subset="math")["p_mcnemar"]) < 0.01                  # the planted gap is found
    for method, var in (("holm", "p_holm"), ("sidak", "p_sidak")):
        want = sm_multitest.multipletests(p_sub, method=method)[1]
        np.testing.assert_allclose(ds[var].sel(subset=list(SUBSETS)).values, want, rtol=1e-12)
    assert float(ds["p_holm"].sel(subset="all")) == pytest.approx(float(ds["p_mcnemar"].sel(subset="all")))
    # per pair: the tie at pair 5 is wrong for a; agreement read pair by pair
    assert float(ds["correct_a"].sel(pair="p005")) == 0.0
    np.testing.assert_array_equal(ds["agree"].sel(pair=ids).values, ((a > 0) == (b > 0)).astype(float))


@pytest.mark.slow
def test_the_bootstrap_is_seeded_and_the_seed_decides_it(tmp_path):
    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted(seed=1)
    ra, rb = _run(url, "ra", a, ids, subsets), _run(url, "rb", b, ids, subsets)
    one = compare_runs(url, ra, rb, params=CompareParams(n_boot=400, n_perm=20, seed=1))[1]["paired_margin"]
    url2 = str(tmp_path / "t.zarr")
    _run(url2, "ra", a, ids, subsets), _run(url2, "rb", b, ids, subsets)
    again = compare_runs(url2, ra, rb, params=CompareParams(n_boot=400, n_perm=20, seed=1))[1]["paired_margin"]
    other = compare_runs(url2, ra, rb, params=CompareParams(n_boot=400, n_perm=20, seed=2))[1]["paired_margin"]
    xr.testing.assert_identical(one[["diff_ci_low", "diff_ci_high"]], again[["diff_ci_low", "diff_ci_high"]])
    assert not np.array_equal(one["diff_ci_low"].values, other["diff_ci_low"].values)
    assert other.attrs["seed"] == 2


@pytest.mark.slow
def test_a_per_layer_statistic_is_adjusted_across_layers_and_subsets(tmp_path):
    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted(n=80, seed=2)
    rng = np.random.default_rng(9)
    la = a[:, None] + rng.normal(0, 1, (80, 3))
    lb = b[:, None] + rng.normal(0, 1, (80, 3))
    kw = {"var": "lens_normed", "dims": ("pair", "layer"), "extra": {"layer": [-1, 0, 1]}}
    ra, rb = _run(url, "ra", la, ids, subsets, **kw), _run(url, "rb", lb, ids, subsets, **kw)
    _, res, _ = compare_runs(url, ra, rb, ["lens_normed"], FAST, paired=["lens_normed"])
    ds = res["paired_lens_normed"]
    assert ds["p_mcnemar"].dims == ("layer", "subset")
    sub = ds["p_mcnemar"].sel(subset=list(SUBSETS)).values.ravel()           # 3 layers x 4 subsets = 12 tests
    np.testing.assert_allclose(ds["p_holm"].sel(subset=list(SUBSETS)).values.ravel(),
                               sm_multitest.multipletests(sub, method="holm")[1], rtol=1e-12)
    every = ds["p_mcnemar"].sel(subset="all").values                        # the pooled rows: across layers
    np.testing.assert_allclose(ds["p_sidak"].sel(subset="all").values,
                               sm_multitest.multipletests(every, method="sidak")[1], rtol=1e-12)
    for k, layer in enumerate([-1, 0, 1]):
        _, n10, n01, _ = _naive_table(la[:, k], lb[:, k])
        assert int(ds.sel(layer=layer, subset="all")["n_a_only"]) == n10
        assert float(ds.sel(layer=layer, subset="all")["p_mcnemar"]) == pytest.approx(_naive_mcnemar(n10, n01))


def test_refuses_different_pair_sets_and_stores_nothing(tmp_path):
    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted(n=40)
    ra = _run(url, "ra", a, ids, subsets)
    rb = _run(url, "rb", b[1:], ids[1:], subsets[1:])                         # one pair fewer, same checksum
    rc = _run(url, "rc", b, [*ids[:-1], "intruder"], subsets)                  # one pair swapped
    before = set(open_store(url).runs()["run_id"])
    for other, hint in ((rb, r"1 only in a \['p000'\], 0 only in b"), (rc, r"1 only in a \['p039'\], 1 only in b")):
        with pytest.raises(SpecError, match=rf"different pairs in 'margin': {hint}"):
            compare_runs(url, ra, other, params=FAST)
    assert set(open_store(url).runs()["run_id"]) == before


def test_refuses_a_run_without_margins_and_mismatched_subset_labels(tmp_path):
    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted(n=40)
    ra = _run(url, "ra", a, ids, subsets)
    rl = _run(url, "rl", b, ids, subsets, var="other_margin")
    with pytest.raises(SpecError, match=r"run rl has no 'margin': a paired accuracy test needs both runs' margins"):
        compare_runs(url, ra, rl, None, FAST, paired=["margin"])
    relabelled = list(subsets)
    relabelled[7] = "chat" if subsets[7] != "chat" else "code"
    rx = _run(url, "rx", b, ids, relabelled)
    with pytest.raises(SpecError, match=r"pair 'p007' is in subset .* the runs did not read the same data"):
        compare_runs(url, ra, rx, params=FAST)


def test_nan_margins_are_counted_missing_not_scored(tmp_path):
    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted(n=40)
    b = b.copy()
    b[[0, 4]] = np.nan                                                       # both in subset 'chat'
    ra, rb = _run(url, "ra", a, ids, subsets), _run(url, "rb", b, ids, subsets)
    ds = compare_runs(url, ra, rb, params=FAST)[1]["paired_margin"]
    assert int(ds.sel(subset="chat")["n_missing"]) == 2 and int(ds.sel(subset="chat")["n_pairs"]) == 8
    assert int(ds.sel(subset="all")["n_pairs"]) == 38 and np.isnan(float(ds["agree"].sel(pair="p000")))


def test_cli_prints_each_subset_and_the_seed_and_refuses_in_one_line(tmp_path, capsys):
    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted(n=40)
    ra, rb = _run(url, "ra", a, ids, subsets), _run(url, "rb", b, ids, subsets)
    assert compare_main([f"url={url}", f"a={ra}", f"b={rb}", "n_boot=100", "n_perm=20", "seed=4"]) == 0
    out = capsys.readouterr().out
    assert out.count("McNemar p") == 5 and "margin [subset=math]" in out and "seed=4" in out and "Holm" in out
    assert compare_main([f"url={url}", f"a={ra}", f"b={rb}", "paired=nope", "n_perm=20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run ra has no 'nope'" in err[0]
    assert compare_main([f"url={url}", f"a={ra}", f"b={rb}", "paired=none", "n_boot=50", "n_perm=20"]) == 0
    assert "McNemar" not in capsys.readouterr().out


@pytest.mark.slow
def test_the_report_shows_the_paired_test_per_subset_with_its_seed(tmp_path):
    from reward_lens_spec.report.build import build_report

    url = str(tmp_path / "s.zarr")
    ids, subsets, a, b = _planted(n=40)
    ra, rb = _run(url, "ra", a, ids, subsets), _run(url, "rb", b, ids, subsets)
    rid, res, _ = compare_runs(url, ra, rb, params=CompareParams(n_boot=200, n_perm=20, seed=3))
    text = build_report(url, tmp_path / "html").read_text()
    sec = text[text.index(f'id="run-{rid}"'):].split("</section>")[0]
    p = float(res["paired_margin"]["p_mcnemar"].sel(subset="math"))
    assert 'alt="paired_margin: paired accuracy' in sec and "seed 3" in sec
    assert f"McNemar p {p:.3g}" in sec and "Holm" in sec and "Sidak" in sec
