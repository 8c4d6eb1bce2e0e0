"""The ``reward-lens-spec`` command: a Hydra app plus a few subcommands.

    reward-lens-spec [overrides...]            run the composed config (default: score on tiny)
    reward-lens-spec -m model=a,b observable=x  a multirun sweep into one store
    reward-lens-spec validate [overrides...]   check and print the plan; loads no model
    reward-lens-spec ops                       list registered operators
    reward-lens-spec store ls|show|diff|export|gc|migrate url=...   catalog; loads no model
    reward-lens-spec calibrate observable=dla [store.url=...]    scorecard on model organisms
    reward-lens-spec freeze|adjudicate experiment=NAME [store.url=...]   preregistered studies
    reward-lens-spec fit model=... dataset=... out=DIR         fit a Bradley–Terry head
    reward-lens-spec report url=STORE run=ID out=DIR          plots from a store; no model
    reward-lens-spec compare url=STORE a=RUN b=RUN [vars=...]  two models' runs: margins; directions
                                                             only in one shared frame; no model

Group choices and keys given on the command line are checked before Hydra
composes anything, so a typo gets "did you mean" and a non-zero exit.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .config_safety import check_argv
from .errors import RewardLensError
from .overrides import precheck_overrides
from .paths import conf_dir
from .spec import register_configs

SUBCOMMANDS = ("validate", "ops", "store", "calibrate", "freeze", "adjudicate", "fit", "report", "compare")


def _store_url(cfg, base_dir: str) -> str:
    from hydra.core.hydra_config import HydraConfig

    url = cfg.store.url
    if url is None:
        hc = HydraConfig.get()
        if hc.mode.name == "MULTIRUN":
            return str(Path(hc.sweep.dir if Path(hc.sweep.dir).is_absolute() else Path(base_dir) / hc.sweep.dir)
                       / "store.zarr")
        return str(Path(base_dir) / "outputs" / "store.zarr")
    if "://" not in url and not Path(url).is_absolute():
        return str(Path(base_dir) / url)
    return url


def _task(cfg) -> None:
    try:
        _run_task(cfg)
    except RewardLensError as exc:            # one clear line, not a Hydra stack trace
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run_task(cfg) -> None:
    from hydra.utils import get_original_cwd
    from omegaconf import OmegaConf

    from .spec import validate

    base_dir = get_original_cwd()
    run = validate(cfg)
    if run.mode.value == "validate":
        from .planning import plan_for
        plan, _ = plan_for(run, base_dir)
        print(plan.describe())
        if run.frame.name.value != "native":
            from .planning import frame_dependent
            src = f"stored frame {run.frame.id}" if run.frame.id else "fitted at run time or reused from the store"
            print(f"frame={run.frame.name.value} ({src}): outputs expressed in it: {frame_dependent(plan) or 'none'}")
        print("plan OK (no model was loaded)")
        return
    from .report.summary import print_summary
    from .run import execute
    url = _store_url(cfg, base_dir)
    out = execute(run, resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=base_dir, store_url=url)
    print_summary(out)


def _hydra_main(argv: list[str]) -> None:
    import hydra

    register_configs()
    sys.argv = [sys.argv[0]] + argv
    app = hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(_task)
    app()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "store":
            from .store.catalog_cli import main as store_main
            raise SystemExit(store_main(argv[1:]))
        if argv and argv[0] in ("calibrate", "freeze", "adjudicate"):
            from .trust import cli as trust_cli
            raise SystemExit(getattr(trust_cli, f"{argv[0]}_main")(argv[1:]))
        if argv and argv[0] == "fit":
            from .fit.cli import main as fit_main
            raise SystemExit(fit_main(argv[1:]))
        if argv and argv[0] == "compare":
            from .compare.cli import main as compare_main
            raise SystemExit(compare_main(argv[1:]))
        if argv and argv[0] == "report":
            from .report.cli import main as report_main
            raise SystemExit(report_main(argv[1:]))
        if argv and argv[0] == "ops":
            from .registry import list_operators
            for name, doc in list_operators().items():
                print(f"{name:<20} {doc}")
            return
        if argv and argv[0] == "validate":
            argv = argv[1:] + ["mode=validate"]
        check_argv(argv)                      # no hydra.callbacks / foreign _target_ from any config source
        precheck_overrides(argv)
        os.environ.setdefault("HYDRA_FULL_ERROR", "0")
        _hydra_main(argv)
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
