"""Issue 39 item 5: the console says what is true. Each output's table cell is the statistic that fits its shape,
checked against a naive computation written here; a mean that the shape makes constant is never printed; a
rerun prints the same table again, read from the run document."""
from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import xarray as xr

from reward_lens_spec.report.summary import summary_of, table_lines
from reward_lens_spec.report.summary_stats import summary_cell

RNG = np.random.default_rng(0)


def _num(cell: str, after: str) -> float:
    return float(cell.split(after, 1)[1].split()[0].strip("(),;[]"))


def test_share_over_components_reads_each_component_not_one_over_three():
    raw = RNG.normal(size=(40, 3))
    share = raw / raw.sum(1, keepdims=True)                  # each pair's shares sum to 1
    da = xr.DataArray(share, dims=("pair", "component"), coords={"component": ["embed", "attn", "mlp"]},
                      attrs={"units": "fraction"})
    cell = summary_cell(da)
    assert cell.startswith("per component: ")
    for k, name in enumerate(["embed", "attn", "mlp"]):
        assert np.isclose(_num(cell, name + " "), share[:, k].mean(), rtol=1e-3)
    assert "0.3333" not in cell


def test_pairwise_matrix_reads_its_off_diagonal_not_the_ones_on_the_diagonal():
    m = np.array([[1.0, 0.5, 0.52], [0.5, 1.0, 0.507], [0.52, 0.507, 1.0]])
    da = xr.DataArray(m, dims=("member", "other"), coords={"member": list("abc"), "other": list("abc")})
    naive = (m.sum() - np.trace(m)) / 6
    assert np.isclose(_num(summary_cell(da), "off-diagonal mean "), naive, rtol=1e-3)
    assert not np.isclose(naive, m.mean(), rtol=1e-3)         # the mean over all cells would differ
    grid = xr.DataArray(RNG.normal(size=(5, 4, 4)), dims=("pair", "layer", "head"),
                        coords={"layer": range(4), "head": range(4)})    # same labels, not a pairwise matrix
    assert np.isclose(_num(summary_cell(grid), "mean "), grid.values.mean(), rtol=1e-3)


def test_estimate_with_interval_is_one_cell_not_averaged_with_its_bounds():
    data = np.array([[0.904, 0.85, 0.95], [0.889, 0.80, 0.97]])
    da = xr.DataArray(data, dims=("stage", "bound"),
                      coords={"stage": ["before", "after"], "bound": ["estimate", "ci_low", "ci_high"]})
    assert summary_cell(da) == "before 0.904 [0.85, 0.95]; after 0.889 [0.8, 0.97]"
    one = xr.DataArray([0.1, -0.2, 0.3], dims=("bound",), coords={"bound": ["estimate", "ci_low", "ci_high"]})
    assert summary_cell(one) == "estimate 0.1 [-0.2, 0.3]"


def test_density_over_many_bins_reads_its_peak_not_one_over_bins():
    dens = np.zeros((2, 11))
    dens[:, 3], dens[:, 7] = 0.7, 0.3
    da = xr.DataArray(dens, dims=("pair", "eigenvalue"), coords={"eigenvalue": np.linspace(0, 1, 11)},
                      attrs={"units": "fraction"})
    assert summary_cell(da) == "per eigenvalue: peak at 0.3 (0.7)"


def test_plain_values_read_their_mean_and_nothing_finite_says_so():
    v = RNG.normal(size=(10, 4))
    v[0, 0] = np.nan
    da = xr.DataArray(v, dims=("pair", "layer"))
    assert np.isclose(_num(summary_cell(da), "mean "), np.nanmean(v), rtol=1e-3)
    assert summary_cell(xr.DataArray(np.full(3, np.nan), dims=("pair",))) == "(no finite)"
    # a single slice that happens to sum to a constant is not a share unless its units say fraction and it sums to 1
    lens = xr.DataArray([0.1, 0.4, 0.2], dims=("layer",), attrs={"units": "reward"})
    assert summary_cell(lens).startswith("mean ")


def test_table_counts_pairs_covered_and_margin_sign_share():
    m = np.array([1.0, -2.0, 3.0, np.nan])
    ds = xr.Dataset({"margin": ("pair", m), "grid": (("pair", "layer"), np.array([[1.0, 2], [np.nan, 1],
                                                                                   [np.nan, np.nan], [0, 0]]))})
    s = summary_of(ds)
    assert [r["n_pairs"] for r in s["rows"]] == [3, 3]
    assert s["chosen_preferred"] == [2 / 3]
    lines = table_lines(s)
    assert lines[-1] == "pairs: 4; chosen preferred (margin > 0): 0.667"
    assert table_lines(None) == []


def test_a_rerun_prints_the_same_table_from_the_run_document(tmp_path):
    from reward_lens_spec.cli import _print_summary
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run.executor import execute

    outs = []
    for _ in range(2):
        run, text = compose_run(["model=tiny", "observable=score", "dataset.limit=6",
                                 f"store.url={tmp_path / 's.zarr'}"])
        buf = io.StringIO()
        with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
            warnings.simplefilter("ignore")
            out = execute(run, resolved_yaml=text, base_dir=str(tmp_path), store_url=run.store.url, progress=False)
            _print_summary(out)
        outs.append((out, [ln for ln in buf.getvalue().splitlines() if ln.startswith(("margin ", "pairs: 6;"))]))
    (first, t1), (again, t2) = outs
    assert not first.reused and again.reused
    assert len(t1) == 2 and t1 == t2
    margin = first.result["margin"].values
    assert np.isclose(_num(t1[0], "mean "), margin.mean(), rtol=1e-3)


def _lazy_grids():
    """A dla-like grid (pair × layer × component: the embedding only at layer -1, so no sum over a dim is finite)
    and a finite pair × layer × head grid, in blocks of 10 pairs as a completion reads them (dask)."""
    dla = RNG.normal(size=(40, 3, 3))
    dla[:, 0, 1:] = np.nan
    dla[:, 1:, 0] = np.nan
    heads = RNG.normal(size=(40, 3, 4))
    coords = {"layer": [-1, 0, 1]}
    return xr.Dataset({"dla": (("pair", "layer", "component"), dla), "dla_heads": (("pair", "layer", "head"), heads)},
                      coords={**coords, "component": ["embed", "attn", "mlp"]}).chunk({"pair": 10})


def test_a_lazily_read_output_is_not_read_for_answers_the_summary_knows():
    """Issue 40 item 5: the completion's summary reads the stored blocks once per statistic it uses: no pass for
    "any finite cell" (its finite pairs say) nor for the min and max of a sum with no finite slice. The summary is
    the one of the same values in memory (main read them 18 times here: fails)."""
    from dask.callbacks import Callback

    ds = _lazy_grids()
    passes = []
    with Callback(start=lambda dsk: passes.append(1)):
        lazy = summary_of(ds)
    assert lazy == summary_of(ds.load())
    assert [r["summary"].split()[0] for r in lazy["rows"]] == ["mean", "mean"]
    # dla: its finite pairs, the finite slices of its two sums, its mean; dla_heads: its finite pairs, count,
    # min and max of each of its two sums, its mean
    assert len(passes) == 4 + 8
