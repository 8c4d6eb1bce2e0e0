"""What a new user met in a fresh trial (2026-12-05): a wrong-typed value without a fix, a misspelled step dim
without "did you mean", ``report out=<a file>`` as a stack trace, a store-is-a-file error naming ``url=`` for a
run, Ctrl-C as a 118-line stack trace and a rerun that did not say it resumed, and a job that lost the race to
publish printing the winner's wall time as its own."""
from __future__ import annotations

import dataclasses
import enum
import glob
import os
import signal
import subprocess
import sys
import time
import typing
from types import SimpleNamespace

import pytest

from reward_lens_spec.errors import SpecError, StoreError


def _scalar_keys(schema, prefix=""):
    """Every config key of ``schema`` (walked through nested dataclasses) typed int, float or bool (optional or
    not): a word given there is a wrong type."""
    out = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)] if typing.get_origin(t) is typing.Union else [t]
        if len(args) == 1 and args[0] in (int, float, bool):
            out.append((prefix + f.name, args[0]))
        for a in args:
            if dataclasses.is_dataclass(a) and not (isinstance(a, type) and issubclass(a, enum.Enum)):
                out += _scalar_keys(a, f"{prefix}{f.name}.")
    return out


def test_every_scalar_key_given_a_word_names_the_key_and_a_fix_of_its_type():
    """``dataset.limit=ten`` said "could not be converted to Integer" and no fix; every int, float and bool key of
    ``RunConfig`` given a word is refused in one line naming the key and a value of its type to set."""
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.spec import RunConfig

    keys = _scalar_keys(RunConfig)
    assert {"dataset.limit", "seed", "store.chunk_pairs", "model.trust_remote_code"} <= {k for k, _ in keys}
    example = {int: "<an integer>", float: "<a number>", bool: "true|false"}
    for key, typ in keys:
        with pytest.raises(SpecError) as e:
            compose_run([f"{key}=zz_not_a_value"])
        msg = str(e.value)
        assert e.value.field == key and "\n" not in msg, msg
        assert f"Fix: set {key}=" in msg and example[typ] in msg.split("Fix:")[1], msg


@pytest.mark.parametrize("arg, key, fix", [("dataset.limit=0", "dataset.limit", "dataset.limit=null"),
                                           ("model.max_tokens=0", "model.max_tokens", "model.max_tokens=N")])
def test_a_zero_limit_names_the_fix(arg, key, fix):
    from reward_lens_spec.run.compose import compose_run

    with pytest.raises(SpecError) as e:
        compose_run([arg])
    assert e.value.field == key and "Fix: set " in str(e.value) and fix in str(e.value), str(e.value)


@pytest.mark.parametrize("op, extra", [("reduce", "how: sum"), ("cumsum", ""), ("select", "index: 0")])
def test_a_misspelled_step_dim_gets_did_you_mean_and_the_inputs_dims(tmp_path, op, extra):
    from reward_lens_spec.planning import plan_for
    from reward_lens_spec.run.compose import compose_run

    step = ", ".join(x for x in (f"name: out, op: {op}, input: reward, dim: sides", extra) if x)
    (tmp_path / "o.yaml").write_text("name: o\nversion: 1\nsteps:\n  - {name: reward, op: capture, site: readout}\n"
                                     f"  - {{{step}}}\noutputs: [out]\n")
    run, _ = compose_run([f"observable={tmp_path / 'o.yaml'}"])
    with pytest.raises(SpecError) as e:
        plan_for(run, str(tmp_path))
    msg = str(e.value)
    assert "Did you mean 'side'?" in msg and "Fix: set dim: to one of the input's dims (pair, side, d_model)" in msg


def test_a_fixed_dim_requirement_suggests_no_near_dim():
    """Where an operator needs a dim of its own (not a user's ``dim:``), a near dim is not offered."""
    from reward_lens_spec.ops.base import need_dim

    with pytest.raises(SpecError) as e:
        need_dim(("pair", "site"), "side", "observable.x.steps.y", "both sides")
    assert "Did you mean" not in str(e.value) and "Fix: feed it the output of a step" in str(e.value)


def test_report_out_naming_a_file_is_one_line_and_the_file_is_untouched(tmp_path, capsys):
    from reward_lens_spec.report.cli import main

    f = tmp_path / "pairs.jsonl"
    f.write_text("keep me\n")
    assert main([f"url={tmp_path / 'store.zarr'}", f"out={f}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: out: ") and "Fix: set out= to a folder" in err and "\n" not in err
    assert f.read_text() == "keep me\n"


def test_a_store_url_naming_a_file_names_the_runs_key(tmp_path):
    from reward_lens_spec.store import open_store

    f = tmp_path / "afile.zarr"
    f.write_text("x")
    with pytest.raises(StoreError) as e:
        open_store(str(f)).runs()
    assert "store.url= of a run, url= of a store command" in str(e.value)
    assert f.read_text() == "x"


def test_the_run_line_says_what_this_job_did():
    """``job_note``: a job that resumed stored chunks says how many; one whose copy another job's beat to
    publication says the stored wall time is the other job's; a job that computed everything, or reused, adds
    nothing."""
    from reward_lens_spec.report.summary import job_note

    assert job_note(SimpleNamespace(chunks=12, computed=10, published=True)) == \
        "; resumed: 2 of 12 chunk(s) were stored by an earlier job"
    assert "another job completed the same run first" in job_note(SimpleNamespace(chunks=2, computed=2,
                                                                                   published=False))
    assert job_note(SimpleNamespace(chunks=12, computed=6, published=True, shard=(1, 2))) == \
        "; this job computed 6 of 12 chunk(s), the other shards' jobs the rest"
    assert job_note(SimpleNamespace(chunks=12, computed=12, published=True)) == ""
    assert job_note(SimpleNamespace(chunks=0, computed=0, published=True)) == ""     # reused


def test_a_job_beaten_to_publication_says_so(tmp_path, capsys, monkeypatch):
    """Two jobs of one run at once (a real race, in one process): the first job's completion is held until a
    second job of the same config has computed and completed the run; the first then loses the publication
    and its line says the stored copy is the other job's."""
    from reward_lens_spec.report.summary import print_summary
    from reward_lens_spec.run.compose import compose_run, store_url
    from reward_lens_spec.run.executor import execute
    from reward_lens_spec.store.attempts import Attempt

    args = ["observable=score", "dataset.limit=6", f"store.url={tmp_path / 's.zarr'}"]
    url = store_url(str(tmp_path / "s.zarr"), str(tmp_path))
    original, done = Attempt.release, []

    def release(self, role):
        if role == "shard-0" and not done:      # the first job, its chunks stored, still holding its role:
            done.append(self.aid)               # the second starts now, computes in its own attempt, publishes
            run2, yaml2 = compose_run(args)
            second = execute(run2, resolved_yaml=yaml2, base_dir=str(tmp_path), store_url=url, progress=False)
            assert not second.reused and second.published and second.computed == second.chunks == 1
        return original(self, role)

    monkeypatch.setattr(Attempt, "release", release)
    run, yaml = compose_run(args)
    first = execute(run, resolved_yaml=yaml, base_dir=str(tmp_path), store_url=url, progress=False,
                    open_result=False)
    assert done and not first.published and first.status == "complete"
    capsys.readouterr()
    print_summary(first)
    assert "another job completed the same run first" in capsys.readouterr().out


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_rerun_says_it_resumed(tmp_path):
    """SIGINT after two chunks are stored: exit 130, one line on stderr after the progress bar (no stack trace);
    the same command again computes only the chunks that are missing and says how many were stored."""
    from reward_lens_spec.cli import INTERRUPTED

    cmd = [sys.executable, "-m", "reward_lens_spec", "observable=score", "store.chunk_pairs=8",
           f"store.url={tmp_path / 's.zarr'}"]
    env = {**os.environ, "REWARD_LENS_SPEC_CACHE": str(tmp_path / "cache")}
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    markers = str(tmp_path / "s.zarr" / "_internal" / "attempts" / "*" / "*" / "_ctl" / "chunk.*.json")
    while len(glob.glob(markers)) < 2 and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    stored = len(glob.glob(markers))
    if p.returncode == 0:
        pytest.skip("the run finished before the signal arrived")   # a machine fast enough to beat the poll
    assert p.returncode == 130, err
    assert "Traceback" not in err and err.replace("\r", "\n").strip().splitlines()[-1] == INTERRUPTED
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resumed: {stored} of 12 chunk(s) were stored by an earlier job" in again.stdout, again.stdout
