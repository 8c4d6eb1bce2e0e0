"""Reports drawn from a store alone: PNG + markdown per run, and the one-page HTML report.

The store holds real tiny-model runs (battery, confounders, reward_direction for two models and their
comparison, a scorecard and a run it calibrates, a fit report) plus one incomplete run. The browser
checks are in ``test_report_browser.py``.
"""
from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.report.arrays import crystallization_bins
from reward_lens_spec.report.build import build_report
from reward_lens_spec.report.catalog import trust_of
from reward_lens_spec.report.cli import main as report_main
from reward_lens_spec.report.figures import crystallization_figure
from reward_lens_spec.report.plots import plot_run
from reward_lens_spec.store import open_store, write_run

PNG = b"\x89PNG\r\n\x1a\n"
INCOMPLETE = "battery-crashed-before-completion"


def make_store(d: Path) -> str:
    """A real store: tiny-model runs of every report kind, and one run lacking only its completion."""
    from reward_lens_spec.compare import compare_runs
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.fit.cli import main as fit_main
    from reward_lens_spec.run import execute
    from reward_lens_spec.trust.cli import calibrate_main

    url = str(d / "s.zarr")
    assert calibrate_main(["observable=margin", "n_pairs=6", f"store.url={url}"]) == 0   # a passing card
    ids = {}
    for model, obs in (("tiny", "battery"), ("tiny", "confounders"), ("tiny", "score"), ("tiny", "margin"),
                       ("tiny", "reward_direction"), ("tiny_gpt2", "reward_direction"),
                       ("tiny", "examples/accuracy_by_dimension")):
        run, text = compose_run([f"model={model}", f"observable={obs}", "dataset.limit=6"])
        ids[model, obs] = execute(run, resolved_yaml=text, base_dir=str(d), store_url=url, progress=False).run_id
    compare_runs(url, ids["tiny", "reward_direction"], ids["tiny_gpt2", "reward_direction"], ["margin"])
    assert fit_main(["model=tiny", "dataset=diagnostic", "dataset.limit=40", f"out={d / 'ckpt'}",
                     f"store.url={url}", "fit.n_boot=100", "fit.progress=false", "fit.verify_pairs=2"]) == 0
    # a writer killed after its data, before completion: every byte of a real run, complete: false
    src = Path(url) / "runs" / ids["tiny", "battery"]
    dst = Path(url) / "runs" / INCOMPLETE
    shutil.copytree(src, dst)
    doc = json.loads((dst / "zarr.json").read_text())
    doc["attributes"].update(complete=False, run_id=INCOMPLETE)
    (dst / "zarr.json").write_text(json.dumps(doc))
    return url


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def page(store, tmp_path_factory):
    return build_report(store, tmp_path_factory.mktemp("html"))


class Page(HTMLParser):
    """Catalog rows, run sections, images and every attribute value of an HTML page."""

    def __init__(self, text: str):
        super().__init__()
        self.rows, self.sections, self.imgs, self.urls = [], [], [], []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-run" in a:
            self.rows.append(a)
        if tag == "section":
            self.sections.append(a.get("id"))
        if tag == "img":
            self.imgs.append(a)
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


# ------------------------------------------------------------------ PNG + markdown (format=png)
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
    assert report_main([f"url={store}", f"out={tmp_path / 'r'}", "format=png"]) == 0
    assert len(list((tmp_path / "r").glob("*.png"))) >= 5
    capsys.readouterr()
    assert report_main([f"url={store}", f"out={tmp_path / 'h'}"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "h" / "index.html")
    assert report_main([f"url={store}", "run=nope", f"out={tmp_path}"]) == 2          # run= alone: PNG plots
    assert "no run 'nope'" in capsys.readouterr().err
    assert report_main([f"url={store}", "run=nope", "format=html", f"out={tmp_path}"]) == 2
    assert "run: the html report lists every complete run" in capsys.readouterr().err
    assert report_main([f"url={store}", "format=pdf"]) == 2
    assert "Valid: html, png" in capsys.readouterr().err
    assert report_main([f"ur={store}"]) == 2
    assert "Did you mean 'url'" in capsys.readouterr().err
    assert report_main([f"url={tmp_path / 'nothing'}"]) == 2
    assert "no result store" in capsys.readouterr().err


# ------------------------------------------------------------------ the HTML page
def test_catalog_lists_every_complete_run_and_no_incomplete_one(store, page):
    s = open_store(store)
    assert INCOMPLETE in s.incomplete()
    text = page.read_text()
    p = Page(text)
    want = set(s.runs()["run_id"])
    assert [r["data-run"] for r in p.rows] == list(s.runs()["run_id"]) and len(want) == 10
    assert set(p.sections) == {f"run-{r}" for r in want}
    assert INCOMPLETE not in text and "1 incomplete run(s)" in text


def test_page_is_self_contained(page):
    text = page.read_text()
    p = Page(text)
    assert p.imgs and all(i["src"].startswith("data:image/svg+xml;base64,") for i in p.imgs)
    assert all(u.startswith(("#", "data:")) for u in p.urls), [u for u in p.urls if not u.startswith(("#", "data:"))]
    assert not re.search(r"@import|url\(|https?://", text)


def test_run_sections_hold_the_standard_figures_with_units_and_gauge(store, page):
    s = open_store(store)
    text = page.read_text()
    by_obs = {o: next(r for r in s.runs()["run_id"] if r.startswith(o + "-"))
              for o in ("battery", "confounders", "fit_report", "compare")}

    def section(run_id):
        return text[text.index(f'id="run-{run_id}"'):].split("</section>")[0]

    battery = section(by_obs["battery"])
    for title in ("Reward lens", "Direct linear attribution", "Activation patching effect", "Crystallization"):
        assert f'alt="{title}' in battery
    assert "Per-pair values and flags" in battery and "Provenance: resolved config" in battery
    assert "<details>" in battery and "spec_hash" in battery
    for sec in (battery, section(by_obs["confounders"]), section(by_obs["fit_report"])):
        caps = re.findall(r"<figcaption>(.*?)</figcaption>", sec)
        assert caps and all("Units: " in c and "Gauge: " in c for c in caps)
    assert 'alt="length_confound' in section(by_obs["confounders"])
    assert 'alt="Calibration (reliability curve)' in section(by_obs["fit_report"])
    card = section(s.runs(observable="scorecard")["run_id"].iloc[0])
    assert 'alt="Scorecard calibration curves' in card
    cmp_ = section(by_obs["compare"])
    stored = s.load(by_obs["compare"], "margin", lazy=False)
    r = float(stored["estimate"].sel(statistic="pearson"))
    assert f"pearson {r:.3g}" in cmp_ and "p_perm" in cmp_ and "shuffled pairings" in cmp_
    # w_r sits in each model's native frame: the gate's refusal and its fix are shown, no cosine
    assert "w_r: not compared." in cmp_ and "Fix: fit a shared frame" in cmp_ and "direction cosine" not in cmp_


def test_the_per_pair_table_shows_each_pairs_dimension_beside_an_output_by_dimension(store, page):
    """An observable with an output by ``dimension`` (its published group renames that dim): the per-pair table
    still shows every pair's own dimension label, as plain xarray reads it from the store."""
    run_id = open_store(store).runs(observable="accuracy_by_dimension")["run_id"].iloc[0]
    stored = xr.open_zarr(store, group=f"runs/{run_id}/accuracy_by_dimension")
    text = page.read_text()
    sec = text[text.index(f'id="run-{run_id}"'):].split("</section>")[0]
    rows = re.findall(r'<tr><td><span class="mono">([^<]*)</span></td><td>([^<]*)</td>', sec)
    assert rows and dict(rows) == {str(p): str(d) for p, d in zip(stored["pair"].values, stored["dimension"].values)}


def test_trust_comes_from_the_catalog_and_is_flagged_when_unverified(store, page):
    s = open_store(store)
    text = page.read_text()
    score = s.runs(observable="margin").iloc[0]
    assert score["trust"] == "calibrated"                    # the passing card calibrates the margin run
    row = text[text.index(f'data-run="{score["run_id"]}"'):].split("</tr>")[0]
    assert 'data-trust="calibrated"' in row and "scope:" in row
    full = s.runs(observable="score").iloc[0]                # score: ungraded outputs keep the run exploratory
    assert full["trust"] == "exploratory"
    assert 'data-trust="exploratory"' in text[text.index(f'data-run="{full["run_id"]}"'):].split("</tr>")[0]
    t = trust_of({"trust": "exploratory", "trust_verified": False, "trust_reason": "label edited: registered"},
                 {"trust": "registered"})
    assert (t.level, t.status, t.evidence) == ("exploratory", "NOT verified", "label edited: registered")
    assert trust_of({"trust": "calibrated", "trust_verified": True}, {}).status == "verified"
    assert trust_of({"trust": "calibrated"}, {}).status == "stored label"


def test_hostile_store_strings_are_escaped(tmp_path):
    url = str(tmp_path / "h.zarr")
    ds = xr.Dataset({"margin": (("pair",), np.array([0.5, -1.0, 2.0]), {"units": "reward", "gauge": "invariant"})},
                    coords={"pair": ["<img src=x onerror=alert(1)>", "b", "c"]})
    write_run(url, "evil", {"score": ds}, {"model": "<script>alert(1)</script>", "dataset": "d\"><b>x",
                                           "trust": "exploratory", "config_yaml": "a: </pre><script>x</script>"})
    text = build_report(url, tmp_path / "out").read_text()
    assert "<script>alert" not in text and "</pre><script>" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert text.count("<script>") == 1                      # the page's own


def _svg_marks(svg: str):
    """Axes box and every drawn point (circle centres, polyline vertices, bar tops) of a chart."""
    box = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)" fill="none"', svg)
    x0, y0, w, h = map(float, box.groups())
    pts = [tuple(map(float, m)) for m in re.findall(r'<circle cx="([-\d.]+)" cy="([-\d.]+)"', svg)]
    for poly in re.findall(r'<polyline points="([^"]+)"', svg):
        pts += [tuple(map(float, p.split(","))) for p in poly.split()]
    return (x0, y0, x0 + w, y0 + h), pts


def test_no_drawn_value_falls_outside_its_axes(store):
    from reward_lens_spec.report.figures import run_figures

    s = open_store(store)
    n = 0
    for run_id in s.runs(observable="battery")["run_id"].tolist() + s.runs(observable="confounders")["run_id"].tolist():
        for ds in s.load(run_id, lazy=False).values():
            for fig in run_figures(ds, s.provenance(run_id)):
                (a, b, c, d), pts = _svg_marks(fig.svg)
                for x, y in pts:
                    assert a - 0.1 <= x <= c + 0.1 and b - 0.1 <= y <= d + 0.1, (fig.title, x, y)
                n += len(pts)
    assert n > 20


def test_crystallization_histogram_counts_every_value():
    v = np.array([-0.25, 0.0, 0.05, 0.5, 0.999, 1.0, 1.2, np.nan])
    edges, counts = crystallization_bins(v)
    assert counts.sum() == 7 and edges[0] == -0.25 and edges[-1] == 1.2
    naive = {}
    for x in v[np.isfinite(v)]:       # bin k spans k/20..(k+1)/20: [a, b) up to [0.95, 1], then (a, b]
        k = next(k for k in range(-40, 40) if (k / 20 <= x < (k + 1) / 20 if x < 1 else k / 20 < x <= (k + 1) / 20))
        naive[k] = naive.get(k, 0) + 1
    assert naive == {-5: 1, 0: 1, 1: 1, 10: 1, 19: 2, 23: 1}
    got = {int(round(e * 20)): int(c) for e, c in zip(edges[:-1], counts) if c}
    assert got == naive
    fig = crystallization_figure(xr.Dataset({"crystallization_fraction": (("pair",), v, {"units": "fraction",
                                                                                         "gauge": "invariant"})}))
    shown = [int(k) for k in re.findall(r"\): (\d+) pair\(s\)</title>", fig.svg)]
    assert sum(shown) == 7 and "2 value(s) outside [0, 1]" in fig.caption and "1 non-finite" in fig.caption


# ------------------------------------------------------------------ in a real browser (headless Chromium)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,860", "--hide-scrollbars")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    import os

    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"headless Chromium absent ({CHROMIUM}, {CHROMEDRIVER}): apt-get install -y chromium "
                    "chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM                   # Debian's browser; selenium never fetches one
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def _open(driver, url):
    driver.get(url)
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, 60).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"))


def _visible_runs(driver) -> list[str]:
    return driver.execute_script("return Array.from(document.querySelectorAll('#catalog-table tbody tr'))"
                                 ".filter(r => !r.hidden && r.offsetParent !== null).map(r => r.dataset.run)")


def _images(driver) -> list:
    return driver.execute_script("return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")


def _errors(driver) -> list:
    return [m for m in driver.get_log("browser") if m["level"] == "SEVERE"]


def test_browser_catalog_filters_images_console(store, page, browser, tmp_path):
    import os

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    s = open_store(store)
    runs = s.runs()
    browser.get_log("browser")                                          # start from an empty console
    _open(browser, page.as_uri())
    assert _visible_runs(browser) == list(runs["run_id"])               # every complete run, in order
    assert INCOMPLETE not in browser.page_source
    count = browser.find_element(By.ID, "f-count")
    assert count.text == f"{len(runs)} of {len(runs)} runs shown"

    box = browser.find_element(By.ID, "f-text")
    box.send_keys("tiny_gpt2")
    want = [r for r, m in zip(runs["run_id"], runs["model"]) if "tiny_gpt2" in str(m)]
    assert len(want) == 2 and _visible_runs(browser) == want and count.text == f"2 of {len(runs)} runs shown"
    box.clear()
    box.send_keys(" ")                                                  # an input event with empty text
    assert len(_visible_runs(browser)) == len(runs)
    Select(browser.find_element(By.ID, "f-trust")).select_by_value("calibrated")
    assert _visible_runs(browser) == list(s.runs(trust="calibrated")["run_id"]) != []
    Select(browser.find_element(By.ID, "f-trust")).select_by_value("")
    Select(browser.find_element(By.ID, "f-model")).select_by_value("tiny")
    assert _visible_runs(browser) == list(s.runs(model="tiny")["run_id"])
    Select(browser.find_element(By.ID, "f-model")).select_by_value("")

    pairs_head = browser.find_element(By.XPATH, "//table[@id='catalog-table']//th[text()='pairs']")
    pairs_head.click()
    got = browser.execute_script("return Array.from(document.querySelectorAll('#catalog-table tbody tr'))"
                                 ".map(r => r.cells[3].dataset.sort)")
    nums = [int(x) for x in got if x]
    assert nums == sorted(nums) and len(nums) == len(runs)
    pairs_head.click()
    got = browser.execute_script("return Array.from(document.querySelectorAll('#catalog-table tbody tr'))"
                                 ".map(r => +r.cells[3].dataset.sort)")
    assert got == sorted(got, reverse=True)

    imgs = _images(browser)
    assert len(imgs) >= 12 and all(ok and w > 0 for _, ok, w in imgs), [i for i in imgs if not (i[1] and i[2] > 0)]
    shot = tmp_path / "report.png"
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == PNG and shot.stat().st_size > 10_000
    if os.environ.get("RLS_REPORT_SCREENSHOT"):                        # refresh docs/report.png on demand
        shutil.copy(shot, os.environ["RLS_REPORT_SCREENSHOT"])

    battery = next(r for r in runs["run_id"] if r.startswith("battery-"))
    browser.find_element(By.LINK_TEXT, battery).click()                 # the run's own page
    section = browser.find_element(By.ID, f"run-{battery}")
    assert section.is_displayed() and not browser.find_element(By.ID, "catalog").is_displayed()
    shown = browser.execute_script("return Array.from(arguments[0].querySelectorAll('img'))"
                                   ".map(i => [i.naturalWidth, i.getBoundingClientRect().width])", section)
    assert len(shown) >= 4 and all(w > 0 and bw > 0 for w, bw in shown)
    browser.find_element(By.LINK_TEXT, "← catalog").click()
    assert browser.find_element(By.ID, "catalog").is_displayed() and not section.is_displayed()
    assert _errors(browser) == []


def test_browser_page_from_a_static_server(page, browser):
    import subprocess
    import sys

    srv = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                            "--directory", str(page.parent)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        line = srv.stdout.readline()                                   # "Serving HTTP on 127.0.0.1 port N ..."
        port = int(re.search(r"port (\d+)", line).group(1))
        browser.get_log("browser")
        _open(browser, f"http://127.0.0.1:{port}/index.html")
        imgs = _images(browser)
        assert imgs and all(ok and w > 0 for _, ok, w in imgs)
        assert len(_visible_runs(browser)) == len(Page(page.read_text()).rows)
        assert _errors(browser) == []
    finally:
        srv.terminate()
        srv.wait(10)


def test_lazy_and_one_pass_reads_give_the_same_page(store, tmp_path, monkeypatch):
    from reward_lens_spec.report import build

    def body(path):                                   # the page minus its generation time
        return re.sub(r"report generated [^ ]+ from", "", path.read_text())

    one_pass = body(build_report(store, tmp_path / "a"))
    monkeypatch.setattr(build, "LOAD_AT_ONCE", -1)    # every variable stays lazy (dask-backed)
    seen = []
    real = build.open_run
    monkeypatch.setattr(build, "open_run", lambda st, r, prov=None: seen.append(real(st, r, prov)) or seen[-1])
    lazy = body(build_report(store, tmp_path / "b"))
    assert seen and all(v.chunks is not None for d in seen for ds in d.values() for v in ds.data_vars.values()
                        if v.ndim)
    assert lazy == one_pass


def test_direction_cosine_figure_shows_the_cosine_and_its_null():
    from reward_lens_spec.frames.compare import compare_directions
    from reward_lens_spec.report.compare_view import direction_figure

    rng = np.random.default_rng(3)
    a, b = rng.normal(size=16), rng.normal(size=16)
    g = {"units": "direction", "gauge": "frame:whitened:" + "ab" * 32}
    res = compare_directions(xr.DataArray(a, dims="d_model", attrs=g), xr.DataArray(b, dims="d_model", attrs=g),
                             n_null=200).drop_vars(["a_in_frame", "b_in_frame"])
    fig = direction_figure("w_r", res)
    cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))          # the cosine, computed here
    assert f"in their shared frame: {cos:.3g}," in fig.caption and "200 random directions" in fig.caption
    assert "Gauge: frame:whitened:" in fig.caption
    q95 = float(np.asarray(res["null_abs_cosine"].sel(quantile=0.95)))
    assert f"null q0.95 = {q95:.3g}" in fig.svg and f"observed |cos| = {abs(cos):.3g}" in fig.svg


def test_png_crystallization_histogram_counts_every_value(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib", reason="report format=png needs matplotlib "
                                                          "(pip install 'reward_lens_spec[report]')")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reward_lens_spec.report.plots import plot_crystallization

    made, real = [], plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    v = np.array([-0.25, 0.0, 0.5, 1.0, 1.2, np.nan])
    ds = xr.Dataset({"crystallization_fraction": (("pair",), v, {"units": "fraction", "gauge": "invariant"})})
    plot_crystallization(ds, tmp_path / "c.png", "t")
    bars = made[0][1].patches
    assert sum(b.get_height() for b in bars) == 5
    assert min(b.get_x() for b in bars) == -0.25 and max(b.get_x() + b.get_width() for b in bars) >= 1.2
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
