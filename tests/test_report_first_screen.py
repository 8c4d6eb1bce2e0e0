"""Issue 39 item 4: the report answers on its first screen. A user's own observable gets headline numbers (each
output's mean over pairs with a 95% CI, checked against numpy here), a sweep's runs sit side by side, and each
variable is drawn by its dims (pair × component → bars, layer → a line, layer × component → a heat map)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.report.catalog import headline, key_numbers
from reward_lens_spec.report.figures import generic_figure, plottable

OWN = """name: own_share
include: [dla]
steps:
  - {name: dla_by_component, op: reduce, input: dla, dim: layer, how: sum}
  - {name: lens_like, op: reduce, input: dla, dim: component, how: sum}
outputs: [dla_by_component, lens_like]
"""
RNG = np.random.default_rng(1)


def _ci(v):
    v = v[np.isfinite(v)]
    m, s = v.mean(), v.std(ddof=1)
    h = 1.96 * s / np.sqrt(v.size)
    return f"mean {m:.3g} [{m - h:.3g}, {m + h:.3g}] (n={v.size})"


def test_headline_is_the_mean_over_pairs_with_its_ci_for_any_variable():
    v = RNG.normal(size=(30, 4))
    v[3, :] = np.nan
    da = xr.DataArray(v, dims=("pair", "layer"))
    per_pair = np.array([r[np.isfinite(r)].mean() if np.isfinite(r).any() else np.nan for r in v])
    assert headline(da) == _ci(per_pair)
    m = xr.DataArray(np.array([[1.0, 0.2], [0.2, 1.0]]), dims=("member", "other"),
                     coords={"member": ["a", "b"], "other": ["a", "b"]})
    ds = xr.Dataset({"agreement": m, "own": da})
    text = key_numbers({"obs": ds})
    assert "agreement off-diagonal mean 0.2" in text and "own mean " in text


def test_figures_are_chosen_by_dims():
    comp = xr.DataArray(RNG.normal(size=(8, 3)), dims=("pair", "component"),
                        coords={"component": ["embed", "attn", "mlp"]}, attrs={"units": "reward"})
    layer_only = xr.DataArray(RNG.normal(size=5), dims=("layer",), coords={"layer": np.arange(-1, 4)})
    grid = xr.DataArray(RNG.normal(size=(8, 5, 3)), dims=("pair", "layer", "component"),
                        coords={"layer": np.arange(-1, 4), "component": ["embed", "attn", "mlp"]})
    ds = xr.Dataset({"c": comp, "l": layer_only, "g": grid})
    assert plottable(ds) == ["c", "g", "l"]
    bars, line, heat = (generic_figure(ds, n) for n in ("c", "l", "g"))
    assert "per component" in bars.caption and "layer" not in bars.caption.split("Units")[0]
    assert "<rect" in bars.svg and "embed" in bars.svg
    assert "by layer: one value per layer" in line.caption
    assert "per layer × component" in heat.caption
    for k, name in enumerate(["embed", "attn", "mlp"]):           # the bar caption's means are numpy's
        assert f"{name} {comp.values[:, k].mean():.3g}"[:len(name) + 5] in bars.caption


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.mark.slow
def test_first_screen_of_a_sweep_of_a_users_own_observable_shows_its_numbers(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("headless Chromium absent: apt-get install -y chromium chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    from reward_lens_spec.report.build import build_report
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run.executor import execute
    from reward_lens_spec.store import open_store

    (tmp_path / "own.yaml").write_text(OWN)
    url = str(tmp_path / "s.zarr")
    ids = []
    for model in ("tiny", "tiny_gpt2"):
        run, text = compose_run([f"observable={tmp_path / 'own.yaml'}", f"model={model}", "dataset.limit=6"])
        ids.append(execute(run, resolved_yaml=text, base_dir=str(tmp_path), store_url=url, progress=False).run_id)
    page = build_report(url, tmp_path / "html")
    want = []
    for rid in ids:
        res = open_store(url).load(rid, "own_share", lazy=False)
        v = np.asarray(res["lens_like"].values, float)
        want.append(_ci(np.nanmean(v, 1)))
    opts = Options()
    opts.binary_location = CHROMIUM
    for f in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,860",
              f"--user-data-dir={tmp_path / 'profile'}"):
        opts.add_argument(f)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    try:
        driver.get(page.as_uri())
        first_screen = driver.execute_script(
            "const h = window.innerHeight; const out = [];"
            "const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);"
            "while (w.nextNode()) { const r = document.createRange(); r.selectNodeContents(w.currentNode);"
            "  const b = r.getBoundingClientRect();"
            "  if (b.height > 0 && b.top >= 0 && b.bottom <= h) out.push(w.currentNode.textContent); }"
            "return out.join(' ');")
    finally:
        driver.quit()
    text = " ".join(first_screen.split())
    for w in want:
        assert f"lens_like {w}" in text
    assert "dla_by_component mean" in text and "own_share" in text

