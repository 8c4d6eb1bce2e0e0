"""``reward-lens-spec compare url=STORE a=RUN b=RUN [vars=margin,w_r] [paired=margin|none] [n_boot= ...]``.

Keys: ``n_boot``, ``n_perm``, ``n_null``, ``seed``, ``ci`` (``compare.runs.CompareParams``).

Compares two stored runs of two models on the same pairs (``compare.runs``), stores the result as
run ``compare-<hash>`` and prints one line per statistic; for the paired accuracy test
(``compare.paired``; by default on the margin) one line per subset and cell: both accuracies, their
difference with its paired bootstrap CI, McNemar's exact p and its Holm and Šidák adjustments.
Needs no model. Returns 0, or 2 after
printing the error (unknown key, a missing run, a ``GaugeError`` naming the variable and the fix).
"""
from __future__ import annotations

import sys

import numpy as np

from ..errors import RewardLensError, SpecError, did_you_mean

KEYS = ("url", "a", "b", "vars", "paired", "n_boot", "n_perm", "n_null", "seed", "ci")
USAGE = "reward-lens-spec compare url=STORE a=RUN_ID b=RUN_ID [vars=margin,w_r] [paired=margin|none]"


def parse_args(argv: list[str], keys: tuple, required: tuple, usage: str) -> dict:
    """``key=value`` arguments of a store-reading command (``compare``, ``drift``) → dict, with ``n_boot``,
    ``n_perm``, ``n_null``, ``seed`` as int and ``ci`` as a float in (0, 1); ``SpecError`` naming a bad key
    or value."""
    args: dict = {}
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq or key not in keys:
            raise SpecError(key or a, f"unknown argument.{did_you_mean(key, keys)}", options=keys, fix=usage)
        args[key] = value
    for key in required:
        if not args.get(key):
            raise SpecError(key, "is required.", fix=usage)
    for key, cast in (("n_boot", int), ("n_perm", int), ("n_null", int), ("seed", int), ("ci", float)):
        if key in args:
            try:
                args[key] = cast(args[key])
            except ValueError:
                raise SpecError(key, f"must be a {cast.__name__}, got {args[key]!r}.",
                                fix=f"e.g. {key}={0.95 if cast is float else 1000}.") from None
    if "ci" in args and not 0 < args["ci"] < 1:
        raise SpecError("ci", f"must lie in (0, 1), got {args['ci']}.", fix="e.g. ci=0.95.")
    return args


def parse(argv: list[str]) -> dict:
    """``compare``'s arguments (``parse_args``), ``vars`` and ``paired`` split on commas (``paired=none``: [])."""
    args = parse_args(argv, KEYS, ("url", "a", "b"), USAGE)
    args["vars"] = [v for v in args.get("vars", "").split(",") if v] or None
    if "paired" in args:
        names = [v for v in args["paired"].split(",") if v]
        if not names:
            raise SpecError("paired", "is empty.", fix="paired=margin (the default), paired=NAME,... or paired=none.")
        args["paired"] = [] if names == ["none"] else names
    return args


def _fmt(x) -> str:
    x = float(x)
    return f"{x:.4f}" if np.isfinite(x) else "nan"


def _paired_lines(name: str, ds) -> list[str]:
    """One line per subset and cell of a paired accuracy Dataset (``compare.paired``), then its family and seed."""
    extra = [d for d in ds["p_mcnemar"].dims if d != "subset"]
    cells = ds.stack(_c=extra) if extra else ds.expand_dims(_c=[0])
    out = []
    for i in range(cells.sizes["_c"]):
        c = cells.isel(_c=i)
        where = ", ".join(f"{d}={c[d].item()}" for d in extra)
        for s in c["subset"].values:
            r = c.sel(subset=s)
            label = f"{name} [{where + ', ' if where else ''}subset={s}]"
            out.append(f"{label:<40} acc_a {_fmt(r['accuracy_a'])}  acc_b {_fmt(r['accuracy_b'])}  diff "
                       f"{_fmt(r['accuracy_diff'])} CI [{_fmt(r['diff_ci_low'])}, {_fmt(r['diff_ci_high'])}]  McNemar "
                       f"p {_fmt(r['p_mcnemar'])}  Holm {_fmt(r['p_holm'])}  Sidak {_fmt(r['p_sidak'])}  "
                       f"n={int(r['n_pairs'])} (a only {int(r['n_a_only'])}, b only {int(r['n_b_only'])})")
    att = ds.attrs
    out.append(f"{name}: accuracy = {att.get('correct')}; family {att.get('family')}; paired bootstrap "
               f"n_boot={att.get('n_boot')} ci={att.get('ci')} seed={att.get('seed')}")
    return out


def _lines(name: str, ds) -> list[str]:
    if "p_mcnemar" in ds:
        return _paired_lines(name, ds)
    out = []
    extra = [d for d in ds["estimate" if "estimate" in ds else "cosine"].dims if d != "statistic"]
    cells = ds.stack(_c=extra) if extra else ds.expand_dims(_c=[0])
    for i in range(cells.sizes["_c"]):
        c = cells.isel(_c=i)
        where = ", ".join(f"{d}={c[d].item()}" for d in extra)
        label = f"{name}{f' [{where}]' if where else ''}"
        if "estimate" in ds:
            if "n_pairs" in c and int(c["n_pairs"]) == 0:
                continue                  # a cell that exists in neither run (listed below as skipped)
            for s in c["statistic"].values:
                r = c.sel(statistic=s)
                out.append(f"{label:<32} {str(s):<9} {_fmt(r['estimate']):>8}  CI [{_fmt(r['ci_low'])}, "
                           f"{_fmt(r['ci_high'])}]  p_perm {_fmt(r['p_perm'])}  n={int(c['n_pairs'])}")
        else:
            q = c["null_abs_cosine"]
            out.append(f"{label:<32} {'cosine':<9} {_fmt(c['cosine']):>8}  null |cos| q{q['quantile'].values[-1]:.2f} "
                       f"{_fmt(q.values[-1])}  p {_fmt(c['p_value'])}")
    done, absent = ds.attrs.get("cells_compared"), ds.attrs.get("cells_skipped")
    if done is not None:
        out.append(f"{name}: compared {len(done)} cells" + (f"; skipped {len(absent)} that hold no value in either "
                   f"run (they do not exist): {'; '.join(absent)}" if absent else "; skipped none"))
    return out


def main(argv: list[str] | None = None) -> int:
    from .runs import CompareParams, compare_runs

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
        params = CompareParams(**{k: args[k] for k in ("n_boot", "n_perm", "n_null", "seed", "ci") if k in args})
        rid, results, written = compare_runs(args["url"], args["a"], args["b"], args["vars"], params,
                                             paired=args.get("paired"))
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in sorted(results):
        print("\n".join(_lines(name, results[name])))
    print(f"{'stored' if written else 'already stored (reused)'}: {args['url']} run {rid}")
    return 0
