"""Plots and markdown summaries drawn from a store alone (tiny model runs written first)."""
from __future__ import annotations

import json

import pytest

from reward_lens_spec.report.cli import main as report_main
from reward_lens_spec.report.plots import plot_run
from reward_lens_spec.store import open_store

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from reward_lens_spec.fit.cli import compose_run
    from reward_lens_spec.fit.cli import main as fit_main
    from reward_lens_spec.run import execute

    d = tmp_path_factory.mktemp("report")
    url = str(d / "s.zarr")
    for obs in ("battery", "confounders"):          # battery = score, lens, crystallization, dla, patch, ...
        run, text = compose_run(["model=tiny", f"observable={obs}", "dataset.limit=6"])
        execute(run, resolved_yaml=text, base_dir=str(d), store_url=url, progress=False)
    rc = fit_main(["model=tiny", "dataset=diagnostic", "dataset.limit=40", f"out={d / 'ckpt'}", f"store.url={url}",
                   "fit.n_boot=100", "fit.progress=false", "fit.verify_pairs=2"])
    assert rc == 0
    return url


def test_every_plot_kind_is_written_from_the_store(store, tmp_path):
    s = open_store(store)
    written = []
    for run_id in s.runs()["run_id"]:
        written += plot_run(store, run_id, tmp_path)
    names = {p.name.rsplit("_", 1)[-1] for p in written}
    assert {"lens.png", "dla.png", "patch.png", "crystallization.png", "calibration.png", "summary.md"} <= names
    for p in written:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG


def test_summary_holds_the_numbers(store, tmp_path):
    s = open_store(store)
    fit_id = s.runs(observable="fit_report")["run_id"].iloc[0]
    md = [p for p in plot_run(store, fit_id, tmp_path) if p.suffix == ".md"][0].read_text()
    report = json.loads(s.load(fit_id, "fit_report").attrs["report_json"])
    assert f"{report['parts']['test']['accuracy']['estimate']:.3f}" in md and "ECE" in md
    conf_id = s.runs(observable="confounders")["run_id"].iloc[0]
    md = [p for p in plot_run(store, conf_id, tmp_path) if p.suffix == ".md"][0].read_text()
    assert "## length_confound" in md and "baseline_accuracy" in md and "## order_confound" in md


def test_report_cli(store, tmp_path, capsys):
    assert report_main([f"url={store}", f"out={tmp_path / 'r'}"]) == 0
    assert len(list((tmp_path / "r").glob("*.png"))) >= 5
    assert report_main([f"url={store}", "run=nope", f"out={tmp_path}"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert report_main([f"ur={store}"]) == 2
    assert "Did you mean 'url'" in capsys.readouterr().err
