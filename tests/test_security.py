"""No foreign code: hostile checkpoints and configs are refused with one line and run nothing.

Each hostile input, if it ran, would create a marker file; every test asserts the marker is absent. The CLI
runs in real subprocesses with "y" on stdin (what transformers' remote-code prompt would accept).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reward_lens_spec.config_rules import ALLOWED_TARGETS, check_tree
from reward_lens_spec.config_sources import check_files, check_overrides
from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.describe import model_config
from reward_lens_spec.models.loading import load_model
from reward_lens_spec.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]


def cli(cwd, *args):
    return subprocess.run([sys.executable, "-m", "reward_lens_spec", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, input="y\ny\ny\n",
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})


def refused(res, field):
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), res.stderr
    return lines[0]


def checkpoint(root: Path, model_type: str, marker: Path) -> Path:
    """A tiny Llama checkpoint whose config.json and tokenizer_config.json point at their own Python (auto_map);
    importing any of that Python creates ``marker``."""
    from reward_lens_spec.models.tiny import build_tiny

    d = root / model_type
    model, tok = build_tiny("tiny_llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    touch = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (d / "configuration_evil.py").write_text(touch + "from transformers import LlamaConfig\n"
                                             f"class EvilConfig(LlamaConfig):\n    model_type = {model_type!r}\n")
    (d / "modeling_evil.py").write_text(touch)
    (d / "tokenization_evil.py").write_text(touch)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type=model_type, auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                "AutoModelForSequenceClassification": "modeling_evil.EvilModel"})
    (d / "config.json").write_text(json.dumps(cfg))
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    tcfg["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (d / "tokenizer_config.json").write_text(json.dumps(tcfg))
    return d


# ----------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("mode", ["validate", "run"])
def test_auto_map_checkpoint_is_refused_and_its_code_never_runs(tmp_path, mode):
    marker = tmp_path / "ran.marker"
    d = checkpoint(tmp_path, "evil_rm", marker)
    args = (["validate"] if mode == "validate" else []) + [f"model.source={d}", "model.name=evil", "dataset.limit=2"]
    line = refused(cli(tmp_path, *args), "model.trust_remote_code")
    assert "trust_remote_code=true" in line
    assert not marker.exists()
    assert not (tmp_path / "outputs" / "store.zarr" / "runs").exists() or not any(
        (tmp_path / "outputs" / "store.zarr" / "runs").iterdir())


def test_auto_map_checkpoint_in_process_every_from_pretrained(tmp_path):
    marker = tmp_path / "ran.marker"
    d = checkpoint(tmp_path, "evil_rm", marker)
    for call in (model_config, load_model):
        with pytest.raises(SpecError, match="model.trust_remote_code"):
            call(ModelSpec(name="evil", source=str(d)))
    assert not marker.exists()


def test_auto_map_on_a_model_type_transformers_ships_loads_without_its_code(tmp_path):
    marker = tmp_path / "ran.marker"
    d = checkpoint(tmp_path, "llama", marker)
    lm = load_model(ModelSpec(name="known", source=str(d)))
    assert type(lm.model).__name__ == "LlamaForSequenceClassification" and lm.n_layers > 0
    assert model_config(ModelSpec(name="known", source=str(d))).model_type == "llama"
    assert not marker.exists()


# ----------------------------------------------------------------------------- configs

def hostile_callback(marker: Path) -> str:
    return f"hydra:\n  callbacks:\n    evil:\n      _target_: builtins.open\n      file: {marker}\n      mode: w\n"


@pytest.mark.parametrize("target", ["builtins.open", "pathlib.Path.touch"])
def test_callback_override_is_refused(tmp_path, target):
    marker = tmp_path / "ran.marker"
    arg = "file" if target == "builtins.open" else "self"
    extra = ["+hydra.callbacks.evil.mode=w"] if target == "builtins.open" else []
    res = cli(tmp_path, "validate", f"+hydra.callbacks.evil._target_={target}",
              f"+hydra.callbacks.evil.{arg}={marker}", *extra)
    refused(res, "+hydra.callbacks")
    assert not marker.exists()


def test_config_dir_experiment_with_callbacks_is_refused(tmp_path):
    marker = tmp_path / "ran.marker"
    cd = tmp_path / "cfgs"
    (cd / "experiment").mkdir(parents=True)
    (cd / "experiment" / "shared_study.yaml").write_text("# @package _global_\n" + hostile_callback(marker))
    refused(cli(tmp_path, "--config-dir", str(cd), "validate", "experiment=shared_study"), "hydra.callbacks")
    assert not marker.exists()


def test_config_dir_primary_config_with_callbacks_is_refused(tmp_path):
    marker = tmp_path / "ran.marker"
    cd = tmp_path / "cfgs"
    cd.mkdir()
    (cd / "lab.yaml").write_text("defaults:\n  - config\n  - _self_\n" + hostile_callback(marker))
    refused(cli(tmp_path, "--config-dir", str(cd), "--config-name", "lab", "mode=validate"), "hydra.callbacks")
    assert not marker.exists()


def test_config_dir_target_in_a_launcher_option_is_refused(tmp_path):
    marker = tmp_path / "ran.marker"
    cd = tmp_path / "cfgs"
    (cd / "hydra" / "launcher").mkdir(parents=True)
    (cd / "hydra" / "launcher" / "mine.yaml").write_text(f"_target_: builtins.open\nfile: {marker}\nmode: w\n")
    line = refused(cli(tmp_path, "--config-dir", str(cd), "-m", "hydra/launcher=mine", "mode=validate"), "_target_")
    assert "hydra/launcher/mine.yaml" in line and "builtins.open" in line
    assert not marker.exists()


def test_rules_on_trees_overrides_and_files(tmp_path):
    for bad in ({"a": {"_target_": "os.system"}}, {"hydra": {"callbacks": {}}},
                {"hydra": {"job_logging": {"handlers": {"h": {"class": "os.system"}}}}},
                {"hydra": {"job_logging": {"formatters": {"f": {"()": "os.system"}}}}},
                {"hydra": {"searchpath": ["pkg://evil"]}}, {"defaults": ["override hydra/callbacks: x"]},
                {"defaults": [{"override hydra/callbacks": "x"}]}):
        with pytest.raises(SpecError):
            check_tree(bad, "test")
    for target in ALLOWED_TARGETS:
        check_tree({"hydra": {"launcher": {"_target_": target}}}, "test")
    check_tree({"hydra": {"job_logging": {"handlers": {"h": {"class": "logging.StreamHandler"}}}}}, "test")
    for bad in ("hydra.launcher._target_=os.system", "+x={_target_: os.system}", "+hydra.callbacks.a=1",
                "hydra/callbacks=x", "+a=[{_target_: builtins.eval}]", "hydra.launcher._target_=os.system,x"):
        with pytest.raises(SpecError):
            check_overrides([bad])
    check_overrides(["model=tiny,tiny_gpt2", "dataset.limit=4", "hydra/launcher=submitit_local"])
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a.yaml").write_text("dataset:\n  limit: 3\n")
    check_files(tmp_path / "ok", "test")
    (tmp_path / "ok" / "b.yaml").write_text("# @package hydra.callbacks\nx: 1\n")
    with pytest.raises(SpecError, match="callbacks"):
        check_files(tmp_path / "ok", "test")


def test_pickle_rerun_and_config_path_are_refused(tmp_path):
    refused(cli(tmp_path, "--experimental-rerun", str(tmp_path / "x.pickle")), "--experimental-rerun")
    refused(cli(tmp_path, "--config-path", str(tmp_path), "mode=validate"), "--config-path")


def test_launcher_shell_setup_from_a_config_file_is_refused(tmp_path):
    marker = tmp_path / "ran.marker"
    cd = tmp_path / "cfgs"
    (cd / "hydra" / "launcher").mkdir(parents=True)
    (cd / "hydra" / "launcher" / "mine.yaml").write_text(f"defaults:\n  - submitit_slurm\nsetup:\n  - touch {marker}\n")
    refused(cli(tmp_path, "--config-dir", str(cd), "-m", "hydra/launcher=mine", "mode=validate"), "hydra.launcher.setup")
    assert not marker.exists()
