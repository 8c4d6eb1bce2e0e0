"""A plan in two stages, streamed into the store: memory bounded by the chunk, resumable, sharded.

Stage 1 (``planning.stages`` → ``"pair"``): the capture pass and every step that acts pair by pair run one chunk of
``store.chunk_pairs`` pairs at a time. Each chunk's outputs are written to its region of the run's arrays (Zarr
region writes; the arrays' pair chunks are the run's chunks), then a marker ``_ctl/chunk.<k>.json`` records it.
Per-pair steps that only reductions read go to a scratch group (``_stage``); every other intermediate is dropped as
soon as no later step of the chunk reads it, so no step holds more than one chunk's activations.

Stage 2 (``"reduce"``): after the last chunk, whoever wrote it runs the steps that reduce over pairs on the stored
arrays, opened lazily (dask), writes their outputs next to the per-pair ones, and completes the run (``store.
attempts``: the run document names the attempt). In memory (``run.executor.compute``): this executor, ``memory://``.

Passes (``planning.passes``): a pair-stage step that reads a reduction (steering along a mean difference direction)
runs in a later pass: after the reductions it needs, the completing job captures each chunk again and writes that
pass's regions (markers ``pass<p>.chunk.<k>``), then runs the reductions of that pass. Every step of a plan runs in
exactly one such stage of one pass.

A pair-stage step whose rows read every pair's capture (``Operator.needs_all_pairs``: mean or resample ablation,
steering in units of the residual's RMS over pairs) makes the run one chunk: its memory is that of the dataset.

Resume and shards: a job computes the chunks ``k`` with ``k % store.shards == store.shard`` that have no marker yet,
or whose marker is not this user's as written (``Attempt.authentic``) or whose data no longer match the digests it
records (a job re-reads every chunk it adopts, the completing job every chunk of the run), in the attempt it shares
with its launch (``store.launch``, or Hydra's sweep dir) or adopts from a dead writer (``store.attempts``). Chunks
are the same pairs whoever computes them, so a resumed or sharded run is bit-identical to one uninterrupted job. A
killed writer on this host is seen dead at once (its process is gone); one on another host only when its lease
expires (``store.attempts.LEASE_S``, 60 s): a rerun started elsewhere before that computes the run in an attempt of
its own instead of resuming. A forced run (``store.force``) never adopts an attempt that completed: it recomputes.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

import numpy as np

from ..arrays import new_array
from ..context import RunContext, pair_positions, pairs_at, take_pairs
from ..errors import SpecError, StoreError
from ..models.pair_ids import joined_utf8
from ..planning import data_dims, data_widths, passes, stages
from ..result import Result
from ..store.attempts import PREFIX, Attempt, list_attempts
from ..store.completion import complete
from ..store.digest import KEY as DIGESTS, result_digests
from ..store.groups import open_variable, open_variables, variable_values, write_variables
from ..store.published import HIDDEN
from ..store.stored_inputs import StoredInputs
from ..store.writer import check_storable, discard_unstarted, observable_attrs, with_digests
from ..store.staged import staged_values
from ..store.zarr_io import Written
from .chunk_checks import unverified_chunks
from .heap import trim_heap
from .stream_arrays import ensure_skeleton, label_group, labels_once, pad_widths, region_digests, write_region

SCRATCH = "_stage"           # not a valid observable name (store.writer.check_name), so no clash
READOUT_H = "readout_h"
HEAD_LOGITS = "head_logits"  # the model's own head output (pair × side × output): the identities' reference
EAGER_BYTES = 2**20         # an output up to this size is read whole when the run completes; a bigger one lazily
KEEP_PREFIX_MAX = 64         # patched rows whose prefix KV cache a capture keeps (capture(keep_prefix=))
STAGED_BYTES = 16 * 2**20    # a one-chunk run up to this size keeps what it wrote for its completion (store.staged)


@dataclass
class Streamed:
    status: str              # "complete", or "shard_done": this job's chunks are in, others are not yet
    attempt: str
    chunks: int              # chunks in the run
    computed: int            # chunks this job computed
    context: object = None   # the last chunk's RunContext (``keep_context``; one chunk: the whole run's)
    missing: tuple = ()      # chunks of the run not stored yet (``shard_done``)
    result: Result | None = None   # the outputs as stored, read at completion (attrs: the published group's);
                                   # None unless this job completed the run; bigger ones dask-backed (EAGER_BYTES)


def chunk_slices(n: int, size: int) -> list[slice]:
    """Pair chunks ``[k·size, (k+1)·size)`` of ``n`` pairs."""
    return [slice(a, min(a + size, n)) for a in range(0, n, size)]


def subset(enc, sl: slice):
    """``EncodedPairs`` of the pairs in ``sl`` (pair-aligned fields sliced, the rest shared)."""
    aligned = ("pair_ids", "chosen", "rejected") + tuple(getattr(type(enc), "pair_aligned", ()))
    return replace(enc, **{k: getattr(enc, k)[sl] for k in aligned})


class _Readout:
    """What a reduce step sees as ``ctx.capture``: the stored readout ``h`` (pair × side × d_model). A step
    that needs capture sites or model re-runs is a pair-stage step (``planning.stages``), never a reduction."""

    def __init__(self, arr):
        self._arr, self._h = arr, None

    @property
    def h(self) -> np.ndarray:
        if self._h is None:
            if self._arr is None:
                raise StoreError("a reduce step read the capture, but the run stored no readout h.")
            self._h = np.asarray(self._arr.values, np.float32)
        return self._h


def check_sharding(store_spec) -> None:
    """Plan-time checks of ``store.chunk_pairs`` / ``store.shard`` / ``store.shards``."""
    if store_spec.chunk_pairs < 1:
        raise SpecError("store.chunk_pairs", f"must be ≥ 1, got {store_spec.chunk_pairs}.",
                        fix="e.g. store.chunk_pairs=64")
    if store_spec.shards < 1 or not 0 <= store_spec.shard < store_spec.shards:
        raise SpecError("store.shard", f"shard {store_spec.shard} of {store_spec.shards}: need 0 ≤ store.shard < "
                        "store.shards.", fix="e.g. store.shard=0,1,2,3 store.shards=4 with --multirun")


def launch_key(store_spec) -> str | None:
    """What the jobs of one launch share: ``store.launch``, else Hydra's sweep dir in a multirun."""
    if store_spec.launch:
        return str(store_spec.launch)
    try:
        from hydra.core.hydra_config import HydraConfig
        hc = HydraConfig.get()
        return str(hc.sweep.dir) if str(hc.mode) .endswith("MULTIRUN") else None
    except Exception:
        return None


def stream(b, run_id, lm, pairs, enc, plan, info, *, capture_kw, frame, store_spec, run_attrs, progress=False,
           keep_context=False):
    """Compute this job's chunks of ``plan`` into attempt storage; complete the run after the last.

    ``run_attrs(counts, chunk_info, stored outputs, head logits) -> dict``: the run's attrs, called
    once by the completing job (head logits: pair × side × output, the model's own, reward units).
    ``keep_context``: hand back the last chunk's ``RunContext`` (its capture, counts) in ``Streamed.context``.
    Returns ``Streamed``. Raises ``StoreError`` (lease lost, store damaged) and the operators' errors.
    """
    check_sharding(store_spec)
    st = stages(plan)
    if any(s.op.needs_all_pairs for s in plan.steps if st[s.name] == "pair"):   # e.g. mean ablation: its rows
        store_spec = replace(store_spec, chunk_pairs=max(1, len(enc.pair_ids)))  # read every pair's capture
    n, size, shards = len(enc.pair_ids), store_spec.chunk_pairs, store_spec.shards
    slices = chunk_slices(n, size)
    widths = data_widths(plan, RunContext(lm=lm, pairs=pairs, encoded=enc, capture=None, info=info))
    meta = {"kind": "stream", "shards": shards, "chunk_pairs": size, "n_pairs": n, **({"widths": widths} if widths
            else {}), "pairs_sha": hashlib.sha256(joined_utf8(enc.pair_ids)).hexdigest()[:16]}
    att, role = _attempt(b, run_id, meta, store_spec.shard, launch_key(store_spec), store_spec.force)
    try:
        return _run(att, role, b, run_id, lm, pairs, enc, plan, info, st, slices, capture_kw, frame,
                    store_spec, run_attrs, progress, keep_context, widths)
    except BaseException:
        discard_unstarted(att)         # failed before any chunk was stored: leave nothing behind
        raise
    finally:
        att.close()


def _attempt(b, run_id, meta, shard, launch, force=False):
    """Adopt the oldest matching attempt whose ``shard-<i>`` role is free or dead (not completed, with ``force``)."""
    role = f"shard-{shard}"
    found = [a for a in (Attempt.open(b, run_id, aid) for aid in list_attempts(b, run_id)) if a is not None]
    tag = hashlib.sha256(launch.encode()).hexdigest()[:16] if launch else None
    for att in found:             # jobs of one launch that split the chunks differently never complete the run
        if tag and att.meta.get("launch") == tag and att.meta.get("shards") != meta["shards"]:
            raise SpecError("store.shards", f"this job has store.shards={meta['shards']}, but another job of the "
                            f"same launch ({launch}) started run {run_id} with store.shards={att.meta.get('shards')}"
                            " (attempt " + att.aid + "): their chunks would never make one complete run.",
                            fix="give every job of one launch the same store.shards (e.g. -m store.shards=2 "
                                "store.shard=0,1); a new launch (store.launch=NAME) to start over.")
    for att in sorted(found, key=lambda a: (a.meta.get("created") or 0, a.aid)):
        if all(att.meta.get(k) == v for k, v in meta.items()) and not (force and att.released("reduce")) and \
                att.claim(role):
            return att, role
    aid = None
    if launch:
        aid = PREFIX + hashlib.sha256(json.dumps([run_id, meta, launch], sort_keys=True).encode()).hexdigest()[:16]
    return Attempt.create(b, run_id, {**meta, "launch": tag} if tag else meta, aid=aid, role=role), role


def _run(att, role, b, run_id, lm, pairs, enc, plan, info, st, slices, capture_kw, frame, store_spec,
         run_attrs, progress, keep_context, widths):
    out_g, scr_g = plan.observable, SCRATCH          # groups of the attempt's own zarr store (att.zarr_store())
    ps = passes(plan, st)
    last_pass = max(ps.values(), default=0)
    later = {i for s in plan.steps for i in s.inputs            # pair-stage arrays a later stage reads back
             if st[i] == "pair" and (st[s.name] == "reduce" or ps[s.name] > ps[i])}
    keep = {s.name for s in plan.steps if st[s.name] == "pair" and (s.name in plan.outputs or s.name in later)}
    need_h = any(s.op.reads_capture for s in plan.steps if st[s.name] == "reduce")
    full_coords = RunContext(lm=lm, pairs=pairs, encoded=enc, capture=None, info=info).pair_coords()
    labels = labels_once(att, {scr_g: out_g})
    shared = dict(labels=labels, b=b, stores=StoredInputs(b), lm=lm, pairs=pairs, enc=enc, plan=plan, info=info,
                  positions=pair_positions(pairs, enc.pair_ids),      # a chunk's operators see its pairs only
                  st=st, ps=ps, slices=slices, keep=keep, capture_kw=capture_kw, frame=frame, need_h=need_h,
                  full_coords=full_coords, groups=(out_g, scr_g), size=store_spec.chunk_pairs,
                  keep_context=keep_context, staged=Written(),   # keys and values written (a one-chunk run)
                  pads={name: {d: widths[d] for d in dims} for name, dims in data_dims(plan).items()})
    done = att.chunks_done()
    ours = [k for k in range(len(slices)) if k % store_spec.shards == store_spec.shard]
    bad = unverified_chunks(att, slices, labels, 0, {k: done[k] for k in ours if k in done})   # adopted chunks: re-read
    mine = [k for k in ours if k not in done or k in bad]
    contexts = _chunk_loop(att, role, 0, mine, {}, shared, progress and f"chunks {run_id}")
    att.release(role)
    done = att.chunks_done()
    lost = sorted(set(ours) - set(done))
    if lost and not att.named():
        raise StoreError(f"store {b.url}: run {run_id}: this job stored chunk(s) {lost[:8]} but attempt {att.aid} no "
                         "longer has them (removed while this writer was stalled, e.g. by `store gc`); nothing of "
                         "this job is listed. Fix: run the same command again.")
    if len(done) < len(slices) or not att.claim("reduce"):
        return Streamed("complete" if att.named() else "shard_done", att.aid, len(slices), len(mine),
                        missing=tuple(k for k in range(len(slices)) if k not in done))
    if att.marker("skeleton") is None or set(done) != set(range(len(slices))):
        raise StoreError(f"store {b.url}: run {run_id} attempt {att.aid} lost chunks or its skeleton while it "
                         "was written (a gc with older_than=0?); not completing it. Fix: run again.")
    checked = set(ours)                        # this job wrote or re-read its own; the others' are re-read now
    redo = unverified_chunks(att, slices, labels, 0, {k: m for k, m in done.items() if k not in checked})
    if redo:
        contexts = _chunk_loop(att, "reduce", 0, sorted(redo), {}, shared, False) or contexts
        done = att.chunks_done()
    counts: dict = {}
    by_writer: dict = {}
    for marker in done.values():
        _add(counts, marker.get("counts") or {})
        by_writer[marker.get("writer", "?")] = by_writer.get(marker.get("writer", "?"), 0) + 1
    reduced: dict = {}
    for p in range(last_pass + 1):
        if p:                    # a pair stage that reads reductions (e.g. steering along a mean direction)
            marks = {k: att.marker(f"pass{p}.chunk.{k}") for k in range(len(slices))}
            bad = unverified_chunks(att, slices, labels, p, {k: m for k, m in marks.items() if m is not None})
            todo = [k for k in range(len(slices)) if marks[k] is None or k in bad]
            contexts = _chunk_loop(att, "reduce", p, todo, reduced, shared, False)
            for k in range(len(slices)):
                _add(counts, (att.marker(f"pass{p}.chunk.{k}") or {}).get("counts") or {})
        _add(counts, _reduce(att, b, lm, pairs, enc, plan, info, st,
                             [s for s in plan.steps if st[s.name] == "reduce" and ps[s.name] == p],
                             out_g, scr_g, frame, need_h, full_coords, reduced, labels, shared["stores"]))
    chunk_info = {"n": len(slices), "chunk_pairs": store_spec.chunk_pairs, "shards": store_spec.shards,
                  "by_writer": by_writer, **({"widths": widths} if widths else {})}
    zs = att.zarr_store()     # the outputs as stored: small ones read in one pass, bigger ones block by block;
    staged = None if any(st[o] == "reduce" for o in plan.outputs) else shared["staged"]   # (a one-chunk run's: its values)
    if not staged:               # read back from the store: the chunks' freed memory given back first (run.heap)
        trim_heap()
    stored = open_variables(zs, out_g, plan.outputs, lazy=EAGER_BYTES, staged=staged,   # labels: not read back
                            labels=labels.held(out_g) if staged else labels.known(out_g, full_coords))
    logits = staged_values(staged, f"{scr_g}/{HEAD_LOGITS}/{HEAD_LOGITS}") if staged else None
    if logits is None:
        logits = variable_values(zs, scr_g, HEAD_LOGITS)        # its numbers only: no pair labels read
    attrs = run_attrs(counts, chunk_info, stored, logits)
    if DIGESTS not in attrs:                    # seal_run puts them under the seal; other callers: here
        attrs = with_digests(attrs, {plan.observable: result_digests(stored)})
    att.fence("reduce")
    label_group(att.zstore("reduce"), out_g, observable_attrs(attrs, stored), plan.outputs, staged=staged)
    won = complete(att, attrs, "reduce", force=store_spec.force)
    att.release("reduce")
    if keep_context and contexts:
        _add(contexts[-1].counts, {k: v for k, v in counts.items() if k not in contexts[-1].counts})
    if won:                      # the published group's attrs (the same document, store.publish), less bookkeeping
        group = (b.read_json(f"{att.prefix}/{out_g}/zarr.json") or {}).get("attributes") or {}
        stored = Result(dict(stored), {k: v for k, v in group.items() if k not in HIDDEN})
    return Streamed("complete", att.aid if won else "", len(slices), len(mine),
                    contexts[-1] if keep_context and contexts else None, result=stored if won else None)


def _add(total: dict, counts: dict) -> dict:
    for key, v in counts.items():
        total[key] = total.get(key, 0) + int(v)
    return total


def _chunk_loop(att, role, p, ks, reduced, sh, progress) -> list:
    """Compute chunks ``ks`` of pass ``p``'s pair stage into their regions; marker ``chunk.<k>`` (pass 0) or
    ``pass<p>.chunk.<k>``. Inputs from earlier passes: reductions (``reduced``) as they are, pair-stage arrays
    read back for the chunk's rows. Returns ``[the last chunk's RunContext]`` when ``keep_context`` (an earlier
    chunk's context, its capture included, is dropped as the next starts: memory stays bounded by the chunk)."""
    plan, st, ps, b = sh["plan"], sh["st"], sh["ps"], sh["b"]
    out_g, scr_g = sh["groups"]
    steps = [s for s in plan.steps if st[s.name] == "pair" and ps[s.name] == p]
    it = ks
    if progress and ks:
        from tqdm.auto import tqdm
        it = tqdm(ks, desc=progress, unit="chunk")
    run_names, n = set(sh["full_coords"]), len(sh["enc"].pair_ids)
    contexts = []
    for k in it:
        sl = sh["slices"][k]
        contexts.clear()                          # the previous chunk's capture is not held while this one runs
        att.fence(role)
        info = sh["info"]
        lim = None if info.pairs is None else max(0, min(info.pairs - sl.start, sl.stop - sl.start))
        given = {}
        for s in steps:
            for i in s.inputs:
                if st[i] == "reduce":
                    given[i] = reduced[i]
                elif ps[i] < p:
                    group = out_g if i in plan.outputs else scr_g
                    given[i] = open_variable(att.zarr_store(), group, i,
                                             labels=sh["labels"](group)).isel(pair=sl).load()
        ds_out, ds_scr, counts, ctx = _pair_chunk(sh["lm"], pairs_at(sh["pairs"], sh["positions"], sl),
                                                  subset(sh["enc"], sl), plan, steps,
                                                  replace(info, pairs=lim), sh["keep"], sh["capture_kw"], sh["frame"],
                                                  sh["need_h"] and p == 0, given, sh["pads"], p == 0, sh["stores"],
                                                  take_pairs(sh["full_coords"], sl))
        check_storable(Result({**ds_out, **ds_scr}), plan.observable, {s.name: s.op.name for s in plan.steps},
                       att.run_id)
        marker = "skeleton" if p == 0 else f"pass{p}.skeleton"
        small = sum(v.nbytes for res in (ds_out, ds_scr) for v in res.values()) <= STAGED_BYTES
        filled = ensure_skeleton(att, role, b, [(out_g, ds_out, sh["full_coords"]), (scr_g, ds_scr, sh["full_coords"])],
                                 n, sh["size"], run_names, marker=marker, labels=(out_g,) if p == 0 else (), filled=len(sh["slices"]) == 1,
                                 staged=sh["staged"] if small else None)
        digests = {}
        for group, res in ((out_g, ds_out), (scr_g, ds_scr)):
            if res and filled:                    # a one-chunk run's arrays were written with their data
                digests.update(region_digests(group, res, run_names))
            elif res:
                sh["staged"].clear()              # arrays written by region: the completion reads them back
                att.fence(role)
                digests.update(write_region(att.zstore(role), group, res, sl, run_names))
        att.mark(f"chunk.{k}" if p == 0 else f"pass{p}.chunk.{k}",
                 {"writer": att.writer, "counts": counts, "digests": digests}, role)
        if sh["keep_context"]:
            contexts.append(ctx)
        del ds_out, ds_scr, ctx
    return contexts


def _pair_chunk(lm, pairs, enc_k, plan, steps, info_k, keep, capture_kw, frame, need_h, given, pads, first, stores,
                coords=None):
    """Capture pass + one pass's pair-stage ``steps`` on one chunk; returns (outputs, scratch, counts,
    context): two ``Result``s. ``given``: inputs computed before this pass. ``pads``: step -> {dim: the run's
    size} for the steps with a data-dependent dim (kept rows padded to it); ``stores``: ``RunContext.stores``;
    ``coords``: the chunk's pair coords, sliced from the run's (``None``: computed from the pairs).
    The first pass also keeps the model's own head logits (and the readout ``h`` a reduction reads) as scratch."""
    from ..frames.express import express
    from ..engine.capture import capture

    n = len(enc_k.pair_ids)
    rows = {2 * p + side for s in steps for p, side in s.op.prefix_rows(info_k, n)}
    sites = set().union(*(s.op.sites(info_k) for s in steps)) if steps else set()
    cap = capture(lm, enc_k, sites if not first else plan.sites,
                  keep_prefix=sorted(rows) if len(rows) <= KEEP_PREFIX_MAX else [], **capture_kw)
    ctx = RunContext(lm=lm, pairs=pairs, encoded=enc_k, capture=cap, info=info_k, stores=stores, coords=coords)
    ctx.add_counts("capture" if first else "recapture", cap.counts)
    coords = ctx.pair_coords()
    last = {}
    for j, s in enumerate(steps):
        for i in s.inputs:
            last[i] = j
    values = {k: (v.assign_coords(pair=coords["pair"]) if "pair" in v.dims else v) for k, v in given.items()}
    kept = {}
    for j, s in enumerate(steps):
        values[s.name] = s.op.run(ctx, *[values[i] for i in s.inputs])
        values[s.name].attrs.setdefault("gauge", s.gauge)
        if s.name in keep:
            kept[s.name] = pad_widths(values[s.name], pads.get(s.name, {}),
                                      f"observable {plan.observable}, step {s.name}")
        for name in [*s.inputs, s.name]:           # free what no later step of this chunk reads
            if last.get(name, -1) <= j:
                values.pop(name, None)
    ds_out = express(Result({o: kept[o] for o in plan.outputs if o in kept}), frame, info_k.model_name)
    scratch = {k: v for k, v in kept.items() if k not in plan.outputs}
    sided = {**coords, "side": ["chosen", "rejected"]}
    if first:
        scratch[HEAD_LOGITS] = new_array(np.asarray(cap.logits), ("pair", "side", "output"), sided)
    if need_h:
        scratch[READOUT_H] = new_array(cap.h, ("pair", "side", "d_model"), sided)
    return ds_out, Result(scratch), ctx.counts, ctx


def _reduce(att, b, lm, pairs, enc, plan, info, st, reduce_steps, out_g, scr_g, frame, need_h, pair_coords,
            reduced, labels, stores) -> dict:
    """One pass's reductions on the stored per-pair arrays (opened lazily) and the earlier passes'
    reductions (``reduced``, updated in place); write the outputs among them into the run's group."""
    from ..frames import Frame, save_frame
    from ..frames.express import express

    if not reduce_steps:
        return {}
    pair_inputs = {i for s in reduce_steps for i in s.inputs if st[i] == "pair"}
    in_out = [i for i in pair_inputs if i in plan.outputs]
    zs = att.zarr_store()
    stored = {**dict(open_variables(zs, scr_g, sorted(pair_inputs - set(in_out)), labels=labels(scr_g))),
              **dict(open_variables(zs, out_g, in_out, labels=labels(out_g)))}   # lazy (dask); coords in memory
    if need_h:
        stored[READOUT_H] = open_variable(zs, scr_g, READOUT_H, labels=labels(scr_g))
    ctx = RunContext(lm=lm, pairs=pairs, encoded=enc, info=info, stores=stores,
                     capture=_Readout(stored.get(READOUT_H) if need_h else None))
    values = {name: stored[name].assign_coords(pair_coords)       # pair labels as the chunks had them
              for name in pair_inputs}
    values.update(reduced)
    for s in reduce_steps:
        reduced[s.name] = values[s.name] = s.op.run(ctx, *[values[i] for i in s.inputs])
        values[s.name].attrs.setdefault("gauge", s.gauge)
    outs = [s.name for s in reduce_steps if s.name in plan.outputs]
    if outs:
        res = express(Result({o: values[o] for o in outs}), frame, info.model_name)
        res = Result({o: v.compute() for o, v in res.items()}, res.attrs)
        check_storable(res, plan.observable, {s.name: s.op.name for s in reduce_steps}, att.run_id)
        att.fence("reduce")
        write_variables(att.zstore("reduce"), res, out_g, labels=False, mode="a")
    for made in [v for v in ctx.memo.values() if isinstance(v, Frame)]:   # operators' own frames: stored too
        save_frame(made, b)
    return ctx.counts
