"""Executing a run: spec → plan → inputs → identity → the one streamed executor → store.

``execute`` is the whole main job for one composed config: plan (every spec error before any model
loads), inputs (``inputs``), identity (``run.identity``), then ``run.stream`` into the run's
attempt. A complete run with the same id is found in the store and not recomputed unless
``store.force``: first from bytes alone (``run.reuse``: no torch, no tokenizer, no plan), else after
tokenizing with a remembered fingerprint (no weights), else after loading. ``compute`` runs a plan on pairs in memory — the same executor, streamed into an
in-memory store (``memory://``) and read back, so the two cannot drift.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from typing import TYPE_CHECKING

from .reuse import remember_run, reuse_key, reused_run
from types import SimpleNamespace
from ..data.accounting import accounting, summary_line
from ..errors import SpecError
from ..inputs import Inputs, encode, load_dataset, load_inputs, ops_view
from ..models.fingerprint_cache import load_tokenizer_only, remember, remembered, weights_key
from ..report.summary import summary_of
from .seal import seal_run
from ..spec import StoreSpec
from ..store import store_handle
from ..store.layout import check_layout, check_writable

if TYPE_CHECKING:                     # the executor's heavy imports (torch, transformers) come after the reuse check
    from ..result import Result


@dataclass
class Outcome:
    run_id: str
    store_url: str
    reused: bool
    result: "Result | None"          # the stored run (None when reused or not complete yet): in memory when it
                                     # holds at most RESULT_IN_MEMORY bytes, else opened lazily (dask)
    plan: object
    status: str = "complete"         # or "shard_done": this job's chunks are in, the last shard completes the run
    shard: tuple = (0, 1)            # (store.shard, store.shards) of this job
    missing: tuple = ()              # "shard_done": the run's chunks not stored yet
    chunks: int = 0                  # chunks in the run (0: reused)
    computed: int = 0                # of those, the chunks this job computed (fewer: it resumed stored ones)
    published: bool = True           # False: another job completed the same run first; its copy is the stored one
    pairs_line: str | None = None    # the pairs line, when ``execute(defer_lines=True)`` left it to the summary
    provenance: dict | None = None   # a run reused from bytes: its stored provenance, trust derived (run.reuse)
    store: object = None             # the run's store handle (``store.store_handle``): readers after the run reuse it


RESULT_IN_MEMORY = 256 * 2**20   # bytes: a larger stored result is handed back lazily, never loaded whole


def set_threads(threads) -> None:
    """Pin torch's intra-op thread count (``model.threads``; ``None`` leaves torch's default).

    Gradient-based outputs (attribution patching) depend on it in their last float32 bits, so jobs
    that must agree bit for bit (shards of one run and a single-job run) pin the same count.
    Raises ``SpecError`` (``model.threads``) unless it is null or an integer >= 1.
    """
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise SpecError("model.threads", f"must be null or an integer >= 1, got {threads!r}.",
                        fix="model.threads=1 (or remove it for torch's default).")
    import torch
    torch.set_num_threads(threads)


def torch_threads() -> int:
    import torch
    return torch.get_num_threads()


def compute(lm, pairs, plan, info, *, fmt="plain", template="User: {prompt}\nAssistant: {response}",
            max_length=512, batch_size=16, max_tokens=None, padding_side="left", progress=False, frame=None,
            chunk_pairs=None):
    """Run ``plan`` on ``pairs`` in memory: the streamed executor into a ``memory://`` store, read back (the
    completing read of the stored outputs, ``Streamed.result``).

    ``chunk_pairs`` (default: every pair in one chunk, so the returned context holds the whole capture).
    Frame-dependent outputs are expressed in ``frame`` (``None`` = native). Returns ``(Result of the plan's
    outputs, the last chunk's RunContext (capture, counts of the whole run), EncodedPairs)``.
    Raises ``SpecError`` when no pair is left after exclusions, and the operators' errors.
    """
    from .identity import declared_fields
    from .stream import stream

    enc = encode(lm, pairs, fmt=fmt, template=template, max_length=max_length)
    if not enc.pair_ids:
        raise SpecError("dataset", "no pair is left to score after exclusions.", fix="check dataset.limit and filters.")
    url = f"memory://reward-lens-spec-compute-{uuid.uuid4().hex}"
    b = store_handle(url)
    check_layout(b, create=True)
    try:
        done = stream(b, "compute", lm, ops_view(pairs, declared_fields(plan)), enc, plan, info, frame=frame,
                      capture_kw=dict(batch_size=batch_size, max_tokens=max_tokens, padding_side=padding_side,
                                      progress=progress),
                      store_spec=StoreSpec(chunk_pairs=chunk_pairs or max(1, len(enc.pair_ids))),
                      run_attrs=lambda counts, chunks, stored, logits: {"observables": [plan.observable],
                                                                        "counts": counts, "chunks": chunks},
                      keep_context=True)
        result = done.result.load()          # the outputs as the completion read them from the store
    finally:                             # file by file (fsspec's recursive rm of a memory store checks every
        for key in b.fs.find(b.root):     # path against every key: quadratic), then the folders left
            b.fs.rm_file(key)
        b.remove_tree("")
    return result, done.context, enc


def _reused_without_weights(run, plan, wkey, base_dir, store, study_hash, progress):
    """The run id when the store already holds this run complete, decided from the config, the pairs, the
    tokenizer and the fingerprint a previous load of the same checkpoint bytes remembered under ``wkey``
    (``models.fingerprint_cache``) — no weights loaded. ``None``: load and decide (no remembered
    fingerprint, a frame to resolve, ``store.force``, or not in ``store``, the run's store handle). Returns ``(run id or None, the
    PairSet if it was read, else None)``."""
    from ..planning import frame_dependent
    from ..store import is_complete
    from .identity import identity_parts, run_id_of
    if run.store.force or frame_dependent(plan):
        return None, None
    fp = remembered(wkey)
    if fp is None:
        return None, None
    pairs = load_dataset(run.dataset, base_dir)
    tok = load_tokenizer_only(run.model, base_dir)
    enc = encode(SimpleNamespace(tokenizer=tok, name=run.model.name), pairs, run.model)
    if not enc.pair_ids:
        return None, pairs
    acc = accounting(pairs, enc)
    parts = identity_parts(run, Inputs(pairs, None, enc), plan, fp, acc, study_hash=study_hash,
                           base_dir=base_dir)
    run_id = run_id_of(run.observable.name, parts)
    if not is_complete(store, run_id):
        return None, pairs
    if progress:
        print(summary_line(acc, len(enc.pair_ids)))
    return run_id, pairs


def _reused_outcome(run_id, prov, store, progress, defer_lines) -> Outcome:
    """The outcome of a run ``run.reuse`` found: its pairs line from the counts the stored run records."""
    acc = {"excluded": prov.get("excluded") or {}, "pair_flags": prov.get("pair_flags") or {}}
    line = summary_line(acc, (prov.get("effective_n") or {}).get("n_scored")) if progress else None
    if line and not defer_lines:
        print(line)
    return Outcome(run_id, store.url, True, None, None, pairs_line=line if defer_lines else None, provenance=prov,
                   store=store)


def execute(run, *, resolved_yaml: str, base_dir: str, store_url: str, progress: bool = True,
            defer_lines: bool = False, open_result: bool = True) -> Outcome:
    """Run one composed, validated config (``RunConfig``) end to end; see the module docstring.

    ``progress``: print the pairs line (and a chunk progress bar); ``defer_lines``: keep the pairs line in
    ``Outcome.pairs_line`` instead, for ``report.summary.print_summary`` to print in one block with the rest
    (a multirun's jobs share one console). ``open_result=False``: ``Outcome.result`` stays ``None`` (the
    command line prints from the run document, so its memory does not grow with the stored outputs).

    Memory: besides one chunk's work, the run holds per pair where its line lies in a plain JSON-Lines file
    (``data.file_pairs``: ~50 bytes; the texts are re-read where needed; other sources: one ``Pair`` each), its
    token ids' offsets (``TokenRows``: the tokens themselves, 2 or 4 bytes each, in a temporary file above 1 MiB a
    side, read per chunk) and its labels as bytes (``context.PairLabels``); every other per-pair array is written
    by chunk and read back by chunk (benchmarks/results.md §16, §21, §25)."""
    t0 = time.perf_counter()
    store = store_handle(store_url, dict(run.store.storage_options))   # the run's one store handle, handed down
    check_writable(store)                                     # refused before any model loads or data are read
    study = None
    if run.experiment:                                        # (trust.studies imports xarray: only for a study)
        from ..trust.studies import check_run
        study = check_run(run, store)                         # edited study: refused
    shash = study["study_hash"] if study else None
    key = reuse_key(run, resolved_yaml, base_dir, shash)
    found = reused_run(run, key, resolved_yaml, base_dir, store)
    if found is not None:                                     # decided from bytes: no torch, no tokenizer
        return _reused_outcome(*found, store, progress, defer_lines)

    from ..frames.resolve import resolve_frame
    from ..identity import git_sha, spec_hash, versions
    from ..models.fingerprint import model_fingerprint
    from ..planning import frame_dependent, plan_for
    from ..store import is_complete, open_store
    from .identity import declared_fields, identity_parts, run_id_of
    from .stream import stream

    plan, info = plan_for(run, base_dir)                      # every spec error before any model loads
    set_threads(run.model.threads)
    wkey = weights_key(run.model, base_dir)
    found, pairs = _reused_without_weights(run, plan, wkey, base_dir, store, shash,
                                           progress and not defer_lines)
    if found is not None:
        remember_run(key, found)
        return Outcome(found, store_url, True, None, plan, store=store)
    inp = load_inputs(run, base_dir, pairs=pairs)               # the pairs already read are not read again
    lm, enc, m = inp.lm, inp.enc, run.model
    fp = model_fingerprint(lm.model, lm.tokenizer)
    if weights_key(m, base_dir) == wkey:                        # the checkpoint's bytes did not change during the load
        remember(wkey, fp)
    acc = accounting(inp.pairs, enc)
    line = summary_line(acc, len(enc.pair_ids))
    if progress and not defer_lines:
        print(line)
    deferred = line if progress and defer_lines else None
    # fitted once, stored, reused; skipped when no output is a vector the frame would re-express
    frame = resolve_frame(run, lm, store, base_dir) if frame_dependent(plan) else None
    parts = identity_parts(run, inp, plan, fp, acc, study_hash=shash,
                           frame_id=frame.id if frame is not None else None, base_dir=base_dir)
    run_id = run_id_of(run.observable.name, parts)
    if not run.store.force and is_complete(store, run_id):
        remember_run(key, run_id)
        return Outcome(run_id, store_url, True, None, plan, pairs_line=deferred, store=store)
    check_layout(store, create=True)
    bs = inp.batch_size
    # what operators see (inputs.ops_view) is the run's one copy of the pairs from here: same checksum, flags and
    # sizes (run attrs), the loader's Pair objects freed
    pairs = ops_view(inp.pairs, declared_fields(plan))
    inp = None

    def run_attrs(counts, chunks, result, logits):     # result: the stored outputs, opened lazily
        attrs = {
            "config_yaml": resolved_yaml, "spec_hash": spec_hash(parts), "model": m.name, "model_fingerprint": fp,
            "model_family": lm.family.name, "dataset": run.dataset.name, "dataset_checksum": pairs.checksum,
            "dataset_file": pairs.source_file, "model_input_sha256": parts["model_input"],
            "pair_fields": parts.get("pair_fields"), "pair_flags": acc["pair_flags"],
            "effective_n": {"n": len(pairs), "n_scored": len(enc.pair_ids), "n_unique": pairs.n_unique,
                            "n_prompt_clusters": pairs.n_prompt_clusters},
            "data_flags": {k: len(v) for k, v in pairs.flags.items()},
            "excluded": acc["excluded"], "observable": run.observable.name, "observables": [run.observable.name],
            "observable_version": run.observable.version, "versions": versions(), "git_sha": git_sha(),
            "seed": run.seed, "device": lm.device, "dtype": lm.dtype, "wall_s": round(time.perf_counter() - t0, 3),
            "torch_threads": torch_threads(), "batch_size": bs, "trust_remote_code": bool(m.trust_remote_code),
            "placement": getattr(lm, "placement", None),   # model.device_map: the map used (models.placement)
            "counts": counts, "chunks": chunks, "study_hash": parts["study_hash"],
            "gauge": {v: str(result[v].attrs.get("gauge", "")) for v in result.data_vars},
            "frame": {"requested": run.frame.name.value, "id": frame.id if frame is not None else None,
                      "expressed_outputs": [v for v in result.data_vars
                                            if frame is not None and result[v].attrs.get("gauge") == frame.gauge]},
            "checkpoint": parts.get("checkpoint"),        # a checkpoint sequence's chain (models.checkpoints)
            "summary": summary_of(result),                # the console table, printed again on a rerun
            "run_id": run_id, "created": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            **({"data_shape": parts["data_shape"]} if parts.get("data_shape") else {}),   # a TRL shape (data.readers)
        }
        return seal_run(run_id, attrs, result, run.observable, run.experiment, store, logits=logits,
                        pair_ids=enc.pair_ids, lm=lm)         # identities, seal, derived trust cache

    done = stream(store, run_id, lm, pairs, enc, plan, info, frame=frame,
                  store_spec=run.store, run_attrs=run_attrs, progress=progress and not defer_lines,
                  capture_kw=dict(batch_size=bs, max_tokens=m.max_tokens, padding_side=m.padding_side.value,
                                  progress=False))
    sh = (run.store.shard, run.store.shards)
    if done.status != "complete":
        return Outcome(run_id, store_url, False, None, plan, status=done.status, shard=sh, missing=done.missing,
                       chunks=done.chunks, pairs_line=deferred, store=store)
    remember_run(key, run_id)
    how = dict(shard=sh, pairs_line=deferred, store=store, chunks=done.chunks, computed=done.computed,
               published=bool(done.attempt))
    if not open_result:
        return Outcome(run_id, store_url, False, None, plan, **how)
    result = open_store(store).load(run_id, run.observable.name)
    if result.nbytes <= RESULT_IN_MEMORY:
        result = result.load()
    return Outcome(run_id, store_url, False, result, plan, **how)
