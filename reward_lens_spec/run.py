"""Spec → plan → capture pass and operators, streamed chunk by chunk → xarray → store.

``execute`` is the whole main job for one composed config (``streaming.stream`` runs the plan's
two stages into the run's attempt; ``compute`` is the same plan in memory, for tests and
benchmarks). The run id is the hash of what determines the numbers (model fingerprint, dataset
checksum, the token ids of every side the model sees with the pair ids in order
(``EncodedPairs.digest``), the pairs excluded or flagged, the observable's expanded steps and
version, numerics settings, package version);
paths, time, batch size and launcher are not part of it. A complete run with
the same id is found in the store and not recomputed unless ``store.force``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

import xarray as xr

from . import __version__
from .errors import SpecError
from .identity import canonical_observable, git_sha, spec_hash, versions
from .planning import frame_dependent, plan_for
from .result import Result


@dataclass
class Outcome:
    run_id: str
    store_url: str
    reused: bool
    result: Result | None            # the stored run (None when reused or not complete yet): in memory when it
                                     # holds at most RESULT_IN_MEMORY bytes, else opened lazily (dask)
    plan: object
    status: str = "complete"         # or "shard_done": this job's chunks are in, the last shard completes the run


RESULT_IN_MEMORY = 256 * 2**20   # bytes: a larger stored result is handed back lazily, never loaded whole
KEEP_PREFIX_MAX = 64      # patched rows whose prefix KV cache the capture pass keeps (capture(keep_prefix=))


def compute(lm, pairs, plan, info, *, fmt="plain", template="User: {prompt}\nAssistant: {response}",
            max_length=512, batch_size=16, max_tokens=None, padding_side="left", progress=False, frame=None):
    """Encode ``pairs``, run the one shared capture pass for ``plan``, then every step.

    Frame-dependent outputs are then expressed in ``frame`` (a ``frames.Frame``; ``None`` =
    native, see ``frames.express``). Returns ``(Result of the plan's outputs (each variable with its own
    coordinates), RunContext, EncodedPairs)``.
    """
    from .frames.express import express
    from .context import RunContext
    from .models.capture import capture
    from .models.formatting import encode_pairs

    enc = encode_pairs(lm.tokenizer, list(pairs), fmt=fmt, template=template, max_length=max_length,
                       model_name=lm.name)
    if not enc.pair_ids:
        raise SpecError("dataset", "no pair is left to score after exclusions.", fix="check dataset.limit and filters.")
    n = len(enc.pair_ids)
    rows = {2 * p + side for step in plan.steps for p, side in step.op.prefix_rows(info, n)}
    keep = sorted(rows) if len(rows) <= KEEP_PREFIX_MAX else []     # one KV cache per row is held
    cap = capture(lm, enc, plan.sites, batch_size=batch_size, max_tokens=max_tokens, padding_side=padding_side,
                  progress=progress, keep_prefix=keep)
    ctx = RunContext(lm=lm, pairs=pairs, encoded=enc, capture=cap, info=info)
    ctx.add_counts("capture", cap.counts)
    values: dict[str, xr.DataArray] = {}
    for step in plan.steps:
        values[step.name] = step.op.run(ctx, *[values[s] for s in step.inputs])
        values[step.name].attrs.setdefault("gauge", step.gauge)
    return express(Result({o: values[o] for o in plan.outputs}), frame, info.model_name), ctx, enc


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


def execute(run, *, resolved_yaml: str, base_dir: str, store_url: str, progress: bool = True) -> Outcome:
    """Run one composed, validated config (``RunConfig``) end to end; see the module docstring."""
    from .data import load_pairs
    from .frames.resolve import resolve_frame
    from .models.fingerprint import model_fingerprint
    from .models.loading import load_model
    from .store import is_complete
    from .trust.gates import seal_run
    from .trust.studies import check_run

    t0 = time.perf_counter()
    plan, info = plan_for(run, base_dir)                      # every spec error before any model loads
    set_threads(run.model.threads)
    study = check_run(run, store_url, storage_options=dict(run.store.storage_options))   # edited study: refused
    ds = run.dataset
    pairs = load_pairs(ds.kind.value, path=ds.path, fields=dict(ds.fields) or None, limit=ds.limit,
                       dimensions=ds.dimensions, base_dir=base_dir, subset=ds.subset)
    lm = load_model(run.model, base_dir)
    fp = model_fingerprint(lm.model, lm.tokenizer)
    m = run.model
    numerics = {"dtype": m.dtype.value, "max_length": m.max_length, "format": m.format.value,
                "template": m.template if m.format.value == "plain" else None, "objectives": list(m.objectives)}
    from .data.accounting import accounting, summary_line
    from .models.formatting import encode_pairs
    seen = encode_pairs(lm.tokenizer, list(pairs), fmt=m.format.value, template=m.template, max_length=m.max_length,
                        model_name=lm.name)                   # what the model sees: ids of every side, in order
    if not seen.pair_ids:
        raise SpecError("dataset", "no pair is left to score after exclusions.", fix="check dataset.limit and filters.")
    enc = seen
    acc = accounting(pairs, seen)
    hash_parts = {"model_fingerprint": fp, "model_name": m.name, "dataset_checksum": pairs.checksum,
                  "model_input": seen.digest(), "accounting": acc,
                  "observable": canonical_observable(run.observable), "numerics": numerics,
                  "package_version": __version__, "study_hash": study["study_hash"] if study else None}
    if progress:
        print(summary_line(acc, len(seen.pair_ids)))
    # fitted once, stored, reused; skipped when no output is a vector the frame would re-express
    frame = resolve_frame(run, lm, store_url, base_dir) if frame_dependent(plan) else None
    if frame is not None:
        hash_parts["frame"] = frame.id
    run_id = f"{run.observable.name}-{spec_hash(hash_parts)[:20]}"
    so = dict(run.store.storage_options)
    if not run.store.force and is_complete(store_url, run_id, storage_options=so):
        return Outcome(run_id, store_url, True, None, plan)
    from .store import open_store
    from .store._backend import Backend
    from .store.writer import check_layout
    from .streaming import stream

    b = Backend(store_url, so)
    check_layout(b, create=True)

    def run_attrs(counts, chunks, result, logits):     # result: the stored outputs, opened lazily
        wall = time.perf_counter() - t0
        attrs = {
        "config_yaml": resolved_yaml, "spec_hash": spec_hash(hash_parts), "model": m.name, "model_fingerprint": fp,
        "model_family": lm.family.name, "dataset": ds.name, "dataset_checksum": pairs.checksum,
        "dataset_file": pairs.source_file, "model_input_sha256": hash_parts["model_input"], "pair_flags": acc["pair_flags"],
        "effective_n": {"n": len(pairs), "n_scored": len(enc.pair_ids), "n_unique": pairs.n_unique,
                        "n_prompt_clusters": pairs.n_prompt_clusters},
        "data_flags": {k: len(v) for k, v in pairs.flags.items()},
        "excluded": acc["excluded"], "observable": run.observable.name,
        "observables": [run.observable.name],
        "observable_version": run.observable.version, "versions": versions(), "git_sha": git_sha(),
        "seed": run.seed, "device": lm.device, "dtype": lm.dtype, "wall_s": round(wall, 3),
        "torch_threads": torch_threads(),
        "counts": counts, "chunks": chunks,
        "study_hash": study["study_hash"] if study else None,
        "gauge": {v: str(result[v].attrs.get("gauge", "")) for v in result.data_vars},
        "frame": {"requested": run.frame.name.value, "id": frame.id if frame is not None else None,
                  "expressed_outputs": [v for v in result.data_vars
                                        if frame is not None and result[v].attrs.get("gauge") == frame.gauge]},
        "run_id": run_id, "created": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        }
        return seal_run(run_id, attrs, result, run, store_url, logits=logits, pair_ids=enc.pair_ids, lm=lm,
                        storage_options=so)                   # identities, seal, derived trust cache

    done = stream(b, run_id, lm, pairs, enc, plan, info, frame=frame, store_spec=run.store, run_attrs=run_attrs,
                  capture_kw=dict(batch_size=m.batch_size, max_tokens=m.max_tokens, padding_side=m.padding_side.value,
                                  progress=False), progress=progress)
    if done.status != "complete":
        return Outcome(run_id, store_url, False, None, plan, status=done.status)
    result = open_store(store_url, storage_options=so).load(run_id, run.observable.name)
    if result.nbytes <= RESULT_IN_MEMORY:
        result = result.load()
    return Outcome(run_id, store_url, False, result, plan)
