"""Outputs whose width depends on the data (issue 37 Deliver 2): PRM steps and response positions are sized over
every pair before the first chunk is written, so a run of many chunks equals a run of one; shorter rows are
NaN-padded; a run that broke on the old first-chunk skeleton is rerun into a fresh attempt."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec import open_store
from reward_lens_spec.data import Pair
from reward_lens_spec.errors import SpecError, StoreError
from reward_lens_spec.kinds.prm.organism import TEMPLATE
from reward_lens_spec.observables import load_observable
from reward_lens_spec.ops.base import PlanInfo
from reward_lens_spec.paths import conf_dir
from reward_lens_spec.planning import data_widths
from reward_lens_spec.registry import build_plan
from reward_lens_spec.run import compose_run, execute
from reward_lens_spec.run import stream as stream_mod
from reward_lens_spec.inputs import encode, load_lm
from reward_lens_spec.run.stream_arrays import pad_widths
from reward_lens_spec.spec import StoreSpec
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.layout import check_layout

# chunk 0 (one pair) has 1 step and short responses; later chunks have more steps and longer responses
PAIRS = [Pair(id="short", prompt="1 + 1?", chosen="x = 2\n", rejected="x = 3\n"),
         Pair(id="three", prompt="2 + 2?", chosen="Add.\nCarry none.\nx = 4\n", rejected="Guess.\nx = 5"),
         Pair(id="long", prompt="3 + 4?", chosen="Start from 3.\nAdd 4 to it.\nCount on.\nCheck.\nx = 7",
              rejected="Add 3 and 4 and write down what comes out.\nx = 13")]


@pytest.fixture(scope="module")
def prm_lm():
    run, _ = compose_run(["model=tiny_prm", "dataset.limit=1"])
    return load_lm(run.model)


def _plan(lm, name):
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=1, objectives=("reward",), model_name=lm.name)
    return build_plan(load_observable(name), info, load_observable), info


def _stream(lm, plan, info, url, chunk):
    """The streamed executor into a fresh local store; returns (stored Dataset, provenance)."""
    enc = encode(lm, PAIRS, template=TEMPLATE)
    b = Backend(url)
    check_layout(b, create=True)
    out = stream_mod.stream(b, "r", lm, PAIRS, enc, plan, info, capture_kw=dict(batch_size=1), frame=None,
                            store_spec=StoreSpec(chunk_pairs=chunk),
                            run_attrs=lambda counts, chunks, _, __: {"observables": [plan.observable],
                                                                     "chunks": chunks})
    assert out.status == "complete"
    st = open_store(url)
    return st.load("r", plan.observable, lazy=False), st.provenance("r")


def _assert_same(a: xr.Dataset, b: xr.Dataset) -> None:
    assert set(a.data_vars) == set(b.data_vars)
    for v in a.data_vars:
        assert a[v].dims == b[v].dims and a[v].shape == b[v].shape and a[v].attrs == b[v].attrs, v
        for c in a[v].coords:
            np.testing.assert_array_equal(a[v][c].values, b[v][c].values, err_msg=f"{v}.{c}")
        x, y = np.asarray(a[v].values), np.asarray(b[v].values)
        if x.dtype.kind == "f":             # other chunks batch other rows together: float rounding may differ
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=v)
            np.testing.assert_array_equal(np.isnan(x), np.isnan(y), err_msg=v)
        else:
            np.testing.assert_array_equal(x, y, err_msg=v)


@pytest.mark.slow
@pytest.mark.parametrize("name, dim, width", [("prm_steps", "step", 5), ("prefix", "position", None)])
def test_three_chunks_of_different_widths_equal_one_chunk(prm_lm, name, dim, width, tmp_path):
    """Chunk 0 holds 1 step (and the shortest responses), a later one 5: every chunk writes rows of the run's
    width, NaN past each row's own length, and the widths are recorded in the run's ``chunks`` attrs."""
    plan, info = _plan(prm_lm, name)
    many, prov = _stream(prm_lm, plan, info, str(tmp_path / "c1.zarr"), 1)
    one, prov1 = _stream(prm_lm, plan, info, str(tmp_path / "c3.zarr"), 3)
    assert prov["chunks"]["n"] == 3 and prov1["chunks"]["n"] == 1
    _assert_same(many, one)
    enc = encode(prm_lm, PAIRS, template=TEMPLATE)
    if width is None:                        # the longest response: counted independently from the token ids
        starts = [len(prm_lm.tokenizer(TEMPLATE.format(prompt=p.prompt, response=""))["input_ids"]) for p in PAIRS]
        width = max(len(ids) - st for c, r, st in zip(enc.chosen, enc.rejected, starts) for ids in (c, r))
    assert prov["chunks"]["widths"] == {dim: width} == prov1["chunks"]["widths"]
    for v in plan.outputs:
        if dim in many[v].dims:
            assert many[v].sizes[dim] == width and "NaN past" in many[v].attrs["padding"], v
    if name == "prm_steps":
        n = many["step_reward"]["n_steps"].values
        assert n[0].tolist() == [1, 1] and n.max() == 5
        steps = many["step_reward"].values
        assert all(np.isfinite(steps[i, s, :n[i, s]]).all() and np.isnan(steps[i, s, n[i, s]:]).all()
                   for i in range(3) for s in range(2))


@pytest.mark.slow
def test_a_run_broken_by_a_first_chunk_skeleton_reruns_into_a_fresh_attempt(prm_lm, tmp_path, monkeypatch):
    """The old executor sized ``step`` from the first chunk (here: widths not planned), broke on the next chunk
    and left an attempt behind; the rerun must not resume into that skeleton (its widths differ), and gives the
    numbers of a clean run."""
    plan, info = _plan(prm_lm, "prm_steps")
    url = str(tmp_path / "s.zarr")
    first_chunk = lambda plan, ctx: data_widths(plan, replace(ctx, encoded=stream_mod.subset(ctx.encoded,  # noqa: E731
                                                                                              slice(0, 1))))
    monkeypatch.setattr(stream_mod, "data_widths", first_chunk, raising=False)
    with pytest.raises((ValueError, StoreError)):
        _stream(prm_lm, plan, info, url, 1)
    monkeypatch.undo()
    again, _ = _stream(prm_lm, plan, info, url, 1)
    clean, _ = _stream(prm_lm, plan, info, str(tmp_path / "clean.zarr"), 1)
    _assert_same(again, clean)


def test_a_chunk_wider_than_planned_is_refused_not_cut():
    """An operator whose ``width`` under-reports its own rows: one line naming the step, never a silent cut."""
    v = xr.DataArray(np.ones((2, 3)), dims=("pair", "step"), coords={"step": np.arange(3)})
    with pytest.raises(StoreError, match="observable o, step s: a chunk holds 3 along 'step', more than the 2"):
        pad_widths(v, {"step": 2}, "observable o, step s")
    padded = pad_widths(v, {"step": 5}, "w")
    assert padded["step"].values.tolist() == [0, 1, 2, 3, 4] and np.isnan(padded.values[:, 3:]).all()
    with pytest.raises(StoreError, match="values are int64, not floats"):
        pad_widths(v.astype("int64"), {"step": 5}, "w")


# -- every shipped observable over >= 3 chunks, through execute (the CLI's path) ---------------------------
OBSERVABLES = sorted(str(p.relative_to(conf_dir() / "observable").with_suffix(""))
                     for p in (conf_dir() / "observable").rglob("*.yaml"))
NEEDS = {   # the model a YAML's header names, where the default lacks it (as tests/test_one_path.py)
    "armorm": ["model=tiny_gated"], "objectives": ["model=tiny_gated"], "scalar_cost": ["model=tiny_gated"],
    "examples/gated_scalar_cost": ["model=tiny_gated"], "implicit": ["model=tiny_implicit"],
    "implicit_lens": ["model=tiny_implicit"], "implicit_patch": ["model=tiny_implicit", "observable.pairs=2"],
    "ensemble": ["model=tiny_ensemble"], "implicit_rewardbench": ["model=tiny_implicit"],
    "prm_steps": ["model=tiny_prm"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", OBSERVABLES)
def test_every_shipped_observable_streams_in_three_chunks_as_in_one(name, tmp_path):
    """6 built-in pairs in chunks of 2 (3 chunks, batch size 1) equal the same run in one chunk, variable by
    variable; a YAML this setup cannot run is refused with a Fix line."""
    outs = {}
    for chunk in (2, 6):
        try:
            run, text = compose_run([f"observable={name}", "dataset.limit=6", f"store.chunk_pairs={chunk}",
                                     "model.batch_size=1", "model.threads=1", *NEEDS.get(name, [])])
            out = execute(run, resolved_yaml=text, base_dir=str(tmp_path), progress=False,
                          store_url=str(tmp_path / f"c{chunk}.zarr"))
        except SpecError as exc:
            assert "Fix:" in str(exc), str(exc)
            return
        assert out.status == "complete"
        prov = open_store(str(tmp_path / f"c{chunk}.zarr")).provenance(out.run_id)
        outs[chunk] = (out.result, prov["chunks"]["n"])
    one_chunk_only = any(s.op.needs_all_pairs for s in out.plan.steps)    # mean ablation: one chunk by design
    assert outs[2][1] == (1 if one_chunk_only else 3) and outs[6][1] == 1
    _assert_same(outs[2][0], outs[6][0])


@pytest.mark.slow
def test_store_verify_recomputes_a_sample_narrower_than_the_run(tmp_path):
    """``store verify recompute=K`` re-executes K sampled pairs alone: their ``step`` width is the sample's, not
    the run's, and is padded to the stored width before comparing (the old code crashed broadcasting)."""
    import json

    from reward_lens_spec.trust.recompute import recompute_run

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected})
                            + "\n" for p in PAIRS))
    run, text = compose_run(["model=tiny_prm", "observable=prm_steps", "dataset=jsonl", f"dataset.path={path}"])
    out = execute(run, resolved_yaml=text, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"), progress=False)
    n = out.result["step_reward"]["n_steps"].values
    assert out.result["step_reward"].sizes["step"] == n.max() > n.min()
    for seed in range(3):
        ok, detail = recompute_run(open_store(str(tmp_path / "s.zarr")), out.run_id, 1, base_dir=str(tmp_path),
                                   seed=seed)
        assert ok is True and "step_reward max|Δ|" in detail, detail
