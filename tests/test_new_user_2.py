"""Issue 30 (new user, part 2): one vocabulary for excluded / flagged / restricted pairs on every console line,
the store and the report; restricted runs say so; ``outputs:`` decides what is stored; ``store ls`` with a long
run id; the labels from plain xarray; the report's catalog shows each run's key numbers."""
from __future__ import annotations

import contextlib
import io
import json
import warnings

import numpy as np
import pytest

from reward_lens_spec.data.accounting import n_flagged, pairs_phrase
from reward_lens_spec.store import open_store

ROWS = [
    {"id": "long_prompt", "prompt": "why? " * 60, "chosen": "Because.", "rejected": "No idea."},
    {"id": "long_response", "prompt": "Explain.", "chosen": "a" * 200, "rejected": "b" * 200},
    {"id": "empty", "prompt": "Say something.", "chosen": "", "rejected": "Hello."},
    {"id": "same", "prompt": "Pick one.", "chosen": "This one.", "rejected": "This one."},
    {"id": "ok", "prompt": "2+2?", "chosen": "4", "rejected": "5"},
    {"id": "mismatch", "prompt": "A?", "prompt_rejected": "B?", "chosen": "x", "rejected": "y"},
]


def _run(overrides, base_dir):
    """Compose, execute and print the closing summary as the main job does; (stdout, outcome)."""
    from reward_lens_spec.report.summary import print_summary
    from reward_lens_spec.run.executor import execute
    from reward_lens_spec.run.compose import compose_run

    run, text = compose_run(overrides)
    buf = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
        warnings.simplefilter("ignore")
        out = execute(run, resolved_yaml=text, base_dir=str(base_dir), store_url=run.store.url, progress=True)
        print_summary(out)
    return buf.getvalue(), out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    path = d / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    text, out = _run(["model=tiny", "dataset=jsonl", f"dataset.path={path}", "model.max_length=64",
                      f"store.url={d / 's.zarr'}"], d)
    return text, out, open_store(out.store_url).provenance(out.run_id)


WANT = "excluded 2 (prompt_mismatch 1, response_truncated 1); flagged 3 (empty_response 1, identical_sides 1, prompt_truncated 1)"


def test_pairs_line_and_run_line_use_one_vocabulary_matching_the_stored_ids(mixed):
    text, out, prov = mixed
    pairs_line = next(ln for ln in text.splitlines() if ln.startswith("pairs: "))
    run_line = next(ln for ln in text.splitlines() if ln.startswith(f"run {out.run_id}:"))
    assert f"pairs: 4 of 6 scored; {WANT}; ids:" in pairs_line
    assert run_line.endswith(f"pairs 4 of 6 scored; {WANT}")        # excluded pairs are not counted as flagged
    assert sum(map(len, prov["excluded"].values())) == 2
    assert n_flagged(prov["pair_flags"]) == 3


def test_a_pair_with_two_flags_counts_once_in_the_total():
    phrase = pairs_phrase({"identical_after_truncation": ["x"]},
                          {"empty_response": ["a"], "prompt_truncated": ["a", "b"]}, 5)
    assert phrase == ("5 of 6 scored; excluded 1 (identical_after_truncation 1); "
                      "flagged 2 (empty_response 1, prompt_truncated 2)")


def test_report_counts_margin_le_0_under_its_own_name_not_as_flagged(mixed):
    from reward_lens_spec.report.build import pair_table

    _, out, prov = mixed
    ds = open_store(out.store_url).load(out.run_id, "score", lazy=False).to_dataset()
    html = pair_table(ds, prov)
    n_le0 = int((ds["margin"].values <= 0).sum())
    assert f"margin ≤ 0 in {n_le0} of 4 pair(s)" in html
    assert "pair(s) flagged" not in html
    assert WANT in html


@pytest.fixture(scope="module")
def restricted(tmp_path_factory):
    d = tmp_path_factory.mktemp("restricted")
    return _run(["model=tiny", "observable=patch", "dataset.limit=10", "observable.pairs=4",
                 f"store.url={d / 's.zarr'}"], d)


def test_restricted_run_says_which_outputs_cover_how_many_pairs_and_labels_means_with_n(restricted):
    text, out = restricted
    run_line = next(ln for ln in text.splitlines() if ln.startswith(f"run {out.run_id}:"))
    assert "10 of 10 scored" in run_line
    assert "restricted outputs cover 4 of 10 pairs (observable.pairs: patch_effect, patch_restored)" in run_line
    header = next(ln for ln in text.splitlines() if ln.startswith("variable "))
    assert "n pairs" in header
    row = next(ln for ln in text.splitlines() if ln.startswith("patch_effect "))
    assert row.split()[-2] == "4"              # the mean is over 4 pairs, and says so


OWN = """name: own_score
include: [score]
steps:
  - {name: margin_x2, op: scale, input: margin, by: 0.5}
outputs: [margin, margin_x2]
"""


def test_own_outputs_decide_what_is_stored_included_outputs_only_where_listed(tmp_path):
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.registry import expand_steps

    path = tmp_path / "own_score.yaml"
    path.write_text(OWN, encoding="utf-8")
    steps, outputs = expand_steps(load_observable(str(path)), load_observable)
    assert outputs == ["margin", "margin_x2"]                    # not reward, p_chosen, bt_loss, bt_grad
    assert {"reward", "margin", "margin_x2"} <= {s["name"] for s in steps}   # still computed
    text, out = _run(["model=tiny", f"observable={path}", "dataset.limit=4", f"store.url={tmp_path / 's.zarr'}"],
                     tmp_path)
    stored = open_store(out.store_url).load(out.run_id, "own_score", lazy=False)
    assert sorted(stored.to_dataset().data_vars) == ["margin", "margin_x2"]


def test_builtins_that_list_nothing_or_everything_store_as_before():
    from reward_lens_spec.observables import load_observable
    from reward_lens_spec.registry import expand_steps

    def outs(name):
        return expand_steps(load_observable(name), load_observable)[1]

    assert outs("battery") == [*outs("score"), *outs("lens"), "crystallization_layer", "crystallization_fraction",
                               *outs("dla"), *outs("patch"), *outs("attribution_patch"),
                               "faithfulness", "faithfulness_pooled"]
    assert outs("faithfulness")[:4] == ["dla", "dla_heads", "patch_effect", "patch_restored"]
    assert outs("crystallization") == ["lens_raw", "lens", "crystallization_layer", "crystallization_fraction"]
    assert outs("rewardbench")[:2] == ["reward", "margin"]


def test_store_ls_keeps_its_columns_when_one_run_id_is_long():
    import pandas as pd

    from reward_lens_spec.store.catalog_cli import WIDTH, ls_table

    long_id = "compare-score-3f2a9c1d7e5b4a60-vs-score-8d1e2f3a4b5c6d7e-frame-whitened-0123456789abcdef"
    df = pd.DataFrame({"run_id": ["score-a64709ae1887f51cfd7e", long_id], "observables": [["score"], ["compare"]],
                       "model": ["tiny", "tiny"], "dataset": ["diagnostic", "diagnostic"],
                       "trust": ["exploratory", "exploratory"],
                       "created": pd.to_datetime(["2026-01-01T10:00:00Z", "2026-01-01T11:00:00Z"]),
                       "model_fingerprint": ["ab" * 32] * 2, "dataset_checksum": ["cd" * 32] * 2,
                       "spec_hash": ["ef" * 32] * 2})
    text = ls_table(df)
    header = text.splitlines()[0].split()
    assert header == ["run_id", "observables", "model", "dataset", "trust", "created", "fingerprint"]
    assert max(map(len, text.splitlines())) <= WIDTH
    assert "compare-score-3f2a9c1d7…abcdef" in text               # start and hash tail of the long id
    assert long_id in ls_table(df, wide=True)


def test_the_docs_plain_xarray_lines_give_the_per_pair_labels_and_trust(mixed):
    """The docs' plain-xarray reading block (docs/results.md), run as written on a store (path swapped): the
    variable opened with plain xarray carries dimension, prompt_id and the pair flags, and trust is on the
    observable group."""
    import re
    from pathlib import Path

    _, out, _ = mixed
    page = (Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "xr.open_zarr(" in b)
    ns: dict = {}
    exec(block.replace("outputs/store.zarr", out.store_url), ns)     # noqa: S102 - the documented lines
    margin = ns["ds"]["margin"]
    for label in ("dimension", "prompt_id", "empty_response", "identical_sides", "prompt_truncated"):
        assert margin[label].dims == ("pair",), label
    assert bool(margin["prompt_truncated"].sel(pair="long_prompt")) and bool(margin["empty_response"].sel(pair="empty"))
    assert ns["ds"].attrs["trust"] == ns["res"].attrs["trust"]


def _synthetic():
    import xarray as xr

    rng = np.random.default_rng(0)
    pairs = [f"p{i}" for i in range(8)]
    margin = np.array([1.0, 2.0, -1.0, 0.5, 3.0, -0.5, 1.5, 2.5])
    dla = np.zeros((8, 3, 2))
    dla[:, 2, 1] = 2.0                            # mlp_L2 dominates, then attn_L0 negative
    dla[:, 0, 0] = -1.0
    dla += 0.01 * rng.standard_normal(dla.shape)
    return xr.Dataset({
        "margin": ("pair", margin, {"units": "reward", "gauge": "invariant"}),
        "dla": (("pair", "layer", "component"), dla, {"units": "reward", "gauge": "invariant"}),
        "my_layer_thing": (("pair", "layer"), rng.standard_normal((8, 3)), {"units": "reward", "gauge": "invariant"}),
        "my_component_thing": (("pair", "component"), rng.standard_normal((8, 2)), {"units": "fraction",
                                                                                   "gauge": "invariant"}),
    }, coords={"pair": pairs, "layer": [0, 1, 2], "component": ["attn", "mlp"]})


def test_catalog_key_numbers_margin_ci_accuracy_and_top_dla_components():
    from reward_lens_spec.report.arrays import mean_ci
    from reward_lens_spec.report.catalog import key_numbers

    ds = _synthetic()
    text = key_numbers({"obs": ds})
    m, lo, hi = mean_ci(ds["margin"].values)
    assert f"margin {m:.3g} [{lo:.3g}, {hi:.3g}] (n=8)" in text
    assert "accuracy 0.750 (6/8 margin > 0)" in text
    top = text.split("top dla ")[1]
    assert top.startswith("mlp_L2 +2") and top.split(", ")[1].startswith("attn_L0 -1")


def test_run_page_plots_user_defined_pair_by_layer_and_pair_by_component_variables():
    from reward_lens_spec.report.figures import run_figures

    titles = [f.title for f in run_figures(_synthetic(), {})]
    assert "my_layer_thing" in titles and "my_component_thing" in titles
    assert "Direct linear attribution" in titles


def test_report_catalog_row_shows_the_key_numbers(mixed, tmp_path):
    from reward_lens_spec.report.build import build_report

    _, out, _ = mixed
    html = build_report(out.store_url, tmp_path / "r").read_text(encoding="utf-8")
    row = html[html.index(f'data-run="{out.run_id}"'):].split("</tr>")[0]
    assert "key numbers" in html and "accuracy " in row and "margin &gt; 0" in row and "(n=4)" in row


def test_markdown_summary_and_report_say_the_restricted_outputs(restricted, tmp_path):
    pytest.importorskip("matplotlib")
    from reward_lens_spec.report.build import build_report
    from reward_lens_spec.report.plots import plot_run

    _, out = restricted
    md = [p for p in plot_run(out.store_url, out.run_id, tmp_path) if p.suffix == ".md"][0].read_text()
    want = "10 of 10 scored; excluded 0; flagged 0; restricted outputs cover 4 of 10 pairs"
    assert f"pairs: {want}" in md
    html = build_report(out.store_url, tmp_path / "r").read_text(encoding="utf-8")
    assert want in html and "4 of 10" in html       # the summary table's n pairs of patch_effect
