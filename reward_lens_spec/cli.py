"""The ``reward-lens-spec`` command: a Hydra app plus a few subcommands.

``reward-lens-spec help`` (or ``--help``) lists every command, one line each, and the config groups
with their options; ``reward-lens-spec <command> --help`` prints that command's arguments.
Group choices and keys given on the command line are checked before Hydra composes anything, so
a typo gets "did you mean" and a non-zero exit. A user's own configs live in their own folder
(``--config-dir DIR``, ``hydra.searchpath=[DIR]``) or one file (``observable=./my_obs.yaml``);
see ``overrides.prepare_overrides``.
"""
from __future__ import annotations

import os
import sys
import textwrap
import warnings

from .commands import COMMANDS, LISTING_NOTES
from .errors import RewardLensError
from .registries import resolve_ref
from .overrides import GROUPS, use_config_dirs
from .run.compose import prepare
from .store.trust_root import use_words
from .paths import conf_dir
from .spec import register_configs
from dataclasses import fields
import hydra
import importlib
import inspect
import re
from hydra._internal.utils import run_and_report
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from hydra.utils import get_original_cwd
from .data.accounting import pairs_limit
from .data.loaders import FIELD_NAMES, META_FIELDS
from .errors import SpecError
from .model_checks import checkpoint_indices
from .paths import group_options, search_dirs
from .report.summary import print_summary, run_line, table_lines
from .run.compose import compose_app, compose_run, finish, store_url
from .inputs import load_dataset
from .run.reuse import validate_key
from .signed_cache import read_signed, write_signed
from .spec import GROUP_SCHEMAS
from .run import execute

SUBCOMMANDS = tuple(c for c in COMMANDS if c not in ("run", "help"))
LAUNCHERS = ("basic", "joblib", "submitit_local", "submitit_slurm", "slurm")
_HELP_FLAGS = ("--help", "-h")


def _command_doc(cmd: str) -> str:
    """The argument reference of one command (its module's docstring)."""
    c = COMMANDS[cmd]
    mod = c.doc or None
    head = f"reward-lens-spec {cmd if cmd != 'run' else ''} {c.args}".replace("  ", " ") + f"\n  {c.description}\n"
    if cmd in LISTING_NOTES:
        return head + "\n" + LISTING_NOTES[cmd]
    if mod is None:              # run / validate: the Hydra app
        return head + "\n" + _groups_text() + ("\nvalidate prints the plan (steps, dims, gauge) and the frame; "
                                               "it loads no weights." if cmd == "validate" else "")
    return head + "\n" + inspect.cleandoc(importlib.import_module(f"reward_lens_spec.{mod}").__doc__ or "")


def _groups_text() -> str:
    lines = ["config groups: group=option or group=./file.yaml; a folder of your own with --config-dir DIR",
             "(DIR/<group>/<name>.yaml, names other than the built-ins'):"]
    for g in GROUPS:
        lines.append(textwrap.fill(", ".join(group_options(g)) or "(none)", 100, initial_indent=f"  {g:<11} ",
                                   subsequent_indent=" " * 14))
        if g in GROUP_SCHEMAS:
            keys = ", ".join(f.name for f in fields(GROUP_SCHEMAS[g]))
            lines.append(textwrap.fill(f"keys: {keys}", 100, initial_indent=" " * 14, subsequent_indent=" " * 20))
    lines.append(textwrap.fill("dataset.fields.<name>=<the file's key>, name one of: "
                               + ", ".join(FIELD_NAMES + META_FIELDS), 100, initial_indent=" " * 14,
                               subsequent_indent=" " * 20))
    lines.append(f"  hydra/launcher=  {', '.join(LAUNCHERS)}")
    lines.append(" " * 14 + "(with -m; joblib and submitit need pip install 'reward_lens_spec[full]')")
    lines.append("  top-level   mode=run|validate, seed=N")
    lines.append("config folders searched, in order: " + ", ".join(map(str, search_dirs())))
    return "\n".join(lines)


def help_text() -> str:
    """What ``reward-lens-spec help`` prints: commands (one line each) and config groups."""
    lines = ["reward-lens-spec: spec-driven interpretability for Bradley–Terry reward models", "",
             "usage: reward-lens-spec [COMMAND] [key=value ...]   (COMMAND --help: its arguments)",
             "", "commands:"]
    for name, c in COMMANDS.items():
        lines.append(f"  {name if name != 'run' else '(none)':<11} {c.description}")
    return "\n".join(lines + ["", _groups_text()])


def _store_url(cfg, base_dir: str) -> str:
    hc = HydraConfig.get()                 # a sweep folder counts only when typed: Hydra's default one is dated
    chosen = hc.mode.name == "MULTIRUN" and any(o.startswith("hydra.sweep.dir=") for o in hc.overrides.hydra)
    return store_url(cfg.store.url, base_dir, hc.sweep.dir if chosen else None)


def _task(cfg) -> None:
    try:
        _run_task(cfg)
    except RewardLensError as exc:            # one clear line, not a Hydra stack trace
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run_task(cfg) -> None:
    base_dir = get_original_cwd()
    _run_config(cfg, base_dir, list(HydraConfig.get().overrides.task), lambda: _store_url(cfg, base_dir),
                multirun=HydraConfig.get().mode.name == "MULTIRUN")


def _run_config(cfg, base_dir: str, typed: list[str], url, multirun: bool = False) -> None:
    """The main job on a composed config (no ``hydra`` node): validate or execute, then print."""
    run, resolved_yaml = finish(cfg, typed)
    if run.mode.value == "validate":           # a store the run could not write is refused here too
        from .store.layout import check_writable

        check_writable(url(), dict(run.store.storage_options))
        return _validate(run, resolved_yaml, base_dir)
    out = execute(run, resolved_yaml=resolved_yaml, base_dir=base_dir, store_url=url(),
                  defer_lines=multirun,                   # a multirun's jobs share a console: each prints one block
                  open_result=False)                      # the table is the run document's: no array is read
    _print_summary(out)


def _run_single(overrides: list[str]) -> bool:
    """A plain single run (``run.compose.compose_app``) composed once and run here, as Hydra's runner would:
    Hydra's logging set up from the composed ``hydra`` node, errors reported Hydra's way. ``False``: not plain,
    Hydra runs it."""
    composed = compose_app(overrides)
    if composed is None:
        return False
    cfg, hydra_logging, verbose = composed
    configure_log(hydra_logging, verbose)
    base_dir = os.getcwd()
    typed = [o for o in overrides if not o.startswith("hydra.searchpath=")]
    run_and_report(lambda: _task_on(cfg, base_dir, typed, lambda: store_url(cfg.store.url, base_dir)))
    return True


def _task_on(cfg, base_dir, typed, url) -> None:
    try:
        _run_config(cfg, base_dir, typed, url)
    except RewardLensError as exc:            # one clear line, as _task
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _validate(run, resolved_yaml: str, base_dir: str) -> None:
    """Print the plan, the restrictions, the frame and the data check of a validated config (no model loaded).
    The output is remembered (``signed_cache``) under ``run.reuse.validate_key``: the same bytes again print it
    without planning; a refusal is never remembered."""
    key = validate_key(run, resolved_yaml, base_dir)
    found = read_signed("validate", key) if key else None
    if found is not None and isinstance(found.get("text"), str):
        print(found["text"])
        return
    lines: list[str] = []

    def say(line: str) -> None:                   # printed as it comes: a data refusal follows the plan
        print(line)
        lines.append(line)

    from .planning import plan_for, restricted_steps
    plan, _ = plan_for(run, base_dir)
    say(plan.describe())
    for k, steps in restricted_steps(run.observable, plan).items():
        say(f"observable.{k}={getattr(run.observable, k)} restricts: {', '.join(steps)}")
    if run.frame.name.value != "native":
        from .planning import frame_dependent
        src = f"stored frame {run.frame.id}" if run.frame.id else "fitted at run time or reused from the store"
        say(f"frame={run.frame.name.value} ({src}): outputs expressed in it: {frame_dependent(plan) or 'none'}")
    pairs = load_dataset(run.dataset, base_dir)     # the data refusals of a real run, before any model
    where = [run.dataset.kind] if run.dataset.name != run.dataset.kind else []   # the option the person chose
    where += [str(run.dataset.path)] if run.dataset.path else []
    say(f"data OK: {len(pairs)} pairs from dataset={run.dataset.name}" + (f" ({', '.join(where)})" if where else ""))
    say("plan OK (no model was loaded)")
    if key:
        write_signed("validate", key, {"text": "\n".join(lines)})


def _print_summary(out) -> None:
    """``report.summary.print_summary``; for a run reused from bytes, its block from the provenance the reuse
    read (``Outcome.provenance``: the store's JSON documents, no xarray), unless ``observable.pairs`` restricts
    outputs, whose count needs the stored result."""
    prov = out.provenance
    if not (out.reused and prov is not None and pairs_limit(prov) is None):
        print_summary(out)
        return
    lines = ([out.pairs_line] if out.pairs_line else []) + table_lines(prov.get("summary")) + [
        f"store: {out.store_url}", run_line(out.run_id, prov, True), f"run id: {out.run_id}"]
    sys.stdout.flush()
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _hydra_main(argv: list[str]) -> None:
    register_configs()
    sys.argv = [sys.argv[0]] + argv
    app = hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(_task)
    app()


def expand_checkpoints(argv: list[str]) -> list[str]:
    """``model.checkpoint=all`` → ``-m ... model.checkpoint=0,1,…,N-1``: every checkpoint of the composed model's
    sequence (``models.checkpoints``) as one Hydra multirun into one store. Other arguments pass unchanged."""
    if "model.checkpoint=all" not in argv:
        return argv
    rest = [a for a in argv if a != "model.checkpoint=all"]
    keep, i = [], 0                        # what names the model: its overrides and the user's config folders
    while i < len(rest):
        a = rest[i]
        if a == "--config-dir" and i + 1 < len(rest):
            keep += rest[i:i + 2]
            i += 1
        elif a.startswith(("model", "+model", "--config-dir=", "hydra.searchpath=")):
            keep.append(a)
        i += 1
    run, _ = compose_run(keep + ["model.checkpoint=0"])
    sweep = ",".join(str(k) for k in checkpoint_indices(run.model))
    flag = [] if any(a in ("-m", "--multirun") for a in rest) else ["-m"]
    return flag + rest + [f"model.checkpoint={sweep}"]


def _check_command(word: str) -> None:
    """Refuse a bare word (no ``=``, not a flag or a Hydra ``~key``/``+key``) that is not a command."""
    if word in COMMANDS or word in _HELP_FLAGS or not re.fullmatch(r"[A-Za-z_][\w.-]*", word):
        return
    raise SpecError("command", f"unknown command '{word}'.", value=word, options=COMMANDS,
                    fix="reward-lens-spec help lists the commands; a config choice is group=option.")


# Arrow's allocator for this process unless the user chose one: pandas holds string labels in Arrow arrays, and
# Arrow's default pool (mimalloc) keeps what it freed, ~10 MB a 100,000-label index built; the C library's
# returns it (benchmarks/results.md §25). Read by Arrow at its first allocation, so set before any.
ARROW_POOL = ("ARROW_DEFAULT_MEMORY_POOL", "system")
INTERRUPTED = ("interrupted (Ctrl-C): the chunks already stored are kept and an unfinished run is never listed; run the "
               "same command again to resume from them.")


def main(argv: list[str] | None = None) -> None:
    """The command line (``reward-lens-spec``): every warning one line on stderr while it runs."""
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line
        _main(argv)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line, ``warning: <message>`` (its category named unless a plain ``UserWarning``), no
    source line: what a person at the command line needs, not where in the package it was raised."""
    kind = "" if category is UserWarning else f"{category.__name__}: "
    print(f"warning: {kind}{message}", file=sys.stderr if file is None else file)


def _main(argv: list[str] | None) -> None:
    os.environ.setdefault(*ARROW_POOL)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cmd = argv[0] if argv else None
        for word in (argv[:1] + (argv[1:2] if cmd in ("help",) + _HELP_FLAGS else [])):
            _check_command(word)          # a mistyped command: one line, before Hydra or a help page
        if cmd in ("help",) + _HELP_FLAGS or any(a in _HELP_FLAGS for a in argv):
            argv = use_config_dirs(argv)[0]           # help lists the options of the user's folders too
        if cmd == "help" or (cmd in _HELP_FLAGS):
            print(help_text() if len(argv) < 2 or argv[1] not in COMMANDS else _command_doc(argv[1]))
            return
        if cmd in COMMANDS and cmd != "help" and any(a in _HELP_FLAGS for a in argv[1:]):
            print(_command_doc(cmd))
            return
        if cmd not in SUBCOMMANDS and any(a in _HELP_FLAGS for a in argv):
            print(help_text())
            return
        argv = use_words(argv)                # store.trust_file=PATH: this reader's trust root (store.trust_root)
        if cmd == "run":
            argv, cmd = argv[1:], None
        command = COMMANDS.get(cmd) if cmd in COMMANDS else None
        if command is not None and command.main:     # a subcommand: its own entry function (commands.Command)
            args = use_config_dirs(argv[1:])[0] if command.config_dirs else argv[1:]
            code = resolve_ref(command.main)(args)
            if cmd in LISTING_NOTES:                  # the listings print and return (no exit code)
                return
            raise SystemExit(code)
        if cmd == "validate":
            argv = argv[1:] + ["mode=validate"]
        argv = expand_checkpoints(argv)       # model.checkpoint=all: one multirun over the sequence
        argv = prepare(argv)                  # folders, files, safety, typos: run.compose, as every route
        os.environ.setdefault("HYDRA_FULL_ERROR", "0")
        if not _run_single(argv):             # composed once; else (sweeps, Hydra flags) Hydra's runner
            _hydra_main(argv)
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:                 # Ctrl-C: one line, no stack trace; nothing stored is lost
        print(INTERRUPTED, file=sys.stderr)
        raise SystemExit(130) from None
