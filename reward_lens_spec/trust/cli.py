"""``reward-lens-spec calibrate | freeze | adjudicate`` — key=value arguments, no Hydra.

    calibrate  observable=NAME [organism=planted|trained_keyword|... (registries.ORGANISMS;
               `reward-lens-spec organisms` lists them)] [base=tiny_llama] [n_pairs=12] [seed=0]
               [dtype=float32|bfloat16|float16] [store.url=PATH]
    calibrate  organism=training [read=checkpoint_dynamics] [store.url=PATH]: grade ``drift`` on the training
               organism's checkpoint sequence stored in store.url (``trust.drift_card``); the card goes there
    freeze     experiment=NAME [amend=true] [store.url=PATH]
    adjudicate experiment=NAME [runs=ID,ID] [study_hash=PREFIX] [store.url=PATH]

``store.url`` defaults to ``outputs/store.zarr`` under the current directory
(the main app's default). Each returns an exit code: 0 done (calibrate: card
passed), 1 calibrate: card written but failed, 2 a ``RewardLensError`` (printed).
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import RewardLensError, SpecError
from ..run.compose import store_url

_COMMON = ("store.url",)


def parse_args(argv: list[str], allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    """``key=value`` list → dict; ``SpecError`` for a bare word, an unknown or a missing key."""
    out = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq:
            raise SpecError(arg, "arguments are key=value.", fix=f"keys: {', '.join(allowed + _COMMON)}")
        if key not in allowed + _COMMON:
            raise SpecError(key, "unknown argument.", value=key, options=allowed + _COMMON)
        out[key] = value
    for k in required:
        if k not in out:
            raise SpecError(k, "required.", fix=f"add {k}=...")
    out["store.url"] = store_url(out.get("store.url") or None, str(Path.cwd()))
    return out


def _bool(v: str, key: str) -> bool:
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise SpecError(key, f"expected true or false, got '{v}'.", fix=f"set {key}=true or {key}=false.")


def _int(v: str, key: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise SpecError(key, f"expected an integer, got '{v}'.", fix=f"e.g. {key}=1000.") from None


def _guard(fn, argv) -> int:
    try:
        return fn(list(argv))
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def calibrate_main(argv: list[str]) -> int:
    """Grade ``observable`` on an organism family, print per-strength readings, write the card."""
    def run(argv):
        from .scorecard import grade, write_card
        a = parse_args(argv, ("observable", "organism", "base", "n_pairs", "seed", "read", "dtype"),
                       () if "organism=training" in argv else ("observable",))
        if a.get("organism") == "training":
            from .drift_card import grade_drift
            card = grade_drift(a["store.url"], a.get("read", "checkpoint_dynamics"))
        else:
            card = grade(a["observable"], organism=a.get("organism", "planted"), base=a.get("base", "tiny_llama"),
                         n_pairs=_int(a.get("n_pairs", "12"), "n_pairs"), seed=_int(a.get("seed", "0"), "seed"),
                         dtype=a.get("dtype", "float32"))
        print(card.describe())
        rid = write_card(card, a["store.url"])
        print(f"card: {rid} in {a['store.url']}")
        return 0 if card.passed else 1
    return _guard(run, argv)


def freeze_main(argv: list[str]) -> int:
    """Freeze study ``experiment`` in the store (before any of its runs)."""
    def run(argv):
        from .studies import freeze, predictions
        a = parse_args(argv, ("experiment", "amend"), ("experiment",))
        rec = freeze(a["experiment"], a["store.url"], amend=_bool(a.get("amend", "false"), "amend"))
        state = "already frozen" if rec["reused"] else "frozen"
        print(f"study {rec['study_id']} {state} at {rec['frozen_at']} in {a['store.url']}")
        for r in rec.get("amended_after_refutation") or []:
            print(f"  amended after refutation: version {r['study_hash'][:12]} refuted {', '.join(r['refuted'])}")
        for p in predictions(rec["study"]):
            m = p["metric"]
            print(f"  {p['id']}: {m.get('reduce', 'mean')}({m['variable']} {m.get('select') or ''}) "
                  f"{p['comparator']} {p['threshold']}")
        return 0
    return _guard(run, argv)


def adjudicate_main(argv: list[str]) -> int:
    """Score a frozen study's predictions on its runs; print and store the outcome."""
    def run(argv):
        from .studies import adjudicate
        a = parse_args(argv, ("experiment", "runs", "study_hash"), ("experiment",))
        runs = [r for r in a["runs"].split(",") if r] if a.get("runs") else None
        rec = adjudicate(a["experiment"], a["store.url"], run_ids=runs, shash=a.get("study_hash"))
        print(f"study {rec['study_id']} (frozen {rec['frozen_at']}) on runs {', '.join(rec['runs'])}")
        for p in rec["predictions"]:
            vals = ", ".join("nan" if v is None else f"{v:.4g}" for v in rec["values"][p["id"]])
            print(f"  {p['id']}: [{vals}] {p['comparator']} {p['threshold']} -> {rec['outcome'][p['id']]}")
        for r in rec.get("amended_after_refutation") or []:
            print(f"amended after refutation: version {r['study_hash'][:12]} refuted {', '.join(r['refuted'])} "
                  f"({r['adjudication']})")
        print(f"trust: {rec['trust']}; record {rec['run_id']}" + (" (already adjudicated, kept)"
                                                                   if rec.get("reused") else ""))
        return 0
    return _guard(run, argv)
