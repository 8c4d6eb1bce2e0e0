"""The short table the main job prints: what was computed, where it went. Only computed numbers."""
from __future__ import annotations

import numpy as np

from .summary_stats import summary_cell
import sys
from ..data.accounting import pairs_limit, pairs_phrase, restricted_outputs


def _short(gauge: str) -> str:
    """``frame:whitened:<64 hex>`` → ``frame:whitened:<12 hex>`` (ids are long; 12 digits identify)."""
    head, _, tail = gauge.rpartition(":")
    return f"{head}:{tail[:12]}" if head and len(tail) == 64 else gauge


def run_line(run_id: str, prov: dict, reused: bool, restricted: tuple[int, list[str]] | None = None) -> str:
    """One line from a stored run's provenance: the observable and model, computed or reused, trust, then the
    pairs in the one vocabulary (``data.accounting.pairs_phrase``: scored, excluded by reason, flagged by flag,
    restricted outputs)."""
    trust = prov.get("trust")
    if isinstance(trust, dict):
        trust = trust.get("level", trust.get("name", trust))
    eff = prov.get("effective_n") or {}
    how = "reused, not recomputed (store.force=true recomputes)" if reused else f"computed in {prov.get('wall_s')} s"
    return (f"run {run_id}: observable {prov.get('observable')}, model {prov.get('model')}; {how}; trust {trust}; "
            f"pairs {pairs_phrase(prov.get('excluded'), prov.get('pair_flags'), eff.get('n_scored'), restricted)}")


def _restricted(outcome, prov: dict):
    """The outputs ``observable.pairs`` restricts, read from the result (or the store, when reused)."""
    from ..store import open_store

    limit = pairs_limit(prov)
    if limit is None:
        return None
    ds = outcome.result
    if ds is None:
        ds = open_store(_store(outcome)).load(outcome.run_id, prov.get("observable"))
    if hasattr(ds, "to_dataset"):
        ds = ds.to_dataset()
    return restricted_outputs(ds, limit)


def _store(outcome):
    """The run's store handle (``Outcome.store``), else its URL."""
    return getattr(outcome, "store", None) or outcome.store_url


def print_summary(outcome) -> None:
    """Print, as one block written at once (a multirun's jobs share one console): the pairs line when the
    executor deferred it; then, computed or reused, the table (``table_lines``: one line per output variable,
    its fitting statistic, from the run document), the store path and one line of the run's provenance (``run_line``), read back
    from the store. A shard whose run is not complete yet says which shard is done and what remains."""
    from ..store import open_store

    lines = [outcome.pairs_line] if getattr(outcome, "pairs_line", None) else []
    if getattr(outcome, "status", "complete") != "complete":
        lines.append(shard_line(outcome))
    else:
        prov = open_store(_store(outcome)).provenance(outcome.run_id)
        lines += table_lines(prov.get("summary"))
        lines += [f"store: {outcome.store_url}", run_line(outcome.run_id, prov, outcome.reused,
                                                          _restricted(outcome, prov)) + job_note(outcome),
                  f"run id: {outcome.run_id}"]
    sys.stdout.flush()
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def job_note(outcome) -> str:
    """What this job did that the stored provenance cannot say: it resumed chunks an earlier job stored, or
    completed a sharded run whose other chunks other shards' jobs stored, or another job completed the same run
    first (the stored copy and its wall time are that job's)."""
    if not getattr(outcome, "published", True):
        return ("; another job completed the same run first: the stored copy and its wall time are that job's "
                "(this job's own copy is not listed; `store gc` removes it)")
    n, k = getattr(outcome, "chunks", 0), getattr(outcome, "computed", 0)
    if not 0 <= k < n:
        return ""
    if getattr(outcome, "shard", (0, 1))[1] > 1:
        return f"; this job computed {k} of {n} chunk(s), the other shards' jobs the rest"
    return f"; resumed: {n - k} of {n} chunk(s) were stored by an earlier job"


def shard_line(outcome) -> str:
    """What a shard job that did not complete its run did, and what the run still needs."""
    shard, shards = outcome.shard
    missing = list(outcome.missing)
    head = (f"run {outcome.run_id}: shard {shard} of store.shards={shards} done; "
            f"{outcome.chunks - len(missing)} of {outcome.chunks} chunk(s) stored in {outcome.store_url}; ")
    if not missing:
        return head + "another job is completing the run; it is listed once that job has finished."
    waiting = sorted({k % shards for k in missing})
    return head + (f"{len(missing)} remain, for shard(s) {', '.join(map(str, waiting))}: the run is listed once "
                   "they have finished (the job storing the last chunk completes it; nothing is listed before).")


def summary_of(ds) -> dict:
    """What the console table shows, computed once from the stored outputs at completion and kept in the run
    document (``summary``), so a rerun prints the same table without reading an array: per output variable its
    dims, units, the statistic that fits it (``summary_stats.summary_cell``), the pairs it covers (``n_pairs``,
    ``None`` without a ``pair`` dim) and its gauge; and, where a ``margin`` with a ``pair`` dim exists, the
    share of pairs whose margin is positive (per objective)."""
    rows = []
    for name, var in ds.data_vars.items():
        n = None
        if "pair" in var.dims:
            other = [d for d in var.dims if d != "pair"]
            n = int(np.isfinite(var).any(other).sum()) if other else int(np.isfinite(var).sum())
        rows.append({"variable": name, "dims": list(var.dims), "units": str(var.attrs.get("units", "")),
                     "summary": summary_cell(var, None if n is None else n > 0),   # n > 0: a finite cell
                     "n_pairs": n, "gauge": str(var.attrs.get("gauge", ""))})
    out = {"rows": rows}
    if "margin" in ds and "pair" in ds["margin"].dims:
        margin = ds["margin"].transpose("pair", ...)
        m = np.asarray(margin.values, float).reshape(margin.sizes["pair"], -1)
        out["pairs"] = int(margin.sizes["pair"])
        out["chosen_preferred"] = [float((col[np.isfinite(col)] > 0).mean()) if np.isfinite(col).any() else None
                                   for col in m.T]
        if "objective" in margin.dims:
            out["objectives"] = [str(o) for o in margin["objective"].values]
    return out


def table_lines(summary: dict | None) -> list[str]:
    """The table's lines from a run document's ``summary`` (``summary_of``): one row per variable, its statistic
    named in the cell and labelled with its n (``n pairs``: the pairs it covers, fewer than the run's where
    ``observable.pairs`` restricts it; ``-`` without a pair dim). An older run without one prints no table."""
    if not isinstance(summary, dict) or not isinstance(summary.get("rows"), list):
        return []
    lines = [f"{'variable':<28} {'dims':<34} {'units':<12} {'summary':<28} {'n pairs':>8}  gauge"]
    for r in summary["rows"]:
        n = "-" if r.get("n_pairs") is None else str(r["n_pairs"])
        lines.append(f"{r['variable']:<28} {' × '.join(r['dims']):<34} {r['units']:<12} {r['summary']:<28} "
                     f"{n:>8}  {_short(r['gauge'])}")
    if "chosen_preferred" in summary:
        shares = ["n/a" if v is None else f"{v:.3f}" for v in summary["chosen_preferred"]]
        label = f" per objective ({', '.join(summary['objectives'])})" if summary.get("objectives") else ""
        lines.append(f"pairs: {summary['pairs']}; chosen preferred (margin > 0){label}: {', '.join(shares)}")
    return lines
