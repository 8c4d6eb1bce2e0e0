"""Interventions as artifacts (issue 40, item 4): ``reward-lens-spec export`` writes a steering vector, a LEACE
eraser or a fitted head from a stored run as safetensors + provenance JSON; ``model.interventions`` loads them so
an erased or steered reward model runs every observable through the one executor.

Checked here: the export equals the stored arrays bit for bit; an erased and a steered model's rewards equal a
naive float64 computation by our own hook on a plain model (P = I − Eᵀ applied by hand, one unpadded sequence at
a time); a head artifact gives the fit's margins; RewardBench on the erased model is stored beside the original's
in one store (examples/tiny_erased.yaml, run through the CLI in this process); a changed artifact file gives a
different run id and is never reused; hostile inputs (a pickle, a pickle named .safetensors, a tampered file, a
wrong width, an unknown site) are refused in one line naming the key, and the pickle never runs.
"""
from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from reward_lens_spec.cli import main
from reward_lens_spec.errors import SpecError
from reward_lens_spec.paths import ENV
from reward_lens_spec.store import open_store

ROOT = Path(__file__).resolve().parents[1]
DIRECTION_OBS = ("name: direction\nversion: 1\nsteps:\n  - {name: resid, op: capture, site: resid_post}\n"
                 "  - {name: dir, op: mean_direction, input: resid}\noutputs: [dir]\n")


def run_cli(argv) -> int:
    """``main(argv)`` in this process; its exit status (0 when it returns)."""
    try:
        main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def refused(capsys, argv, key: str) -> str:
    """``main(argv)`` exits 2 with exactly one error line naming ``key``."""
    capsys.readouterr()
    code = run_cli(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], err
    return lines[0]


def only_run(url, observable: str, model: str | None = None) -> str:
    runs = open_store(str(url)).runs()
    ids = [r for r, obs, m in zip(runs["run_id"], runs["observables"], runs["model"])
           if observable in obs and (model is None or m == model)]
    assert len(ids) == 1, (observable, model, list(runs["run_id"]))
    return ids[0]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One store with a ``leace_eraser`` run and a ``mean_direction`` run on tiny, a ``fit`` run (head), and the
    three artifacts exported from them (in the store's folder)."""
    import os
    d = tmp_path_factory.mktemp("artifacts")
    old = os.getcwd()
    os.chdir(d)
    try:
        (d / "direction.yaml").write_text(DIRECTION_OBS)
        assert run_cli(["observable=examples/leace_eraser", "dataset.limit=40", "store.url=s.zarr"]) == 0
        assert run_cli([f"observable={d / 'direction.yaml'}", "dataset.limit=12", "store.url=s.zarr"]) == 0
        from test_fit import planted_rows
        (d / "planted.jsonl").write_text("".join(json.dumps(r) + "\n" for r in planted_rows(20)))
        assert run_cli(["fit", "model=tiny", "dataset=jsonl", "dataset.path=planted.jsonl", "out=ckpt",
                        "store.url=s.zarr", "fit.n_boot=50", "fit.progress=false", "fit.verify_pairs=4"]) == 0
        ids = {o: only_run(d / "s.zarr", o) for o in ("leace_eraser", "direction", "fit_report")}
        assert run_cli(["export", "url=s.zarr", f"run={ids['leace_eraser']}", "what=erase",
                        "out=eraser.safetensors"]) == 0
        assert run_cli(["export", "url=s.zarr", f"run={ids['direction']}", "what=steer", "layer=1",
                        "out=steer.safetensors"]) == 0
        assert run_cli(["export", "url=s.zarr", f"run={ids['fit_report']}", "what=head",
                        "out=head.safetensors"]) == 0
    finally:
        os.chdir(old)
    return d, ids


@pytest.fixture
def here(made, monkeypatch):
    d, _ = made
    monkeypatch.chdir(d)
    monkeypatch.setenv(ENV, "")
    monkeypatch.setattr(sys, "argv", ["reward-lens-spec"])
    return d


# ----------------------------------------------------------------------------- export

@pytest.mark.slow
def test_export_equals_the_stored_arrays_bit_for_bit(made):
    d, ids = made
    store = open_store(str(d / "s.zarr"))
    eraser = store.load(ids["leace_eraser"], "leace_eraser", lazy=False)
    direction = store.load(ids["direction"], "direction", lazy=False)["dir"].sel(layer=1)
    head = store.load(ids["fit_report"], "fit_report", lazy=False)["head_weight"]
    for name, want in (("eraser", {"mean": eraser["eraser_mean"].values, "projection": eraser["eraser_projection"].values}),
                       ("steer", {"vector": direction.values}), ("head", {"weight": head.values})):
        got = load_file(str(d / f"{name}.safetensors"))
        assert set(got) == set(want)
        for k, v in want.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes(), (name, k)
        prov = json.loads((d / f"{name}.json").read_text())
        run = {"eraser": ids["leace_eraser"], "steer": ids["direction"], "head": ids["fit_report"]}[name]
        assert prov["source"]["run_id"] == run and prov["source"]["model_fingerprint"] == \
            store.provenance(run)["model_fingerprint"]
        import hashlib
        assert prov["sha256"] == hashlib.sha256((d / f"{name}.safetensors").read_bytes()).hexdigest()
    # the fitted head is the checkpoint's own score row, as saved (float32)
    from safetensors.numpy import load_file as lf
    ckpt = lf(str(d / "ckpt" / "model.safetensors"))
    row = next(v for k, v in ckpt.items() if k.startswith("score."))
    assert np.array_equal(row[0], load_file(str(d / "head.safetensors"))["weight"])


# ----------------------------------------------------------------------------- naive computations

def naive_rewards(pairs, transform, layer: int):
    """Rewards (pair, side) float64 of the plain built-in tiny model with ``transform`` (float64 → float64)
    applied by our own forward hook to decoder layer ``layer``'s output at every position; one unpadded
    sequence at a time, the readout the last token (the tokens from the project's encoder, the input only)."""
    import torch

    from reward_lens_spec.models.formatting import encode_pairs
    from reward_lens_spec.models.tiny import build_tiny

    model, tok = build_tiny("tiny")
    model.eval()
    enc = encode_pairs(tok, list(pairs), model_name="tiny", fmt="plain",
                       template="User: {prompt}\nAssistant: {response}", max_length=512)

    def hook(mod, args, out):
        x = out[0] if isinstance(out, tuple) else out
        y = torch.as_tensor(transform(x.detach().double().numpy()), dtype=x.dtype)
        return (y,) + tuple(out[1:]) if isinstance(out, tuple) else y
    h = model.model.layers[layer].register_forward_hook(hook)
    try:
        out = np.zeros((len(enc.pair_ids), 2))
        with torch.no_grad():
            for i in range(len(enc.pair_ids)):
                for s, seq in enumerate((enc.chosen[i], enc.rejected[i])):
                    ids = torch.tensor([list(seq)])
                    out[i, s] = float(model(input_ids=ids).logits[0, 0])
    finally:
        h.remove()
    return enc.pair_ids, out


def executed(tmp, model_node: dict, limit: int = 6, observable: str = "score"):
    """The ``reward`` output (pair × side) of ``observable`` run through the one executor on ``model_node``."""
    from reward_lens_spec.run import execute
    from reward_lens_spec.run.compose import compose_run

    items = ",".join("{" + ", ".join(f"{k}: {v}" for k, v in e.items()) + "}" for e in model_node["interventions"])
    run, y = compose_run([f"observable={observable}", f"dataset.limit={limit}", f"model.interventions=[{items}]"])
    out = execute(run, resolved_yaml=y, base_dir=str(tmp), store_url=str(tmp / "n.zarr"), progress=False)
    return out


@pytest.mark.slow
def test_an_erased_model_scores_as_a_naive_float64_erasure_by_hand(here):
    from reward_lens_spec.data import load_pairs
    t = load_file("eraser.safetensors")
    E, mu = t["projection"], t["mean"]
    P = np.eye(len(mu)) - E.T                                    # r(x) = x P + μ Eᵀ, written out by hand
    ids, want = naive_rewards(load_pairs("diagnostic", limit=6), lambda x: x @ P + mu @ E.T, layer=0)
    out = executed(here, {"interventions": [{"kind": "erase", "path": "eraser.safetensors", "site": "resid_post.0"}]})
    got = out.result["reward"].sel(pair=list(ids)).transpose("pair", "side").values.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    _, plain = naive_rewards(load_pairs("diagnostic", limit=6), lambda x: x, layer=0)
    assert np.abs(plain - want).max() > 1e-3                     # the erasure changes the score


@pytest.mark.slow
def test_a_steered_model_scores_as_a_naive_float64_shift_by_hand(here):
    from reward_lens_spec.data import load_pairs
    v = load_file("steer.safetensors")["vector"].astype(np.float64)
    ids, want = naive_rewards(load_pairs("diagnostic", limit=6), lambda x: x + 2.5 * v, layer=1)
    out = executed(here, {"interventions": [{"kind": "steer", "path": "steer.safetensors", "site": "resid_post.1",
                                             "alpha": 2.5}]})
    got = out.result["reward"].sel(pair=list(ids)).transpose("pair", "side").values.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    _, plain = naive_rewards(load_pairs("diagnostic", limit=6), lambda x: x, layer=1)
    assert np.abs(plain - want).max() > 1e-3                     # the shift changes the score
    assert out.provenance is None and not out.reused
    prov = open_store(str(here / "n.zarr")).provenance(out.run_id)
    assert prov["identities"] and all(r["max_abs_err"] <= 1e-5 * max(1.0, r["scale"]) for r in prov["identities"])


@pytest.mark.slow
def test_a_head_artifact_gives_the_fitted_checkpoints_margins(here):
    """The fitted head applied to the built-in tiny (the fit's backbone) scores as the saved checkpoint does."""
    from reward_lens_spec.run import execute
    from reward_lens_spec.run.compose import compose_run

    run, y = compose_run(["dataset.limit=6", "model.interventions=[{kind: head, path: head.safetensors}]"])
    a = execute(run, resolved_yaml=y, base_dir=str(here), store_url=str(here / "h.zarr"), progress=False)
    run, y = compose_run(["dataset.limit=6", f"model.source={here / 'ckpt'}"])
    b = execute(run, resolved_yaml=y, base_dir=str(here), store_url=str(here / "h.zarr"), progress=False)
    assert np.abs(a.result["margin"].values - b.result["margin"].values).max() <= 1e-5


# ----------------------------------------------------------------------------- the example: RewardBench

@pytest.mark.slow
def test_rewardbench_of_the_erased_model_is_stored_beside_the_originals(here, tmp_path):
    import gzip
    rows = gzip.open(ROOT / "tests" / "data" / "llmbar_rewardbench_subsets.jsonl.gz", "rt").read().splitlines()[:24]
    (here / "rb.jsonl").write_text("\n".join(rows) + "\n")
    url = tmp_path / "rb.zarr"
    common = ["observable=rewardbench", "dataset=rewardbench", "dataset.path=rb.jsonl", f"store.url={url}"]
    assert run_cli(common) == 0
    assert run_cli([f"model={ROOT / 'examples' / 'tiny_erased.yaml'}"] + common) == 0
    store = open_store(str(url))
    orig, erased = only_run(url, "rewardbench", "tiny"), only_run(url, "rewardbench", "tiny_erased")
    a = store.load(orig, "rewardbench", lazy=False)
    b = store.load(erased, "rewardbench", lazy=False)
    sa, sb = float(a["rewardbench_score"].sel(bound="estimate")), float(b["rewardbench_score"].sel(bound="estimate"))
    # accuracy by hand from each run's own margins (subsets of one section: the plain fraction)
    for res, s in ((a, sa), (b, sb)):
        m = res["margin"].values
        assert s == pytest.approx(float(np.mean(np.where(m > 0, 1.0, np.where(m == 0, 0.5, 0.0)))), abs=1e-12)
    assert not np.array_equal(a["margin"].values, b["margin"].values)
    prov = store.provenance(erased)
    assert prov["model_fingerprint"] == store.provenance(orig)["model_fingerprint"]   # same weights; erased
    assert "interventions" in prov["config_yaml"] and "eraser.safetensors" in prov["config_yaml"]


# ----------------------------------------------------------------------------- identity

@pytest.mark.slow
def test_a_changed_artifact_file_is_a_new_run_never_reused(here, tmp_path):
    import shutil

    from reward_lens_spec.models.artifacts import write

    shutil.copy(here / "steer.safetensors", tmp_path / "v.safetensors")
    shutil.copy(here / "steer.json", tmp_path / "v.json")
    node = {"interventions": [{"kind": "steer", "path": str(tmp_path / "v.safetensors"), "site": "resid_post.1"}]}
    first = executed(tmp_path, node, limit=3)
    again = executed(tmp_path, node, limit=3)
    assert again.reused and again.run_id == first.run_id
    v = load_file(str(here / "steer.safetensors"))["vector"]
    write(tmp_path / "v.safetensors", "steer", {"vector": v * 2}, {"note": "a different vector, same path"})
    changed = executed(tmp_path, node, limit=3)
    assert changed.run_id != first.run_id and not changed.reused
    assert not np.array_equal(changed.result["reward"].values, first.result["reward"].values)
    # the same bytes at another path: the same run (paths are not in the identity)
    shutil.copy(tmp_path / "v.safetensors", tmp_path / "w.safetensors")
    shutil.copy(tmp_path / "v.json", tmp_path / "w.json")
    moved = executed(tmp_path, {"interventions": [{**node["interventions"][0], "path": str(tmp_path / "w.safetensors")}]},
                     limit=3)
    assert moved.run_id == changed.run_id


# ----------------------------------------------------------------------------- hostile inputs

class _Boom:
    def __reduce__(self):
        import os
        return (os.system, ("touch unpickled.marker",))


@pytest.mark.slow
def test_hostile_artifacts_are_refused_in_one_line_naming_the_key(here, capsys, tmp_path):
    import hashlib
    import shutil

    from reward_lens_spec.models.artifacts import write

    run = ["observable=score", "dataset.limit=2", f"store.url={tmp_path / 'x.zarr'}"]

    def iv(path, kind="erase", site="resid_post.0"):
        return f"model.interventions=[{{kind: {kind}, path: {path}, site: {site}}}]"
    # a pickle: by suffix, and as bytes named .safetensors with a provenance that matches them
    (tmp_path / "e.pt").write_bytes(pickle.dumps(_Boom()))
    refused(capsys, [iv(tmp_path / "e.pt")] + run, "model.interventions.0.path")
    blob = pickle.dumps(_Boom())
    (tmp_path / "p.safetensors").write_bytes(blob)
    prov = json.loads((here / "eraser.json").read_text())
    (tmp_path / "p.json").write_text(json.dumps({**prov, "sha256": hashlib.sha256(blob).hexdigest()}))
    line = refused(capsys, [iv(tmp_path / "p.safetensors")] + run, "model.interventions.0.path")
    assert "not a safetensors file" in line
    assert not (here / "unpickled.marker").exists() and not (tmp_path / "unpickled.marker").exists()
    # a tampered file (one byte of the projection changed) fails its provenance digest
    shutil.copy(here / "eraser.json", tmp_path / "t.json")
    data = bytearray((here / "eraser.safetensors").read_bytes())
    data[-3] ^= 0x01
    (tmp_path / "t.safetensors").write_bytes(bytes(data))
    assert "provenance digest" in refused(capsys, [iv(tmp_path / "t.safetensors")] + run, "model.interventions.0.path")
    # no provenance file beside it
    shutil.copy(here / "eraser.safetensors", tmp_path / "alone.safetensors")
    refused(capsys, [iv(tmp_path / "alone.safetensors")] + run, "model.interventions.0.path")
    # the wrong width: an eraser of d_model 32 on the tiny model (64)
    write(tmp_path / "narrow.safetensors", "erase", {"mean": np.zeros(32), "projection": np.eye(32)}, {})
    assert "d_model 64" in refused(capsys, [iv(tmp_path / "narrow.safetensors")] + run, "model.interventions.0.path")
    # unknown sites, a layer out of range, a kind that is not one, a kind the file does not hold
    refused(capsys, [iv(here / "eraser.safetensors", site="resid_pre.0")] + run, "model.interventions.0.site")
    refused(capsys, [iv(here / "eraser.safetensors", site="resid_post.99")] + run, "model.interventions.0.site")
    refused(capsys, [iv(here / "eraser.safetensors", kind="ablate")] + run, "model.interventions.0.kind")
    refused(capsys, [iv(here / "eraser.safetensors", kind="steer")] + run, "model.interventions.0.path")
    assert not (tmp_path / "x.zarr").exists() or not open_store(str(tmp_path / "x.zarr")).runs()["run_id"].size


def test_export_arguments_are_checked_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["export", "url=s.zarr", "run=r", "what=ablate", "out=x.safetensors"], "what")
    refused(capsys, ["export", "url=s.zarr", "run=r", "what=steer"], "out")
    refused(capsys, ["export", "url=s.zarr", "run=r", "what=steer", "out=x.safetensors", "colour=red"], "colour")


def test_entry_form_is_checked_before_any_file_is_read():
    from reward_lens_spec.spec import validate
    for entry, key in (({"kind": "erase", "path": "e.bin", "site": "resid_post.0"}, "model.interventions.0.path"),
                       ({"kind": "head", "path": "h.safetensors", "site": "resid_post.0"}, "model.interventions.0.site"),
                       ({"kind": "erase", "path": "e.safetensors", "site": "resid_post.0", "alpha": 2.0},
                        "model.interventions.0.alpha")):
        with pytest.raises(SpecError) as e:
            validate({"model": {"interventions": [entry]}})
        assert str(e.value).startswith(key) and "\n" not in str(e.value)
    with pytest.raises(SpecError, match="^model.interventions"):
        validate({"model": {"kind": "judge", "source": "builtin:tiny_llama",
                            "interventions": [{"kind": "steer", "path": "v.safetensors", "site": "resid_post.0"}]}})
