"""Issue 30, what a new user is told: an attr no store can hold is refused before anything is written (naming
the observable, variable and key) and leaves nothing behind; success lines say what is true (a writer whose
attempt went while it stalled errs; a shard says what it did and what remains; shards of one launch that
disagree on ``store.shards`` are refused); a job's console block is one write naming the observable and the
model; a sweep without ``store.url`` writes one stable store, so its rerun reuses every run."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec.errors import SpecError, StoreError
from reward_lens_spec.ops.base import NoParams, Operator, need_dim, without
from reward_lens_spec.registry import OPERATORS, register
from reward_lens_spec.store import open_store

OBS = """name: {name}
version: 1
description: reward per side and a margin from a test-only operator
steps:
  - {{name: h, op: capture, site: readout}}
  - {{name: reward, op: project, input: h, direction: head, bias: true}}
  - {{name: m2, op: {op}, input: reward}}
outputs: [reward, m2]
"""


class _Margin(Operator):
    """test only: chosen − rejected (pair × objective); ``hook(ctx, out)`` runs before it returns."""

    per_pair = True
    Params = NoParams
    hook = None

    def out_dims(self, in_dims, info, where):
        need_dim(in_dims[0], "side", where, "chosen minus rejected")
        return without(in_dims[0], "side")

    def run(self, ctx, x):
        out = x.sel(side="chosen", drop=True) - x.sel(side="rejected", drop=True)
        out.attrs = {"units": "reward", "gauge": "invariant"}
        type(self).hook(ctx, out)
        return out


@pytest.fixture
def op():
    """Register a test-only operator (public ``registry.register``); the test sets its ``hook``."""
    cls = register(type("TestMargin", (_Margin,), {"name": "test_margin_hooked", "hook": staticmethod(
        lambda ctx, out: None)}))
    yield cls
    OPERATORS.pop(cls.name, None)


def _execute(tmp_path, *overrides, obs="hooked"):
    from reward_lens_spec.report.summary import print_summary
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run.executor import execute

    path = tmp_path / f"{obs}.yaml"
    path.write_text(OBS.format(name=obs, op="test_margin_hooked"))
    run, text = compose_run(["model=tiny", f"observable={path}", "dataset.limit=4",
                             f"store.url={tmp_path / 's.zarr'}", *overrides])
    buf = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(buf):
        warnings.simplefilter("ignore")
        out = execute(run, resolved_yaml=text, base_dir=str(tmp_path), store_url=run.store.url, progress=False)
        print_summary(out)
    return out, buf.getvalue()


def _left(url) -> list[str]:
    runs = Path(url) / "runs"
    return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.exists() else []


# ----------------------------------------------------------------------------- attrs no store can hold

def test_an_array_nested_in_a_variables_attrs_is_refused_before_the_skeleton_naming_variable_and_key(tmp_path, op):
    op.hook = staticmethod(lambda ctx, out: out.attrs.update(extra={"w": np.arange(3)}))
    with pytest.raises(StoreError) as e:
        _execute(tmp_path)
    msg = str(e.value)
    assert "observable hooked, variable 'm2' (operator test_margin_hooked): attr 'extra'['w'] holds array([0, 1, 2])" \
        in msg and "Fix:" in msg and ".tolist()" in msg
    assert _left(tmp_path / "s.zarr") == []                      # no runs/<id> folder, no attempt left behind
    st = open_store(str(tmp_path / "s.zarr"))
    assert len(st.runs()) == 0 and st.incomplete() == []


def test_a_top_level_numpy_attr_is_stored_as_xarray_writes_it(tmp_path, op):
    op.hook = staticmethod(lambda ctx, out: out.attrs.update(scale=np.float32(2.0), shape=np.arange(2)))
    out, _ = _execute(tmp_path)
    m2 = open_store(out.store_url).load(out.run_id, "hooked", lazy=False)["m2"]
    assert m2.attrs["scale"] == 2.0 and list(m2.attrs["shape"]) == [0, 1]


def test_write_run_refuses_an_array_nested_in_a_datasets_attrs_naming_the_key(tmp_path):
    from reward_lens_spec.store.writer import write_run

    ds = xr.Dataset({"margin": ("pair", np.arange(3.0))}, coords={"pair": ["a", "b", "c"]},
                    attrs={"fit": {"coef": np.ones(2)}})
    with pytest.raises(StoreError, match=r"observable obs: attr 'fit'\['coef'\] holds array\(\[1., 1.\]\)"):
        write_run(str(tmp_path / "s.zarr"), "r1", {"obs": ds}, {"note": "x"})
    assert _left(tmp_path / "s.zarr") == []


# ----------------------------------------------------------------------------- success lines say what is true

def test_a_writer_whose_attempt_went_while_it_ran_errs_instead_of_promising_a_listing(tmp_path, op):
    url = tmp_path / "s.zarr"
    calls = []

    def gc_while_stalled(ctx, out):          # what `store gc older_than=0` does to a writer seen dead
        calls.append(1)
        if len(calls) == 2:
            for run in (url / "_internal" / "attempts").iterdir():
                for att in run.glob("attempt-*"):
                    shutil.rmtree(att)

    op.hook = staticmethod(gc_while_stalled)
    with pytest.raises(StoreError, match=r"this job stored chunk\(s\) \[0\] but attempt .* no longer has them.*"
                                         r"Fix: run the same command again"):
        _execute(tmp_path, "store.chunk_pairs=2")
    assert len(open_store(str(url)).runs()) == 0


def test_shards_say_which_shard_is_done_and_what_remains_and_a_disagreeing_shard_is_refused(tmp_path, op):
    common = ("store.chunk_pairs=1", "store.launch=L1")
    first, text = _execute(tmp_path, *common, "store.shards=2", "store.shard=0")
    assert first.status == "shard_done"
    assert text.strip() == (f"run {first.run_id}: shard 0 of store.shards=2 done; 2 of 4 chunk(s) stored in "
                            f"{tmp_path / 's.zarr'}; 2 remain, for shard(s) 1: the run is listed once they have "
                            "finished (the job storing the last chunk completes it; nothing is listed before).")
    assert "complete (and listed)" not in text
    with pytest.raises(SpecError, match=r"store.shards: this job has store.shards=3, but another job of the same "
                                        r"launch \(L1\) started run .* with store.shards=2.*Fix: give every job"):
        _execute(tmp_path, *common, "store.shards=3", "store.shard=1")
    last, text = _execute(tmp_path, *common, "store.shards=2", "store.shard=1")
    assert last.status == "complete" and last.run_id == first.run_id
    assert f"run {last.run_id}: observable hooked, model tiny; computed in" in text
    assert list(open_store(str(tmp_path / "s.zarr")).runs()["run_id"]) == [last.run_id]


# ----------------------------------------------------------------------------- one block per job

class _Writes(io.StringIO):
    def __init__(self):
        super().__init__()
        self.calls = []

    def write(self, s):
        self.calls.append(s)
        return super().write(s)


def test_a_jobs_console_block_is_one_write_with_the_pairs_line_table_and_a_run_line_naming_the_model(tmp_path):
    from reward_lens_spec.report.summary import print_summary
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run.executor import execute

    run, text = compose_run(["model=tiny_qwen2", "dataset.limit=3", f"store.url={tmp_path / 's.zarr'}"])
    out = _Writes()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("ignore")
        done = execute(run, resolved_yaml=text, base_dir=str(tmp_path), store_url=run.store.url, defer_lines=True)
        print_summary(done)
    assert len([c for c in out.calls if c]) == 1                  # nothing printed before the block, one write
    lines = out.calls[0].splitlines()
    assert lines[0].startswith("pairs: 3 of 3 scored") and lines[1].startswith("variable ")
    assert [ln.split()[0] for ln in lines[2:7]] == ["reward", "margin", "p_chosen", "bt_loss", "bt_grad"]
    assert lines[-2].startswith(f"run {done.run_id}: observable score, model tiny_qwen2; computed in ")


def test_without_store_url_a_run_and_a_sweep_share_one_stable_store(tmp_path):
    from reward_lens_spec.run.compose import store_url

    assert store_url(None, str(tmp_path)) == str(tmp_path / "outputs" / "store.zarr")
    assert store_url(None, str(tmp_path), "sw") == str(tmp_path / "sw" / "store.zarr")     # a folder one typed
    assert store_url("lab.zarr", str(tmp_path), "sw") == str(tmp_path / "lab.zarr")


def _cli(cwd, *args):
    exe = Path(sys.executable).parent / "reward-lens-spec"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reward_lens_spec"]
    return subprocess.run(cmd + list(args), cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.slow
def test_a_basic_launcher_sweep_without_store_url_reuses_its_runs_when_rerun(tmp_path):
    argv = ("-m", "model=tiny,tiny_qwen2", "dataset.limit=2")
    first = _cli(tmp_path, *argv)
    assert first.returncode == 0, first.stderr
    st = open_store(str(tmp_path / "outputs" / "store.zarr"))
    assert sorted(st.runs()["model"]) == ["tiny", "tiny_qwen2"]
    assert not list(tmp_path.glob("multirun/*/*/store.zarr"))          # no dated store
    assert [p.name for p in tmp_path.glob("multirun/*/*/*")] == ["multirun.yaml"]   # only Hydra's record there
    blocks = [b for b in first.stdout.split("pairs: 2 of 2 scored")[1:]]
    assert len(blocks) == 2
    for block, model in zip(blocks, ("tiny", "tiny_qwen2")):       # header, rows, summary together
        lines = block.splitlines()[1:]
        assert lines[0].startswith("variable ") and lines[1].startswith("reward ")
        assert any(ln.startswith("run score-") and f"observable score, model {model}; computed in" in ln
                   for ln in lines)
    again = _cli(tmp_path, *argv)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("reused, not recomputed") == 2 and "computed in" not in again.stdout
    assert sorted(open_store(str(tmp_path / "outputs" / "store.zarr")).runs()["model"]) == ["tiny", "tiny_qwen2"]


def _enum_keys(schema, prefix=""):
    """Every config key of ``schema`` (a dataclass, walked through its nested dataclasses) whose type is an Enum."""
    import dataclasses
    import enum
    import typing

    out = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)] or [t]
        for a in args:
            if isinstance(a, type) and issubclass(a, enum.Enum):
                out.append((prefix + f.name, [m.value for m in a]))
            elif dataclasses.is_dataclass(a):
                out += _enum_keys(a, f"{prefix}{f.name}.")
    return out


def test_every_enum_key_given_a_bad_value_names_the_key_the_valid_values_and_a_fix():
    """A value outside an enum key's choices (``model.device=gpu``, found by a new user without a Fix line) is
    refused in one line naming the key, its valid values and a fix; every enum-typed key of ``RunConfig``."""
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.spec import RunConfig

    keys = _enum_keys(RunConfig)
    assert {"model.dtype", "model.format"} <= {k for k, _ in keys}
    for key, values in keys:
        with pytest.raises(SpecError) as e:
            compose_run([f"{key}=no_such_value"])
        msg = str(e.value)
        assert e.value.field == key and "\n" not in msg, msg
        assert "'no_such_value' is not one of its values" in msg and "Fix:" in msg, msg
        assert all(str(v) in msg for v in values), msg


def test_hydra_sweep_functions_pass_the_precheck_and_a_plain_bad_value_does_not():
    """The precheck (``overrides.precheck_overrides``, which every route crosses) checks a plain value now and
    leaves Hydra's sweep and value functions to each job's composition: ``store.shard=range(16)`` (the Slurm
    recipe in docs/sweeps.md) and ``seed=range(3)`` were refused as "wrong type" before."""
    from reward_lens_spec.overrides import precheck_overrides

    for arg in ("store.shard=range(16)", "seed=range(3)", "seed=choice(1,2)", "model.batch_size=range(4)",
                "dataset.limit=interval(1,8)", "mode=choice(run,validate)", "seed=${oc.env:SEED,0}",
                "model.batch_size=range(2,5)", "seed=1,2"):
        precheck_overrides([arg])
    for arg, key in (("seed=abc", "seed"), ("mode=bogus", "mode"), ("store.shard=four", "store.shard"),
                     ("model.device=gpu", "model.device")):
        with pytest.raises(SpecError) as e:
            precheck_overrides([arg])
        assert e.value.field == key and "\n" not in str(e.value), str(e.value)


def test_a_data_warning_is_one_line_on_the_command_line_naming_no_internals(tmp_path, monkeypatch, capsys):
    """A dataset warning (pairs whose two prompts differ) reaches a person at the command line as one
    ``warning:`` line on stderr: no Python category, no source line, no internal attribute to look up."""
    from reward_lens_spec.cli import main

    rows = [{"id": f"p{i}", "prompt": f"q {i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(4)]
    rows[1]["prompt_rejected"] = "another prompt"
    (tmp_path / "pairs.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        main(["validate", "dataset=jsonl", "dataset.path=pairs.jsonl"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    said = [ln for ln in err if "prompts differ" in ln]
    assert len(said) == 1 and said[0].startswith("warning: dataset 'pairs': excluded 1 pair(s)"), err
    assert "p1" in said[0] and "data_flags" in said[0]
    assert not any("UserWarning" in ln or "warnings.warn" in ln or "PairSet" in ln for ln in err), err


def test_validate_names_the_dataset_option_the_person_chose(tmp_path, monkeypatch, capsys):
    """``validate`` with a dataset option of the person's own folder (``dataset=my_pairs``, kind jsonl) names
    that option, then its kind and file; a built-in option is named as it is."""
    from reward_lens_spec.cli import main

    (tmp_path / "conf" / "dataset").mkdir(parents=True)
    (tmp_path / "conf" / "dataset" / "my_pairs.yaml").write_text("name: my_pairs\nkind: jsonl\npath: pairs.jsonl\n")
    rows = [{"id": f"p{i}", "prompt": f"q {i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(3)]
    (tmp_path / "pairs.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    main(["validate", "--config-dir", "conf", "dataset=my_pairs"])
    assert "data OK: 3 pairs from dataset=my_pairs (jsonl, pairs.jsonl)" in capsys.readouterr().out
    main(["validate", "dataset.limit=2"])
    assert "data OK: 2 pairs from dataset=diagnostic\n" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["model.device", "dataset.limit", "seed", "observable.name"])
def test_an_interpolation_naming_no_key_is_one_line_on_every_route(key, capsys):
    """``key=${nope}`` (a plain interpolation whose key does not exist) was a 90-line ``InterpolationKeyError``
    traceback on the command line and a raw one from ``reward_lens_spec.run``: one line naming the key, each route."""
    import reward_lens_spec as rls
    from reward_lens_spec.cli import main
    from reward_lens_spec.run.compose import compose_run

    with pytest.raises(SpecError) as e:
        compose_run([f"{key}=${{nope}}"])
    assert e.value.field == key and "'nope' not found" in str(e.value) and "\n" not in str(e.value)
    head, _, leaf = key.rpartition(".")
    spec = {head: {leaf: "${nope}"}} if head else {leaf: "${nope}"}
    with pytest.raises(SpecError) as e:
        rls.run(spec, progress=False)
    assert e.value.field == key and "\n" not in str(e.value)
    with pytest.raises(SystemExit) as done:
        main(["validate", f"{key}=${{nope}}"])
    assert done.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"error: {key}: Interpolation key 'nope' not found") and "Fix:" in err[0]


def test_a_group_files_bad_value_of_a_known_key_names_that_key(tmp_path):
    """A group config file read by ``spec.group_config`` (a frame's or a study's reference): a bad value of a known
    key names ``<key>.<that key>`` with no "did you mean" it; a misspelt key still gets its suggestion."""
    from reward_lens_spec.spec import group_config

    path = tmp_path / "d.yaml"
    path.write_text("name: d\nlimit: [1]\n")
    with pytest.raises(SpecError) as e:
        group_config("dataset", str(path), key="frame.dataset")
    assert e.value.field == "frame.dataset.limit" and "Did you mean" not in str(e.value), str(e.value)
    path.write_text("name: d\nlimt: 3\n")
    with pytest.raises(SpecError) as e:
        group_config("dataset", str(path), key="frame.dataset")
    assert e.value.field == "frame.dataset" and "Did you mean 'limit'" in str(e.value), str(e.value)


def test_a_bad_choice_of_a_plain_sweep_is_refused_before_any_job_runs(tmp_path, capsys):
    """``-m model.device=cpu,gpu``: job 0 ran to its end before job 1 was refused (and with ``gpu,cpu`` the good job
    never ran). Each choice of a plain comma sweep is checked before the sweep starts; nothing is stored."""
    from reward_lens_spec.cli import main
    from reward_lens_spec.overrides import precheck_overrides

    for ok in ("model.device=cpu,auto", "seed=1,2", "dataset.limit=2,3", "model.batch_size=2,auto"):
        precheck_overrides([ok])
    for bad, value in (("model.device=cpu,gpu", "gpu"), ("seed=1,two", "two"), ("model.batch_size=2,0", "0")):
        with pytest.raises(SpecError) as e:
            precheck_overrides([bad])
        assert e.value.field == bad.split("=")[0] and value in str(e.value), str(e.value)
    url = tmp_path / "s.zarr"
    with pytest.raises(SystemExit) as done:
        main(["-m", "model.device=cpu,gpu", "dataset.limit=2", f"store.url={url}"])
    assert done.value.code == 2
    assert not url.exists() or not any(url.glob("runs/*/zarr.json"))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: model.device: unknown device 'gpu'"), err
