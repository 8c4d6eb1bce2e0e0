"""The short table the main job prints: what was computed, where it went. Only computed numbers."""
from __future__ import annotations

import numpy as np


def _short(gauge: str) -> str:
    """``frame:whitened:<64 hex>`` → ``frame:whitened:<12 hex>`` (ids are long; 12 digits identify)."""
    head, _, tail = gauge.rpartition(":")
    return f"{head}:{tail[:12]}" if head and len(tail) == 64 else gauge


def run_line(run_id: str, prov: dict, reused: bool, restricted: tuple[int, list[str]] | None = None) -> str:
    """One line from a stored run's provenance: the observable and model, computed or reused, trust, then the
    pairs in the one vocabulary (``data.accounting.pairs_phrase``: scored, excluded by reason, flagged by flag,
    restricted outputs)."""
    from ..data.accounting import pairs_phrase

    trust = prov.get("trust")
    if isinstance(trust, dict):
        trust = trust.get("level", trust.get("name", trust))
    eff = prov.get("effective_n") or {}
    how = "reused, not recomputed (store.force=true recomputes)" if reused else f"computed in {prov.get('wall_s')} s"
    return (f"run {run_id}: observable {prov.get('observable')}, model {prov.get('model')}; {how}; trust {trust}; "
            f"pairs {pairs_phrase(prov.get('excluded'), prov.get('pair_flags'), eff.get('n_scored'), restricted)}")


def _restricted(outcome, prov: dict):
    """The outputs ``observable.pairs`` restricts, read from the result (or the store, when reused)."""
    from ..data.accounting import pairs_limit, restricted_outputs
    from ..store import open_store

    limit = pairs_limit(prov)
    if limit is None:
        return None
    ds = outcome.result
    if ds is None:
        ds = open_store(outcome.store_url).load(outcome.run_id, prov.get("observable"))
    if hasattr(ds, "to_dataset"):
        ds = ds.to_dataset()
    return restricted_outputs(ds, limit)


def print_summary(outcome) -> None:
    """Print, as one block written at once (a multirun's jobs share one console): the pairs line when the
    executor deferred it, one line per output variable (dims, units, mean over finite cells) of a computed run;
    then, computed or reused, the store path and one line of the run's provenance (``run_line``), read back
    from the store. A shard whose run is not complete yet says which shard is done and what remains."""
    import sys

    from ..store import open_store

    lines = [outcome.pairs_line] if getattr(outcome, "pairs_line", None) else []
    if getattr(outcome, "status", "complete") != "complete":
        lines.append(shard_line(outcome))
    else:
        if not outcome.reused:
            lines += _table(outcome.result)
        prov = open_store(outcome.store_url).provenance(outcome.run_id)
        lines += [f"store: {outcome.store_url}", run_line(outcome.run_id, prov, outcome.reused,
                                                          _restricted(outcome, prov)),
                  f"run id: {outcome.run_id}"]
    sys.stdout.flush()
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


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


def _table(ds) -> list[str]:
    """The table's lines: one row per variable; its mean over finite cells is labelled with its n: the pairs it covers
    (``n pairs``, fewer than the run's where ``observable.pairs`` restricts it), or ``-`` without a pair dim."""
    from ..data.accounting import pairs_covered

    lines = [f"{'variable':<28} {'dims':<34} {'units':<12} {'mean':>10} {'n pairs':>8}  gauge"]
    for name, var in ds.data_vars.items():
        vals = np.asarray(var.values, dtype=float)
        fin = vals[np.isfinite(vals)]
        mean = f"{fin.mean():10.4f}" if fin.size else f"{'(no finite)':>10}"
        n = f"{pairs_covered(var)}" if "pair" in var.dims else "-"
        lines.append(f"{name:<28} {' × '.join(var.dims):<34} {str(var.attrs.get('units', '')):<12} {mean} {n:>8}  "
                     f"{_short(str(var.attrs.get('gauge', '')))}")
    if "margin" in ds and "pair" in ds["margin"].dims:
        margin = ds["margin"].transpose("pair", ...)
        m = np.asarray(margin.values, float).reshape(margin.sizes["pair"], -1)
        shares = [f"{(col[np.isfinite(col)] > 0).mean():.3f}" if np.isfinite(col).any() else "n/a" for col in m.T]
        label = (f" per objective ({', '.join(map(str, margin['objective'].values))})"
                 if "objective" in margin.dims else "")
        lines.append(f"pairs: {margin.sizes['pair']}; chosen preferred (margin > 0){label}: {', '.join(shares)}")
    return lines
