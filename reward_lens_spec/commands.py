"""The ``reward-lens-spec`` commands, one ``Command`` each in ``registries.COMMANDS`` (in help order), and the
listing commands of the registries (``ops``, ``readers``, ``criteria``, ``organisms``).

A ``Command`` names its entry function by a lazy reference (``"package.module:function"``, taking the
arguments after the command word and returning an exit code), so a command's heavy imports stay off every
other command's path; ``doc`` names the module whose docstring is its ``--help`` text.
"""
from __future__ import annotations

from dataclasses import dataclass

from .registries import COMMANDS, CRITERIA, DATASET_READERS, ORGANISMS, first_line


@dataclass(frozen=True)
class Command:
    """One command word: ``args`` (its argument line), ``description`` (one line for ``help``), ``main`` (a
    ``"package.module:function"`` reference; empty for ``run``, ``validate`` and ``help``, which ``cli`` runs
    itself), ``doc`` (the module whose docstring is its ``--help``), ``config_dirs`` (the arguments may name
    the user's config folders)."""

    name: str
    args: str
    description: str
    main: str = ""
    doc: str = ""
    config_dirs: bool = False


for _c in (
        Command("run", "[group=option ...] [group.key=value ...]", "run the composed config (the default command; "
                "-m for a sweep)"),
        Command("validate", "[overrides ...]", "check the config and the data, print the plan; loads no model"),
        Command("ops", "[NAME]", "registered operators: params, defaults, dims; NAME: its whole docstring",
                "reward_lens_spec.commands:ops_main"),
        Command("readers", "[NAME]", "dataset readers (dataset=NAME): format, parameters; NAME: its docstring",
                "reward_lens_spec.commands:readers_main"),
        Command("criteria", "[NAME]", "calibration criteria: floor, magnitude band, organisms; NAME: its reading",
                "reward_lens_spec.commands:criteria_main"),
        Command("organisms", "[NAME]", "model organisms (calibrate organism=NAME); NAME: the criteria that grade "
                "it", "reward_lens_spec.commands:organisms_main"),
        Command("store", "ls|show|diff|export|gc|migrate url=STORE ...", "browse a result store; loads no model",
                "reward_lens_spec.store.catalog_cli:main", "store.catalog_cli"),
        Command("compare", "url=STORE a=RUN b=RUN [vars=...] [paired=...]", "two models' runs: margins, paired "
                "accuracy tests; directions in a shared frame", "reward_lens_spec.compare.cli:main", "compare.cli"),
        Command("report", "url=STORE [run=RUN|all] [out=DIR]", "plots and markdown from a store; loads no model",
                "reward_lens_spec.report.cli:main", "report.cli"),
        Command("calibrate", "observable=NAME [organism=...]", "trust scorecard on planted model organisms",
                "reward_lens_spec.trust.cli:calibrate_main", "trust.cli", True),
        Command("freeze", "experiment=NAME", "hash and store a study before any data is read",
                "reward_lens_spec.trust.cli:freeze_main", "trust.cli", True),
        Command("adjudicate", "experiment=NAME", "score a frozen study's predictions against its runs",
                "reward_lens_spec.trust.cli:adjudicate_main", "trust.cli", True),
        Command("fit", "model=... dataset=... out=DIR", "fit a Bradley–Terry head on frozen features",
                "reward_lens_spec.fit.cli:main", "fit.cli"),
        Command("export", "url=STORE run=RUN what=steer|erase|head out=FILE.safetensors", "steering vector, LEACE "
                "eraser or head as safetensors", "reward_lens_spec.export:main", "export"),
        Command("drift", "url=STORE observable=NAME [model=NAME]", "a checkpoint sequence's runs over training: "
                "margins, CKA, directions", "reward_lens_spec.compare.drift:main", "compare.drift"),
        Command("monitor", "url=STORE observable=NAME [statistic=margin|accuracy] [alpha=]", "anytime-valid alarm "
                "when a checkpoint sequence's margin or accuracy moves", "reward_lens_spec.compare.monitor:main",
                "compare.monitor"),
        Command("help", "", "this list")):
    COMMANDS.register(_c)

LISTING_NOTES = {
    "ops": "Each operator: first docstring line, params (type = default, or required), inputs, dims (input → "
           "output) and the observable restrictions it honours.",
    "readers": "Each reader: name (dataset.kind), description, where the format is defined, the dataset keys it "
               "honours.",
    "criteria": "Each criterion: floor (its floor value must reach it), magnitude band (rtol, where a planted "
                "reward-unit truth exists), exact / cells checks, the organism kinds it grades.",
    "organisms": "Each family of model organisms: name (calibrate organism=NAME) and what it plants, one organism "
                 "per strength.",
}


def ops_main(args: list[str]) -> None:
    from .registry import describe_operator, list_operators

    if args:
        print(describe_operator(args[0], full=True))
        return
    print("\n".join(describe_operator(n) for n in list_operators()))
    print("\n`reward-lens-spec ops NAME` prints an operator's whole docstring; "
          "observables compose them in YAML (docs/observables.md).")


def _reader_line(name: str) -> str:
    r = DATASET_READERS.get(name, "readers")
    return (f"{name:<16} {r.description}\n{'':<16} keys: {', '.join(r.open_dataset_parameters)}"
            + (f"; {r.url}" if r.url else ""))


def readers_main(args: list[str]) -> None:
    if args:
        r = DATASET_READERS.get(args[0], "readers")
        print(_reader_line(args[0]) + "\n\n" + (type(r).__doc__ or "").strip())
        return
    print("\n".join(_reader_line(n) for n in DATASET_READERS))
    print("\nA reader is chosen with dataset=<name> (or dataset.kind=<name>); docs/extending.md adds one.")


def _criterion_line(name: str) -> str:
    c = CRITERIA.get(name, "criteria")
    checks = [f"floor {c.floor:g}"] + ([f"rtol {c.rtol:g}"] + (["exact"] if c.exact else []) if c.rtol else []) \
        + (["cells"] if c.cells is not None else [])
    return f"{name:<22} {', '.join(checks)}; organisms: {', '.join(c.kinds) or 'any'}\n{'':<22} {c.floor_what}"


def criteria_main(args: list[str]) -> None:
    if args:
        c = CRITERIA.get(args[0], "criteria")
        print(_criterion_line(args[0]) + f"\n\nreads: {', '.join(c.needs)}; "
              f"{first_line(c.reading) or 'per-pair reading against the planted strength'}")
        return
    print("\n".join(_criterion_line(n) for n in CRITERIA))
    print("\n`reward-lens-spec calibrate observable=NAME` grades an observable's outputs by these "
          "(docs/trust.md).")


def organisms_main(args: list[str]) -> None:
    if args:
        f = ORGANISMS.get(args[0], "organisms")
        graded = [n for n in CRITERIA if f.name in CRITERIA[n].kinds]
        print(f"{f.name:<20} {f.description}\n\ngraded by: {', '.join(graded) or 'the criteria for any organism'}")
        return
    print("\n".join(f"{n:<20} {ORGANISMS[n].description}" for n in ORGANISMS))
    print("\n`reward-lens-spec calibrate observable=NAME organism=ORGANISM` builds one organism per strength and "
          "grades the observable on it (docs/trust.md).")
