"""One path (issue 25): a run is composed, loaded, identified and executed in one place, on every route."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from reward_lens_spec import open_store
from reward_lens_spec.errors import SpecError
from reward_lens_spec.paths import conf_dir
from reward_lens_spec.run import compose_run, compute, execute
from reward_lens_spec.inputs import load_dataset, load_inputs, ops_view
from reward_lens_spec.planning import plan_for
from reward_lens_spec.run.identity import declared_fields

PKG = Path(__file__).resolve().parents[1] / "reward_lens_spec"
# the one module allowed to call each, besides where it is defined
ALLOWED = {"load_pairs": {"inputs.py", "data/loaders.py"},
           "encode_pairs": {"inputs.py", "models/formatting.py"},
           "from_pretrained": {"models/hub.py"}}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_inputs_are_loaded_in_one_place(name):
    call = re.compile(rf"(?<![\w.]){name}\(|\.{name}\(")
    callers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                     if any(call.search(line) and not line.lstrip().startswith(("def ", "#"))
                            for line in p.read_text(encoding="utf-8").splitlines()))
    assert set(callers) <= ALLOWED[name], f"{name} called outside {sorted(ALLOWED[name])}: {callers}"


def test_no_second_executor():
    """Only run.stream runs a plan's steps: no other module loops ``step.op.run`` over a plan."""
    loops = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                   if re.search(r"\.op\.run\(", p.read_text(encoding="utf-8")))
    assert loops == ["run/stream.py"], loops


# -- every shipped observable, through the one executor -----------------------------------------
OBSERVABLES = sorted(str(p.relative_to(conf_dir() / "observable").with_suffix(""))
                     for p in (conf_dir() / "observable").rglob("*.yaml"))
NEEDS = {   # the model / data a YAML's header names, where the default lacks it
    "armorm": ["model=tiny_gated"], "objectives": ["model=tiny_gated"], "scalar_cost": ["model=tiny_gated"],
    "examples/gated_scalar_cost": ["model=tiny_gated"],
    "implicit": ["model=tiny_implicit"], "implicit_lens": ["model=tiny_implicit"],
    "implicit_patch": ["model=tiny_implicit", "observable.pairs=2"], "ensemble": ["model=tiny_ensemble"],
    "implicit_rewardbench": ["model=tiny_implicit"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", OBSERVABLES)
def test_every_shipped_observable_runs_streamed_and_in_memory_alike(name, tmp_path):
    """Each YAML under conf/observable runs through ``execute`` (streamed into a store) on the model its
    header names, or is refused with a Fix line; in memory (``compute``) it gives the same bits."""
    try:
        run, yaml_text = compose_run([f"observable={name}", "dataset.limit=8", *NEEDS.get(name, [])])
        out = execute(run, resolved_yaml=yaml_text, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                      progress=False)
    except SpecError as exc:
        assert "Fix:" in str(exc), str(exc)
        return
    assert out.status == "complete" and out.result is not None
    plan, info = plan_for(run)
    inp = load_inputs(run)
    m = run.model
    mem, _, _ = compute(inp.lm, inp.pairs, plan, info, fmt=m.format.value, template=m.template,
                        max_length=m.max_length, batch_size=m.batch_size, padding_side=m.padding_side.value)
    assert set(mem.data_vars) == set(out.result.data_vars)
    for v in mem.data_vars:
        a, b = np.asarray(mem[v].values), np.asarray(out.result[v].values)
        assert a.shape == b.shape and a.dtype == b.dtype, v
        if a.dtype.kind == "f":
            assert np.array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8)), v   # bits
        else:
            assert (a == b).all(), v


def test_steer_along_a_reduction_runs_streamed_in_chunks(tmp_path):
    """examples/steer_dose_response crashed on the streamed path (a reduce-stage step that needs the model):
    now a later pass captures again; chunked and one-chunk runs agree."""
    got = {}
    for chunk in (3, 64):
        run, y = compose_run(["observable=examples/steer_dose_response", "dataset.limit=6",
                              f"store.chunk_pairs={chunk}", f"store.url={tmp_path}/c{chunk}.zarr"])
        out = execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=f"{tmp_path}/c{chunk}.zarr",
                      progress=False)
        got[chunk] = out.result
    # steering reads every pair's RMS: the run is one chunk whatever store.chunk_pairs says, so bits agree
    for v in got[64].data_vars:
        np.testing.assert_array_equal(got[3][v].values, got[64][v].values, err_msg=v)
    assert np.isfinite(got[64]["steer_slope"].values).all()


# -- identity: exactly what the numbers depend on --------------------------------------------------
def _pairs_file(path: Path, positions, extra=None):
    rows = [{"id": f"p{i}", "prompt": f"Question {i}?", "chosen": f"A good answer {i}.", "rejected": f"No {i}.",
             "chosen_position": pos, **(extra or {})} for i, pos in enumerate(positions)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _run(tmp_path, obs, path, url):
    run, y = compose_run([f"observable={obs}", "dataset=jsonl", f"dataset.path={path}"])
    return execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=url, progress=False)


def test_a_declared_field_is_in_the_identity_and_an_undeclared_one_is_not(tmp_path):
    url = str(tmp_path / "s.zarr")
    a = _run(tmp_path, "confounders", _pairs_file(tmp_path / "a.jsonl", [1, 1, 1, 1]), url)
    b = _run(tmp_path, "confounders", _pairs_file(tmp_path / "b.jsonl", [1, 1, 2, 1]), url)
    assert a.run_id != b.run_id and not b.reused                  # confounders reads chosen_position
    st = open_store(url)
    pa, pb = (np.asarray(st.load(r.run_id, "confounders", lazy=False)["chosen_position"].values)
              for r in (a, b))
    assert (pa != pb).sum() == 1                                   # pair p2's position, read from its own file
    c = _run(tmp_path, "confounders", _pairs_file(tmp_path / "c.jsonl", [1, 1, 1, 1], {"note": "x"}), url)
    assert c.run_id == a.run_id and c.reused                       # an extra key no operator reads
    s1 = _run(tmp_path, "score", _pairs_file(tmp_path / "d.jsonl", [1, 1, 1, 1]), url)
    s2 = _run(tmp_path, "score", _pairs_file(tmp_path / "e.jsonl", [2, 2, 2, 2]), url)
    assert s1.run_id == s2.run_id and s2.reused                    # score reads no chosen_position


def test_operators_see_only_their_declared_fields():
    from reward_lens_spec.data.pairs import Pair
    p = Pair("a", "q", "c", "r", rubric="rb", source="src", meta=(("chosen_position", 2), ("note", "x")))
    (v,) = ops_view([p], ("chosen_position",))
    assert v.meta == (("chosen_position", 2),) and v.rubric == "" and v.source == ""
    run, _ = compose_run(["observable=confounders"])
    assert "chosen_position" in declared_fields(plan_for(run)[0])


# -- every route reads the same config the same way --------------------------------------------------
def _rewardbench_file(tmp_path):
    rows = [{"id": f"r{k}", "prompt": f"Q{k}?", "chosen": f"Yes {k}", "rejected": "no"} for k in range(6)]
    path = tmp_path / "rb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_the_study_pins_the_subset_its_run_reads(tmp_path):
    from reward_lens_spec.trust.pins import pins

    path = _rewardbench_file(tmp_path)
    run, y = compose_run(["observable=score", "dataset=rewardbench", f"dataset.path={path}",
                          "dataset.subset=mt-bench-easy"])
    pinned = pins(run, str(tmp_path))["dataset_checksum"]        # rows naming no subset get this one
    whole = load_dataset(compose_run(["dataset=rewardbench", f"dataset.path={path}"])[0].dataset)
    assert pinned == load_dataset(run.dataset).checksum != whole.checksum
    out = execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"), progress=False)
    assert open_store(str(tmp_path / "s.zarr")).provenance(out.run_id)["dataset_checksum"] == pinned


def test_freeze_sees_the_users_config_folder(tmp_path, monkeypatch):
    from reward_lens_spec.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REWARD_LENS_SPEC_CONFIG_PATH", raising=False)
    (tmp_path / "mine" / "experiment").mkdir(parents=True)
    text = (conf_dir() / "experiment" / "example_dla_mlp.yaml").read_text(encoding="utf-8")
    (tmp_path / "mine" / "experiment" / "my_study.yaml").write_text(text.replace("name: example_dla_mlp",
                                                                                  "name: my_study"))
    with pytest.raises(SystemExit) as ok:
        main(["freeze", "--config-dir", str(tmp_path / "mine"), "experiment=my_study", "store.url=s.zarr"])
    assert ok.value.code == 0
    assert any(r.startswith("study-my_study") for r in open_store(str(tmp_path / "s.zarr")).runs(
        observable="study").run_id)


def test_compose_run_refuses_like_the_app():
    with pytest.raises(SpecError, match="hydra.job.env_set"):
        compose_run(["hydra.job.env_set.X=1"])
    with pytest.raises(SpecError, match="(?i)did you mean"):
        compose_run(["model=tiny_lama"])


def test_fit_identity_covers_the_template(tmp_path):
    from reward_lens_spec.fit.cli import main

    rows = [{"id": f"k{i}", "prompt": f"Tell me about item {i}.", "chosen": f"a great thing {i}",
             "rejected": f"a thing {i}"} for i in range(12)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ids = []
    for k, template in enumerate(("Q: {prompt} A: {response}", "{prompt}|{response}")):
        assert main(["model=tiny", "dataset=jsonl", f"dataset.path={path}", f"out={tmp_path}/ck{k}",
                     f"store.url={tmp_path}/s.zarr", f"model.template='{template}'", "fit.n_boot=20",
                     "fit.progress=false", "fit.verify_pairs=2"]) == 0
        ids.append(set(open_store(f"{tmp_path}/s.zarr").runs().run_id))
    assert len(ids[0]) == 1 and len(ids[1]) == 2          # a second run, not the first one replaced
