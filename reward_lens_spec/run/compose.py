"""Composing a run: the one place a command line becomes a validated ``RunConfig``.

``prepare(argv)`` does everything before Hydra composes: the user's config folders (``--config-dir``,
``hydra.searchpath``, ``REWARD_LENS_SPEC_CONFIG_PATH``) become one ``hydra.searchpath`` override and
files given by path become options (``overrides.prepare_overrides``); then the safety rules
(``config_safety.check_argv``: no code, files or secrets reachable from a config) and the typo
checks ("did you mean", ``overrides.precheck_overrides``). ``finish(cfg, typed)`` does everything
after: the composed tree's safety checks and ``spec.validate``. The main app runs ``prepare`` before
``hydra.main`` and ``finish`` in its task; ``compose_run`` runs both around Hydra's compose API for
``fit``, ``freeze``/``amend`` (a study's design), ``frames`` and the tests — so every route sees the
same folders and the same rules.
"""
from __future__ import annotations

from pathlib import Path

from ..config_safety import check_argv
from ..overrides import precheck_overrides, prepare_overrides


def prepare(argv: list[str]) -> list[str]:
    """The overrides Hydra should compose for ``argv`` (see the module doc); ``SpecError`` on any refusal."""
    overrides = prepare_overrides(list(argv))
    check_argv(overrides)
    precheck_overrides(overrides)
    return overrides


def finish(cfg, typed: list[str]):
    """``(RunConfig, resolved YAML)`` of a composed config; ``typed``: the overrides the person typed
    (``model.trust_remote_code`` counts only there). ``SpecError`` on any refusal."""
    from omegaconf import OmegaConf

    from .. import config_safety
    from ..spec import validate

    config_safety.check_composed_config(OmegaConf.to_container(cfg, resolve=False), list(typed))
    return validate(cfg), OmegaConf.to_yaml(cfg)


def compose_run(argv: list[str], *, typed: list[str] | None = None):
    """Compose ``conf/config.yaml`` (plus the user's folders) with ``argv`` and validate it:
    ``(RunConfig, resolved YAML)``. ``typed``: what the person typed (default ``argv``; a stored study's
    design passes none, so it can never switch on ``model.trust_remote_code``). Raises ``SpecError``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ..paths import conf_dir
    from ..spec import register_configs

    overrides = prepare(argv)
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return finish(cfg, argv if typed is None else typed)


def store_url(url: str | None, base_dir: str, sweep_dir: str | None = None) -> str:
    """The store a run writes to, for every command: ``store.url`` as given when it is a URL or an absolute
    path, else under ``base_dir``. No url: ``<base_dir>/outputs/store.zarr``, for a single run and a multirun
    alike (one stable store, so a rerun of a sweep finds its runs instead of recomputing them in a new dated
    folder), or ``<sweep_dir>/store.zarr`` when the person chose the sweep folder (``hydra.sweep.dir=DIR``)."""
    if url is None:
        if sweep_dir is not None:
            return str((Path(base_dir) / sweep_dir) / "store.zarr")
        return str(Path(base_dir) / "outputs" / "store.zarr")
    return url if "://" in url or Path(url).is_absolute() else str(Path(base_dir) / url)
