"""The short table the main job prints: what was computed, where it went. Only computed numbers."""
from __future__ import annotations

import numpy as np


def _short(gauge: str) -> str:
    """``frame:whitened:<64 hex>`` → ``frame:whitened:<12 hex>`` (ids are long; 12 digits identify)."""
    head, _, tail = gauge.rpartition(":")
    return f"{head}:{tail[:12]}" if head and len(tail) == 64 else gauge


def print_summary(outcome) -> None:
    """Print one line per output variable (dims, units, mean over finite cells) and the store path."""
    if getattr(outcome, "status", "complete") != "complete":
        print(f"run {outcome.run_id}: this job's chunks are stored in {outcome.store_url}; the run is complete "
              "(and listed) once its last shard has finished")
        return
    if outcome.reused:
        print(f"run {outcome.run_id} is already complete in {outcome.store_url}: reused, not recomputed "
              "(store.force=true recomputes)")
        return
    ds = outcome.result
    print(f"{'variable':<28} {'dims':<34} {'units':<12} {'mean':>10}  gauge")
    for name, var in ds.data_vars.items():
        vals = np.asarray(var.values, dtype=float)
        fin = vals[np.isfinite(vals)]
        mean = f"{fin.mean():10.4f}" if fin.size else f"{'(no finite)':>10}"
        print(f"{name:<28} {' × '.join(var.dims):<34} {str(var.attrs.get('units', '')):<12} {mean}  "
              f"{_short(str(var.attrs.get('gauge', '')))}")
    if "margin" in ds and "pair" in ds["margin"].dims:
        margin = ds["margin"].transpose("pair", ...)
        m = np.asarray(margin.values, float).reshape(margin.sizes["pair"], -1)
        shares = [f"{(col[np.isfinite(col)] > 0).mean():.3f}" if np.isfinite(col).any() else "n/a" for col in m.T]
        label = (f" per objective ({', '.join(map(str, margin['objective'].values))})"
                 if "objective" in margin.dims else "")
        print(f"pairs: {margin.sizes['pair']}; chosen preferred (margin > 0){label}: {', '.join(shares)}")
    print(f"store: {outcome.store_url}")
    print(f"run id: {outcome.run_id}")
