"""Configs reach no code, no file and no secret: only documented ``hydra.*`` keys pass, no resolver, no
``ext://``, ``model.trust_remote_code`` only typed, and ``git_sha`` runs no program.

Each attack goes through the real entry point ``reward_lens_spec.cli.main([...])`` in this process, from an
override, a ``--config-dir`` folder, an experiment or a file given by path; each must exit 2 with one error
line naming the key, and the marker the attack would leave (a file a fake ``git`` touches, a log target
truncated, a module imported, a folder created, a secret written) must be absent.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reward_lens_spec import config_sources, identity
from reward_lens_spec.cli import main
from reward_lens_spec.config_safety import check_argv, check_composed_config
from reward_lens_spec.config_sources import check_overrides
from reward_lens_spec.errors import SpecError
from reward_lens_spec.overrides import prepare_overrides
from reward_lens_spec.paths import ENV

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-7d1f0c9a-allowlist-test"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """Run in ``tmp_path`` with no user config folders and no network; undo every global the CLI touches."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, "")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["reward-lens-spec"])
    return tmp_path


def refused(capsys, *argv: str, key: str) -> str:
    """``main(argv)`` exits 2 with exactly one error line that names ``key``; returns the line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], err
    return lines[0]


def config_dir(root: Path, files: dict[str, str]) -> Path:
    d = root / "shared_cfgs"
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def no_file_contains(root: Path, needle: str) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            assert needle.encode() not in p.read_bytes(), p


# ----------------------------------------------------------------------------- 1. hydra.job.env_set.PATH

def fake_git(root: Path, marker: Path) -> Path:
    """A folder holding a ``git`` that touches ``marker`` and prints a plausible sha."""
    bin_dir = root / "evil_bin"
    bin_dir.mkdir()
    git = bin_dir / "git"
    git.write_text(f"#!/bin/sh\ntouch '{marker}'\necho {'e' * 40}\n")
    git.chmod(git.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


@pytest.mark.parametrize("route", ["override", "experiment", "sweeper_param"])
def test_env_set_path_is_refused_and_git_sha_runs_no_git(here, capsys, monkeypatch, route):
    marker = here / "git_ran.marker"
    bin_dir = fake_git(here, marker)
    path = f"{bin_dir}:{os.environ.get('PATH', '')}"
    if route == "override":
        refused(capsys, "validate", f"+hydra.job.env_set.PATH='{path}'", key="hydra.job.env_set.PATH")
    elif route == "experiment":
        cd = config_dir(here, {"experiment/shared_study.yaml":
                               f"# @package _global_\nhydra:\n  job:\n    env_set:\n      PATH: '{path}'\n"})
        refused(capsys, "validate", "--config-dir", str(cd), "experiment=shared_study", key="hydra.job.env_set.PATH")
    else:
        cd = config_dir(here, {"experiment/shared_sweep.yaml":
                               "# @package _global_\nhydra:\n  sweeper:\n    params:\n"
                               f"      hydra.job.env_set.PATH: '{path}'\n"})
        refused(capsys, "--config-dir", str(cd), "-m", "experiment=shared_sweep", "mode=validate",
                key="hydra.job.env_set.PATH")
    assert not marker.exists()
    monkeypatch.setenv("PATH", path)                  # even with the fake git first on PATH
    sha = identity.git_sha()
    assert sha is None or (len(sha) in (40, 64) and sha != "e" * 40)
    assert not marker.exists()


# ----------------------------------------------------------------------------- 2. logging FileHandler mode: w

@pytest.mark.parametrize("route", ["override", "experiment", "logging_option"])
def test_logging_file_handler_is_refused_and_its_target_keeps_its_content(here, capsys, route):
    target = here / "precious.txt"
    target.write_text("precious\n")
    handler = f"{{class: logging.FileHandler, filename: '{target}', mode: w}}"
    logging_yaml = (f"version: 1\nhandlers:\n  f:\n    class: logging.FileHandler\n    filename: {target}\n"
                    "    mode: w\nroot:\n  handlers: [f]\n")
    if route == "override":
        refused(capsys, "validate", f"+hydra.job_logging.handlers.f={handler}", key="hydra.job_logging")
    elif route == "experiment":
        body = "".join(f"    {ln}\n" for ln in logging_yaml.splitlines())
        cd = config_dir(here, {"experiment/shared_study.yaml": f"# @package _global_\nhydra:\n  job_logging:\n{body}"})
        refused(capsys, "validate", "--config-dir", str(cd), "experiment=shared_study", key="hydra.job_logging")
    else:
        cd = config_dir(here, {"hydra/job_logging/shared_log.yaml": logging_yaml,
                               "experiment/shared_study.yaml":
                               "# @package _global_\ndefaults:\n  - override /hydra/job_logging: shared_log\n"})
        refused(capsys, "validate", "--config-dir", str(cd), "experiment=shared_study", key="job_logging")
    assert target.read_text() == "precious\n"


# ----------------------------------------------------------------------------- 3. ext://module.attr

@pytest.mark.parametrize("route", ["logging_override", "experiment", "value"])
def test_ext_module_is_refused_and_never_imported(here, capsys, monkeypatch, route):
    marker = here / "imported.marker"
    mods = here / "mods"
    mods.mkdir()
    (mods / "evil_ext_mod_allowlist.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                                                    "import sys\nstream = sys.stdout\n")
    monkeypatch.syspath_prepend(str(mods))
    ext = "ext://evil_ext_mod_allowlist.stream"
    if route == "logging_override":
        refused(capsys, "validate", f"+hydra.job_logging.handlers.h={{class: logging.StreamHandler, stream: '{ext}'}}",
                key="hydra.job_logging")
    elif route == "experiment":
        cd = config_dir(here, {"experiment/shared_study.yaml":
                               "# @package _global_\nhydra:\n  hydra_logging:\n    handlers:\n      console:\n"
                               f"        class: logging.StreamHandler\n        stream: {ext}\n"})
        refused(capsys, "validate", "--config-dir", str(cd), "experiment=shared_study", key="hydra.hydra_logging")
    else:
        refused(capsys, "validate", f"dataset.name={ext}", key="dataset.name")
    assert not marker.exists()
    assert "evil_ext_mod_allowlist" not in sys.modules


# ----------------------------------------------------------------------------- 4. ${oc.env:SECRET} into provenance

@pytest.mark.parametrize("route", ["dataset_override", "model_override", "model_file", "experiment", "decode"])
def test_resolvers_are_refused_and_no_secret_reaches_the_store(here, capsys, monkeypatch, route):
    monkeypatch.setenv("RLS_ALLOWLIST_SECRET", SECRET)
    store = here / "store.zarr"
    common = ["dataset.limit=2", f"store.url={store}"]           # a full run, not validate
    if route == "dataset_override":
        refused(capsys, *common, "dataset.name=${oc.env:RLS_ALLOWLIST_SECRET}", key="dataset.name")
    elif route == "model_override":
        refused(capsys, *common, "model.name=run-${oc.env:RLS_ALLOWLIST_SECRET}", key="model.name")
    elif route == "model_file":
        cd = config_dir(here, {"model/shared_rm.yaml": "name: ${oc.env:RLS_ALLOWLIST_SECRET}\nsource: tiny\n"})
        refused(capsys, "--config-dir", str(cd), *common, "model=shared_rm", key="model.name")
    elif route == "experiment":
        cd = config_dir(here, {"experiment/shared_study.yaml":
                               "# @package _global_\ndataset:\n  name: ${oc.env:RLS_ALLOWLIST_SECRET,x}\n"})
        refused(capsys, "--config-dir", str(cd), *common, "experiment=shared_study", key="dataset.name")
    else:
        refused(capsys, *common, "dataset.name=${oc.decode:'${oc.env:RLS_ALLOWLIST_SECRET}'}", key="dataset.name")
    assert not store.exists() and not (here / "outputs").exists()
    no_file_contains(here, SECRET)


def test_trusted_only_resolvers_are_refused_from_a_user_folder(here, capsys):
    cd = config_dir(here, {"model/dated_rm.yaml": "name: rm-${now:%Y-%m-%d}\nsource: tiny\n"})
    line = refused(capsys, "validate", "--config-dir", str(cd), "model=dated_rm", key="model.name")
    assert "'now'" in line


# ----------------------------------------------------------------------------- 5. hydra.run.dir / sweep dirs

@pytest.mark.parametrize("route", ["validate", "run", "experiment", "sweep_dir", "sweep_subdir", "sweep_dir_file"])
def test_run_and_sweep_dirs_are_refused_and_not_created(here, capsys, route):
    target = here / "x"
    if route == "validate":
        refused(capsys, "validate", f"hydra.run.dir={target}", key="hydra.run.dir")
    elif route == "run":
        refused(capsys, "dataset.limit=2", f"hydra.run.dir={target}", key="hydra.run.dir")
    elif route == "experiment":
        cd = config_dir(here, {"experiment/shared_study.yaml":
                               f"# @package _global_\nhydra:\n  run:\n    dir: {target}\n"})
        refused(capsys, "validate", "--config-dir", str(cd), "experiment=shared_study", key="hydra.run.dir")
    elif route == "sweep_dir":
        refused(capsys, "-m", "mode=validate", f"hydra.sweep.dir={target}", key="hydra.sweep.dir")
    elif route == "sweep_subdir":
        refused(capsys, "-m", "mode=validate", "hydra.sweep.subdir=x", key="hydra.sweep.subdir")
    else:
        cd = config_dir(here, {"experiment/shared_study.yaml": "# @package _global_\nhydra:\n  sweep:\n    dir: x\n"})
        refused(capsys, "--config-dir", str(cd), "-m", "mode=validate", "experiment=shared_study",
                key="hydra.sweep.dir")
    assert not target.exists() and not (here / "outputs").exists() and not (here / "multirun").exists()


@pytest.mark.parametrize("override,key", [
    ("hydra.job.chdir=true", "hydra.job.chdir"), ("hydra.output_subdir=.hydra", "hydra.output_subdir"),
    ("+hydra.job.env_copy=[HOME]", "hydra.job.env_copy"), ("hydra/hydra_logging=default", "hydra/hydra_logging"),
    ("hydra/sweeper=basic", "hydra/sweeper"), ("model@hydra.job=tiny", "model@hydra.job"),
    ("hydra.launcher.submitit_folder=/tmp/evil", "hydra.launcher.submitit_folder"),
    ("+hydra.launcher.additional_parameters={x: y}", "hydra.launcher.additional_parameters"),
    ("~hydra.job_logging", "hydra.job_logging"), ("hydra/launcher=evil", "hydra/launcher"),
])
def test_other_hydra_keys_are_refused(here, capsys, override, key):
    refused(capsys, "validate", override, key=key)


def test_config_file_may_not_set_launcher_setup_or_choose_hydra_groups(here, capsys):
    marker = here / "setup_ran.marker"
    cd = config_dir(here, {"experiment/shared_study.yaml":
                           f"# @package _global_\nhydra:\n  launcher:\n    setup:\n      - touch {marker}\n"})
    refused(capsys, "--config-dir", str(cd), "-m", "mode=validate", "experiment=shared_study",
            "hydra/launcher=submitit_slurm", key="hydra.launcher.setup")
    assert not marker.exists()


# ----------------------------------------------------------------------------- 6. trust_remote_code

def remote_code_checkpoint(root: Path, marker: Path) -> Path:
    """A checkpoint folder whose config.json points at its own Python; importing it creates ``marker``."""
    d = root / "shared_ckpt"
    d.mkdir()
    touch = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (d / "configuration_evil.py").write_text(touch + "from transformers import LlamaConfig\n"
                                             "class EvilConfig(LlamaConfig):\n    model_type = 'evil_allowlist'\n")
    (d / "modeling_evil.py").write_text(touch)
    (d / "config.json").write_text(json.dumps({
        "model_type": "evil_allowlist", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                     "AutoModelForSequenceClassification": "modeling_evil.EvilModel"}}))
    return d


@pytest.mark.parametrize("route", ["model_folder", "experiment", "file_by_path", "sweep_option", "sweeper_param"])
def test_trust_remote_code_from_a_config_is_refused(here, capsys, route):
    marker = here / "remote_code_ran.marker"
    ckpt = remote_code_checkpoint(here, marker)
    model_yaml = f"name: shared_rm\nsource: {ckpt}\ntrust_remote_code: true\n"
    if route == "model_folder":
        cd = config_dir(here, {"model/shared_rm.yaml": model_yaml})
        args = ["validate", "--config-dir", str(cd), "model=shared_rm"]
    elif route == "experiment":
        cd = config_dir(here, {"experiment/shared_study.yaml":
                               f"# @package _global_\nmodel:\n  name: shared_rm\n  source: {ckpt}\n"
                               "  trust_remote_code: true\n"})
        args = ["validate", "--config-dir", str(cd), "experiment=shared_study"]
    elif route == "file_by_path":
        (here / "shared_rm_by_path.yaml").write_text(model_yaml)
        args = ["validate", f"model={here / 'shared_rm_by_path.yaml'}"]
    elif route == "sweep_option":                      # the second option of a sweep is composed and checked too
        cd = config_dir(here, {"model/shared_rm.yaml": model_yaml})
        args = ["--config-dir", str(cd), "-m", "mode=validate", "model=tiny,shared_rm"]
    else:
        cd = config_dir(here, {"experiment/shared_sweep.yaml":
                               "# @package _global_\nhydra:\n  sweeper:\n    params:\n"
                               "      model.trust_remote_code: 'true'\n"})
        args = ["--config-dir", str(cd), "-m", "mode=validate", "experiment=shared_sweep", f"model.source={ckpt}"]
    line = refused(capsys, *args, key="model.trust_remote_code")
    assert "type model.trust_remote_code=true on the command line" in line
    assert not marker.exists()
    # typed by the person at the keyboard, the same config passes every check (the loader then honours it)
    typed = [a for a in args if a != "validate"] + ["model.trust_remote_code=true"]
    if route != "sweeper_param":
        check_argv(prepare_overrides(typed + (["mode=validate"] if "validate" in args else [])))
    assert not marker.exists()


def test_check_composed_config_is_the_composed_tree_check():
    tree = {"model": {"name": "m", "trust_remote_code": True}, "dataset": {"name": "d"}}
    with pytest.raises(SpecError, match="model.trust_remote_code"):
        check_composed_config(tree, [])
    check_composed_config(tree, ["model.trust_remote_code=true"])
    with pytest.raises(SpecError, match="dataset.name"):
        check_composed_config({"dataset": {"name": "${oc.env:HOME}"}}, [])
    check_composed_config({"dataset": {"name": "${model.name}"}, "model": {"name": "m"}}, [])
    with pytest.raises(SpecError, match="hydra.job.env_set.PATH"):
        check_composed_config({"hydra": {"job": {"env_set": {"PATH": "/evil"}}}}, [])


# ----------------------------------------------------------------------------- what stays allowed

@pytest.mark.parametrize("argv", [
    ["-m", "model=tiny_llama,tiny_qwen2", "dataset.limit=3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
     "hydra.sweep.dir=sweep"],
    ["-m", "model=tiny_gpt2", "observable=score,lens", "hydra/launcher=submitit_local",
     "hydra.launcher.timeout_min=10", "hydra.sweep.dir=sw", "store.url=lab.zarr"],
    ["-m", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.mem_gb=64",
     "hydra.launcher.cpus_per_task=8", "store.shards=4", "store.shard=range(4)",
     "hydra.launcher.setup=['module load cuda']"],
    ["-m", "+hydra.sweeper.params={model: 'tiny,tiny_gpt2'}"],
    ["experiment=example_dla_mlp"], ["hydra.verbose=true"], ["dataset.name=${model.name}"],
])
def test_documented_settings_still_pass(here, argv):
    check_argv(prepare_overrides(argv + ["mode=validate"]))


def test_a_shared_folder_with_launcher_settings_and_sweeper_params_passes(here):
    cd = config_dir(here, {
        "hydra/launcher/lab_joblib.yaml": "defaults:\n  - joblib\nn_jobs: 2\nprefer: processes\n",
        "experiment/lab_sweep.yaml": "# @package _global_\ndefaults:\n  - override /hydra/launcher: joblib\n"
                                     "hydra:\n  launcher:\n    n_jobs: 3\n  sweeper:\n    params:\n"
                                     "      model: tiny,tiny_gpt2\ndataset:\n  limit: 4\n",
    })
    check_argv(prepare_overrides(["--config-dir", str(cd), "-m", "experiment=lab_sweep", "mode=validate"]))
    check_argv(prepare_overrides(["--config-dir", str(cd), "-m", "hydra/launcher=lab_joblib", "mode=validate"]))


def test_rules_on_overrides():
    for bad in ("hydra.run.dir=x", "+hydra.job.env_set.A=1", "hydra.launcher.setup=x,y", "a=${oc.env:HOME}",
                "a='${oc.decode:x}'", "a=ext://os.system", "hydra/output=default", "hydra.sweep.dir=../x",
                "hydra.sweep.dir=/abs", "hydra.launcher.n_jobs=${oc.env:N}"):
        with pytest.raises(SpecError):
            config_sources._check_override_list([bad], typed=False)
    check_overrides(["hydra.launcher.n_jobs=4", "hydra/launcher=joblib", "hydra.sweep.dir=sw", "a=${b.c}",
                     "hydra.launcher.setup=['module load x']", "hydra.mode=MULTIRUN"])


# ----------------------------------------------------------------------------- git sha without a subprocess

def _head_by_file_reads(root: Path) -> str | None:
    dot = root / ".git"
    if dot.is_file():
        dot = (root / dot.read_text().split(":", 1)[1].strip()).resolve()
    if not dot.is_dir():
        return None
    common = dot
    if (dot / "commondir").is_file():
        common = (dot / (dot / "commondir").read_text().strip()).resolve()
    head = (dot / "HEAD").read_text().strip()
    if not head.startswith("ref:"):
        return head
    ref = head[4:].strip()
    for base in (dot, common):
        if (base / ref).is_file():
            return (base / ref).read_text().strip()
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    return None


def _no_programs(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("git_sha ran a program")

    for name in ("run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"):
        monkeypatch.setattr(subprocess, name, boom)
    for name in ("system", "popen", "execv", "execvp", "posix_spawn", "posix_spawnp", "fork"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, boom)


def test_git_sha_reads_head_from_files_and_runs_no_program(tmp_path, monkeypatch):
    if not (ROOT / ".git").exists() or Path(identity.__file__).resolve().parents[1] != ROOT:
        pytest.skip("not running from a git checkout")
    marker = tmp_path / "git_ran.marker"
    monkeypatch.setenv("PATH", f"{fake_git(tmp_path, marker)}:{os.environ.get('PATH', '')}")
    _no_programs(monkeypatch)
    before = _head_by_file_reads(ROOT)
    got = identity.git_sha()
    after = _head_by_file_reads(ROOT)              # others may commit meanwhile
    assert got is not None and got in (before, after)
    assert not marker.exists()


@pytest.mark.parametrize("layout", ["loose", "packed", "detached", "worktree", "not_a_repo", "garbage"])
def test_git_sha_layouts(tmp_path, monkeypatch, layout):
    _no_programs(monkeypatch)
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "repo"
    pkg = repo / "src" / "reward_lens_spec"
    pkg.mkdir(parents=True)
    git = repo / ".git"
    if layout != "not_a_repo":
        (git / "refs" / "heads").mkdir(parents=True)
        (git / "HEAD").write_text("ref: refs/heads/main\n")
    if layout == "loose":
        (git / "refs" / "heads" / "main").write_text(sha + "\n")
    elif layout == "packed":
        (git / "packed-refs").write_text(f"# pack-refs with: peeled fully-peeled sorted\n{'f' * 40} refs/heads/other\n"
                                         f"{sha} refs/heads/main\n^{'a' * 40}\n")
    elif layout == "detached":
        (git / "HEAD").write_text(sha + "\n")
    elif layout == "worktree":                      # <wt>/.git is a file; the branch lives in the common dir
        (git / "refs" / "heads" / "feature").write_text(sha + "\n")
        wt_git = git / "worktrees" / "wt"
        wt_git.mkdir(parents=True)
        (wt_git / "HEAD").write_text("ref: refs/heads/feature\n")
        (wt_git / "commondir").write_text("../..\n")
        wt = tmp_path / "wt"
        pkg = wt / "src" / "reward_lens_spec"
        pkg.mkdir(parents=True)
        (wt / ".git").write_text(f"gitdir: {wt_git}\n")
    elif layout == "garbage":
        (git / "HEAD").write_text("ref: ../../../etc/passwd\n")
    monkeypatch.setattr(identity, "__file__", str(pkg / "identity.py"))
    assert identity.git_sha() == (sha if layout in ("loose", "packed", "detached", "worktree") else None)
