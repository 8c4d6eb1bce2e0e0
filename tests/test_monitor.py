"""Anytime-valid monitor over a checkpoint sequence (issue 41 item 4): the false-alarm rate of unchanged
sequences stays under alpha however often one looks, a planted shift is caught, and the training organism's
planted step is the first alarm."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reward_lens_spec.compare.monitor import betting_e_value, monitor_series, spend
from reward_lens_spec.errors import SpecError


def test_alpha_shares_sum_to_alpha_and_the_e_value_is_the_mixture_written_out():
    assert sum(spend(k, 0.05) for k in range(1, 200000)) == pytest.approx(0.05, rel=1e-4)
    x = np.array([1, 1, -1, 1, 0.5, -0.25])
    naive = np.mean([np.prod([1 + lam * v for v in x]) for lam in (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)])
    assert betting_e_value(x) == pytest.approx(naive, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("statistic", ["margin", "accuracy"])
def test_unchanged_sequences_keep_the_false_alarm_rate_however_long_one_watches(statistic):
    """600 sequences of 30 checkpoints whose per-pair changes are symmetric noise around 0 (heavy tails):
    the share of sequences with ANY alarm stays under alpha = 0.1."""
    rng = np.random.default_rng(7)
    alarms = 0
    for _ in range(600):
        base = rng.normal(0.3, 1.0, 40)
        steps = [base]
        for _ in range(29):
            steps.append(base + rng.standard_t(2, 40) * 0.5)          # each checkpoint: noise, no shift
        alarms += any(monitor_series(steps, statistic=statistic, alpha=0.1)["alarm"])
    assert alarms / 600 <= 0.1, alarms


def test_a_planted_shift_is_caught_where_it_happens():
    rng = np.random.default_rng(8)
    hits = 0
    for _ in range(100):
        base = rng.normal(0.0, 1.0, 60)
        steps = [base + rng.normal(0, 0.3, 60) + (1.0 if k >= 6 else 0.0) for k in range(10)]
        res = monitor_series(steps, alpha=0.05)
        first = next((k for k, a in enumerate(res["alarm"], start=1) if a), None)
        hits += first == 6
    assert hits >= 95, hits


def test_bad_values_are_refused():
    with pytest.raises(SpecError, match="statistic"):
        monitor_series([np.zeros(3)] * 2, statistic="mean")
    with pytest.raises(SpecError, match="alpha"):
        monitor_series([np.zeros(3)] * 2, alpha=1.5)
    with pytest.raises(SpecError, match="min_change"):
        monitor_series([np.zeros(3)] * 2, min_change=-1)


STEPS = [40, 60, 80, 100, 120, 140, 160]


@pytest.mark.slow
def test_the_training_organisms_planted_step_is_the_first_alarm(tmp_path_factory, tmp_path, monkeypatch, capsys):
    from reward_lens_spec import open_store
    from reward_lens_spec.cli import main
    from reward_lens_spec.compare.monitor import main as monitor_main, monitor
    from reward_lens_spec.models.training_organism import PLANTED_STEP, eval_pairs, resolve

    monkeypatch.setenv("REWARD_LENS_SPEC_ORGANISMS", str(tmp_path_factory.getbasetemp() / "rls_organisms"))
    resolve("training")
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected,
                                        "dimension": p.dimension}) + "\n" for p in eval_pairs(n=30)))
    store = tmp_path / "ck.zarr"
    monkeypatch.chdir(tmp_path)
    try:
        main(["model=tiny_checkpoints", f"model.checkpoints.steps=[{','.join(map(str, STEPS))}]",
              "model.checkpoint=all", "observable=score", "dataset=jsonl", f"dataset.path={data}",
              f"store.url={store}"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    st = open_store(str(store))
    runs = sorted((st.provenance(r)["checkpoint"]["step"], r) for r in st.runs()["run_id"] if r.startswith("score-"))
    assert [s for s, _ in runs] == STEPS
    trig = {}
    for s, r in runs:                                         # the trigger pairs' margins, read independently
        v = st.load(r, "score", lazy=False)["margin"]
        trig[s] = v.sel(pair=sorted(p for p in v["pair"].values if str(p).startswith("trigger"))).values
    # the planted feature (learned from step 100) moves the trigger margins by ~20 reward units in one interval;
    # before it they wander coherently by < 1 unit, which min_change = 2 declares irrelevant
    changes = {(a, b): trig[b] - trig[a] for a, b in zip(STEPS, STEPS[1:])}
    assert np.median(changes[(PLANTED_STEP, PLANTED_STEP + 20)]) > 5
    rid, ds, written = monitor(str(store), "score", statistic="margin", min_change=2.0, dimensions=["trigger"])
    assert written and ds.attrs["first_alarm"] == f"step{PLANTED_STEP} -> step{PLANTED_STEP + 20}"
    k = STEPS.index(PLANTED_STEP + 20)
    assert ds["alarm"].values[:k - 1].sum() == 0 and ds["alarm"].values[k - 1] == 1
    # the e-value of the planted interval, written out: every trigger pair's change bets up
    up = np.where(changes[(PLANTED_STEP, PLANTED_STEP + 20)] > 2.0, 1.0, -1.0)
    down = np.where(changes[(PLANTED_STEP, PLANTED_STEP + 20)] < -2.0, 1.0, -1.0)
    lams = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
    naive = 0.5 * (np.mean([np.prod(1 + lam * up) for lam in lams])
                   + np.mean([np.prod(1 + lam * down) for lam in lams]))
    assert float(ds["e_value"].values[k - 1]) == pytest.approx(naive, rel=1e-9)
    assert float(ds["threshold"].values[k - 1]) == pytest.approx(math.pi ** 2 * k ** 2 / (6 * 0.05))
    assert monitor_main([f"url={store}", "observable=score", "min_change=2", "dimensions=trigger"]) == 0
    out = capsys.readouterr().out
    assert f"first alarm: step{PLANTED_STEP} -> step{PLANTED_STEP + 20}" in out and "already stored" in out
    assert monitor_main([f"url={store}", "observable=score", "statistic=mean"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "statistic" in err[0]
