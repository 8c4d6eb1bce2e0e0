"""Drift over a checkpoint sequence (issue 29 item 1): CKA and Procrustes against naive formulas, and the
training organism's planted step located by a sweep (one multirun, one store) read back by ``drift``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats

from reward_lens_spec.compare.similarity import linear_cka, procrustes_residual
from reward_lens_spec.errors import SpecError


@pytest.fixture
def organisms(tmp_path_factory, monkeypatch):
    """The training organism, trained once per test session into a shared folder."""
    from reward_lens_spec.models.training_organism import resolve

    monkeypatch.setenv("REWARD_LENS_SPEC_ORGANISMS", str(tmp_path_factory.getbasetemp() / "rls_organisms"))
    return resolve("training")


def _naive_cka(X, Y):
    """HSIC form with the centring matrix H (Kornblith et al. 2019, eq. for linear kernels), written out."""
    n = X.shape[0]
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = X @ X.T, Y @ Y.T
    hsic = lambda A, B: np.trace(A @ H @ B @ H)          # noqa: E731
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def _rotation(d, seed):
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q


def test_cka_is_one_on_identical_and_invariant_to_rotation_and_scale():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 8))
    Y = rng.normal(size=(50, 8)) + 0.5 * X
    assert linear_cka(X, X) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(X, Y) == pytest.approx(_naive_cka(X, Y), rel=1e-10)
    assert linear_cka(X, 3.7 * Y @ _rotation(8, 1) + 2.0) == pytest.approx(linear_cka(X, Y), rel=1e-10)
    Z = rng.normal(size=(50, 5))                                  # another width
    assert linear_cka(X, Z) == pytest.approx(_naive_cka(X, Z), rel=1e-10)
    assert 0 < linear_cka(X, Y) < 1


def test_procrustes_residual_is_zero_for_a_rotated_copy_and_matches_the_svd_formula():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 6))
    assert procrustes_residual(X, 0.3 * X @ _rotation(6, 2) - 1.0) == pytest.approx(0.0, abs=1e-10)
    Y = rng.normal(size=(40, 6))
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    Xc, Yc = Xc / np.linalg.norm(Xc), Yc / np.linalg.norm(Yc)
    naive = np.sqrt(2 - 2 * np.linalg.svd(Xc.T @ Yc, compute_uv=False).sum())   # min_R ‖XR − Y‖ by hand
    assert procrustes_residual(X, Y) == pytest.approx(naive, rel=1e-10)
    with pytest.raises(SpecError, match="same rows"):
        procrustes_residual(X, Y[:10])


# -- the training organism, swept and read back ---------------------------------------------------
STEPS = [60, 80, 100, 120, 140]       # around the planted step (100)


@pytest.fixture
def swept(organisms, tmp_path, monkeypatch):
    """One in-process multirun (Hydra's basic launcher) over five checkpoints into one store."""
    from reward_lens_spec.cli import main
    from reward_lens_spec.models.training_organism import eval_pairs

    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen,
                                        "rejected": p.rejected, "dimension": p.dimension}) + "\n"
                            for p in eval_pairs(n=20)))
    store = tmp_path / "ck.zarr"
    monkeypatch.chdir(tmp_path)                       # Hydra's sweep folder lands here
    try:
        main(["model=tiny_checkpoints", f"model.checkpoints.steps=[{','.join(map(str, STEPS))}]",
              "model.checkpoint=all", "observable=examples/checkpoint_dynamics", "dataset=jsonl",
              f"dataset.path={data}", f"store.url={store}"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    return store


def test_sweep_writes_one_run_per_checkpoint_and_drift_locates_the_planted_step(swept, capsys):
    from reward_lens_spec import open_store
    from reward_lens_spec.compare.drift import DriftParams, drift, main as drift_main

    st = open_store(str(swept))
    runs = [r for r in st.runs()["run_id"] if str(r).startswith("checkpoint_dynamics-")]
    assert len(runs) == len(STEPS)
    recs = sorted((st.provenance(r)["checkpoint"] for r in runs), key=lambda c: c["index"])
    assert [c["step"] for c in recs] == STEPS and [c["index"] for c in recs] == list(range(len(STEPS)))
    assert len({c["chain_sha256"] for c in recs}) == len(STEPS)
    assert recs[-1]["digests"][:-1] == recs[-2]["digests"]                     # one chain

    rid, ds, written = drift(str(swept), "checkpoint_dynamics", params=DriftParams(n_null=200, n_boot=50))
    assert written and list(ds["step"].values) == STEPS
    m = {r: st.load(r, "checkpoint_dynamics", lazy=False)["margin"].values.reshape(-1) for r in runs}
    by_step = {st.provenance(r)["checkpoint"]["step"]: m[r] for r in runs}
    # independent: accuracy, mean margin and Spearman from the stored margins, by hand / scipy
    for i, s in enumerate(STEPS):
        assert ds["accuracy"].values[i] == pytest.approx(np.mean(by_step[s] > 0))
        assert ds["mean_margin"].values[i] == pytest.approx(by_step[s].mean())
    rho = scipy.stats.spearmanr(by_step[STEPS[1]], by_step[STEPS[2]]).statistic
    assert ds["margin_spearman"].sel(reference="previous").values[2] == pytest.approx(rho)
    assert np.isnan(ds["cka"].sel(reference="previous").values[0])
    assert ds["cka"].sel(reference="last").values[-1] != ds["cka"].sel(reference="last").values[-1]   # NaN
    # the planted feature is learned from step 100 on: the trigger pairs' mean margin (by hand) jumps right after
    # it, and the drift instruments put their largest change in that same interval
    trig = np.array([str(p).startswith("trigger") for p in st.load(runs[0], "checkpoint_dynamics",
                                                                   lazy=False)["margin"]["pair"].values])
    mean_trig = [by_step[s][trig].mean() for s in STEPS]
    jump = int(np.argmax(np.diff(mean_trig))) + 1
    assert (STEPS[jump - 1], STEPS[jump]) == (100, 120), mean_trig
    for name in ("mean_margin", "cka", "procrustes_residual", "margin_spearman"):
        assert ds.attrs["largest_change"][name] == "step100 -> step120", (name, ds.attrs["largest_change"])
    # reused, not recomputed; the command prints it
    assert drift(str(swept), "checkpoint_dynamics", params=DriftParams(n_null=200, n_boot=50))[2] is False
    assert drift_main([f"url={swept}", "observable=checkpoint_dynamics", "n_null=200", "n_boot=50"]) == 0
    assert "largest change of mean_margin: step100 -> step120" in capsys.readouterr().out


def test_drift_refuses_a_store_without_a_sequence(tmp_path):
    from reward_lens_spec.compare.drift import drift

    from reward_lens_spec.store import Backend
    from reward_lens_spec.store.layout import check_layout

    url = str(tmp_path / "empty.zarr")
    check_layout(Backend(url), create=True)
    with pytest.raises(SpecError, match="no complete run") as err:
        drift(url, "checkpoint_dynamics")
    assert "model.checkpoint=all" in str(err.value)
