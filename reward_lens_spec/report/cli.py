"""``reward-lens-spec report url=STORE out=DIR [format=html|png] [run=ID|all]``: a report from a store; no model.

``format=html`` (the default without ``run=``) writes ``DIR/index.html``: one self-contained page
with the catalog of every complete run and a section per run (``report.build``). ``format=png``
(the default with ``run=``) writes PNG plots and a markdown summary per run (``report.plots``):
``run=ID`` draws one run, ``run=all`` every complete run. Returns 0, or 2 after printing the
error (unknown key or format, missing ``url``, ``run=`` with ``format=html``, ``out=`` naming a file,
``StoreError``).
"""
from __future__ import annotations

import os
import sys

from ..errors import RewardLensError, SpecError, did_you_mean
from ..store import open_store

KEYS = ("url", "run", "out", "format")
FORMATS = ("html", "png")
USAGE = "reward-lens-spec report url=STORE out=DIR"


def parse(argv: list[str]) -> dict:
    """``key=value`` arguments → dict; ``SpecError`` for an unknown key or format, or a missing ``url``."""
    args = {"out": "report"}
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq or key not in KEYS:
            raise SpecError(key or a, f"unknown argument.{did_you_mean(key, KEYS)}", options=KEYS, fix=USAGE)
        args[key] = value
    if "url" not in args:
        raise SpecError("url", "the store to read is required.", fix="reward-lens-spec report url=outputs/store.zarr")
    args.setdefault("format", "png" if "run" in args else "html")     # run=ID alone keeps its PNG plots
    if args["format"] not in FORMATS:
        raise SpecError("format", f"unknown format {args['format']!r}.{did_you_mean(args['format'], FORMATS)}",
                        options=FORMATS)
    if args["format"] == "html" and "run" in args:
        raise SpecError("run", "the html report lists every complete run; run= selects runs for PNG plots.",
                        fix=f"{USAGE} (all runs), or drop format=html to draw one run's PNG plots")
    args.setdefault("run", "all")
    if os.path.exists(args["out"]) and not os.path.isdir(args["out"]):
        raise SpecError("out", f"{args['out']} is a file; the report is written into a folder.",
                        fix="set out= to a folder (created when missing), e.g. out=outputs/report.")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints one line per file written. PNG plots without matplotlib: one line naming the
    extra, exit 2 (the HTML page needs no matplotlib)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
        if args["format"] == "html":
            from .build import build_report
            print(build_report(args["url"], args["out"]))
            return 0
        try:
            import matplotlib  # noqa: F401  (a check only)
        except ImportError:
            raise SpecError("report", "plots need matplotlib, which is not installed.",
                            fix="pip install 'reward_lens_spec[full]'") from None
        from .plots import plot_run
        if args["run"] == "all":
            runs = list(open_store(args["url"]).runs()["run_id"])
        else:
            runs = [args["run"]]
        for run_id in runs:
            for path in plot_run(args["url"], run_id, args["out"]):
                print(path)
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
