"""``reward-lens-spec report url=STORE run=ID|all out=DIR``: plots + markdown from a store; no model.

``run=all`` (or no ``run``) draws every complete run. Returns 0, or 2 after printing the error
(unknown key, missing ``url``, ``StoreError``).
"""
from __future__ import annotations

import sys

from ..errors import RewardLensError, SpecError, did_you_mean

KEYS = ("url", "run", "out")


def parse(argv: list[str]) -> dict:
    """``key=value`` arguments → dict; ``SpecError`` for an unknown key or a missing ``url``."""
    args = {"run": "all", "out": "report"}
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq or key not in KEYS:
            raise SpecError(key or a, f"unknown argument.{did_you_mean(key, KEYS)}", options=KEYS,
                            fix="reward-lens-spec report url=STORE run=ID out=DIR")
        args[key] = value
    if "url" not in args:
        raise SpecError("url", "the store to read is required.", fix="reward-lens-spec report url=outputs/store.zarr")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point; prints one line per file written. Without matplotlib: one line naming the extra, exit 2."""
    from .plots import plot_run

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SpecError("report", "plots need matplotlib, which is not installed.",
                            fix="pip install 'reward_lens_spec[full]'") from None
        if args["run"] == "all":
            from ..store import open_store
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
