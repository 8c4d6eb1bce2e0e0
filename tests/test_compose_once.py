"""A plain single run is composed once (``run.compose.compose_app``), not three times through Hydra's runner
(issue 27 item 4): the same config Hydra's runner composes, and anything else — a sweep, ``-m``, a Hydra flag,
a ``hydra.*`` override, an experiment that asks for a multirun — is left to Hydra."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from reward_lens_spec.run.compose import compose_app, prepare


def _as_hydra_composes(overrides):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    from reward_lens_spec.paths import conf_dir

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(conf_dir())))
    return loader.load_configuration("config", overrides, run_mode=RunMode.RUN, from_shell=True)


def _body(cfg) -> str:
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    return OmegaConf.to_yaml(cfg)


@pytest.mark.parametrize("argv", [
    ["dataset.limit=4"],
    ["observable=dla", "model=tiny_qwen2", "observable.layers=[1]", "dataset.fields.prompt=q"],
    ["experiment=example_dla_mlp"],
])
def test_the_config_is_the_one_hydras_runner_composes(argv):
    overrides = prepare(argv + ["mode=validate"])
    want = _body(_as_hydra_composes(overrides))
    cfg, logging_cfg, verbose = compose_app(overrides)
    assert _body(cfg) == want and logging_cfg.root.level == "INFO" and verbose is False


def test_a_composed_config_is_remembered_for_the_inputs_its_checks_passed_on(tmp_path, monkeypatch):
    import hydra

    user = tmp_path / "mine"
    (user / "dataset").mkdir(parents=True)
    own = user / "dataset" / "my_pairs.yaml"
    own.write_text("name: my_pairs\nkind: diagnostic\nlimit: 3\n")
    argv = ["--config-dir", str(user), "dataset=my_pairs", "mode=validate"]
    first, _, _ = compose_app(prepare(list(argv)))
    calls = []
    real = hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(1) or real(*a, **k))
    again, logging_cfg, _ = compose_app(prepare(list(argv)))
    assert not calls and _body(again) == _body(first) and logging_cfg.root.level == "INFO"
    own.write_text("name: my_pairs\nkind: diagnostic\nlimit: 2\n")             # another input: composed again
    changed, _, _ = compose_app(prepare(list(argv)))
    assert calls and changed.dataset.limit == 2


@pytest.mark.parametrize("argv", [
    ["model=tiny,tiny_qwen2"], ["dataset.limit=1,2"], ["-m", "dataset.limit=1"], ["--cfg", "job"],
    ["hydra/launcher=basic"], ["hydra.verbose=true"],
])
def test_sweeps_flags_and_hydra_overrides_are_left_to_hydra(argv):
    assert compose_app(argv + ["mode=validate"]) is None


def test_a_plain_run_does_not_start_hydras_runner(tmp_path, monkeypatch, capsys):
    from reward_lens_spec import cli

    def refuse(argv):
        raise AssertionError("Hydra's runner started")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "_hydra_main", refuse)
    cli.main(["validate", "observable=score", "dataset.limit=3"])
    assert "plan OK" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="runner started"):
        cli.main(["validate", "-m", "observable=score", "dataset.limit=3"])
