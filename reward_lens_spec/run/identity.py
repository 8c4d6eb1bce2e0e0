"""A run's identity: the hash of everything its numbers depend on, computed in one place.

``run_id = <observable>-<sha256(parts)[:20]>`` with ``parts`` (``identity_parts``):

- ``model_fingerprint`` (weights, head and tokenizer) and ``model_name``; an ensemble's
  ``member_fingerprints`` (``kinds.ensemble``), one per member, in order;
- ``dataset_checksum`` (every pair's exact text and dimension, ``data.checksum``);
- ``model_input``: the token ids of every side the model sees, with the pair ids in order
  (``EncodedPairs.digest``), and ``accounting`` (which pairs were excluded or flagged);
- ``pair_fields``: the value, pair by pair in order, of every per-pair field an operator of the plan
  declares it reads (``Operator.pair_fields``: ``chosen_position``, ``group``, ``agreement``, ``votes``,
  RewardBench 2's ``item`` …); operators see no other field (``inputs.ops_view``);
- ``observable``: the expanded steps, outputs, version and restrictions; ``numerics`` (dtype,
  max_length, format, template, objectives; for ``bfloat16``/``float16`` also the device type the model
  executes on, ``cpu`` or ``cuda``: a reduced-precision kernel's rounding differs between them by about the
  dtype's own precision, so a CPU bf16 result is not reused for a GPU bf16 run); ``package_version``; the
  study and frame it ran under;
- ``data_shape`` (data read by a TRL reader only, ``data.readers``): the shape, the chat template that renders
  messages (``model`` or the sha256 of ``dataset.chat_template``) and a stepwise file's step separator
  (``PairSet.shape_record``); data of the other kinds have none, so their run ids are as before;
- ``checkpoint`` (a ``model.checkpoints`` sequence only): index, step, the checkpoint's content digest
  and the chain hash up to it (``models.checkpoints``).
- ``interventions`` (``model.interventions`` only): kind, site, alpha and the sha256 of each artifact file
  (``models.artifacts``), so an erased or steered model and a changed artifact each get their own id.

Paths, time, batch size, chunking, threads, launcher and where weights live (``model.device_map``,
``max_memory``, ``offload_folder``: offloaded weights are copied bit for bit to the device that runs them, so
a split run equals the unsplit one; the map is in the run's provenance, ``placement``) are not part of it.
"""
from __future__ import annotations

import hashlib
import json

from .. import __version__
from ..identity import canonical_observable, spec_hash
from ..models.checkpoints import chain
from ..inputs import numerics
from ..models.artifacts import identity


def declared_fields(plan) -> tuple[str, ...]:
    """The per-pair fields the plan's operators declare they read (sorted, unique)."""
    return tuple(sorted({f for s in plan.steps for f in type(s.op).pair_fields}))


def pair_fields_digest(pairs, ids, fields) -> str | None:
    """sha256 of ``fields``' values for the pairs ``ids``, in order (``None`` when no field is declared)."""
    if not fields:
        return None
    ordered = _in_order(pairs, list(ids))       # one ordered walk: a file's pairs are re-read, never all held
    h = hashlib.sha256()

    def dump(value) -> bytes:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                          default=str).encode("utf-8", "surrogatepass")
    h.update(b"[" + dump(list(fields)) + b",[")     # == json.dumps([fields, rows]) with these separators
    for k, p in enumerate(ordered):
        meta = dict(p.meta)
        h.update((b"," if k else b"") + dump([p.id, [meta.get(f, getattr(p, f, None)) for f in fields]]))
    h.update(b"]]")
    return h.hexdigest()


def _in_order(pairs, ids: list):
    """The pairs ``ids``, in that order: one walk when they come in the pairs' order, else through a dict."""
    j = 0
    for p in pairs:
        if j < len(ids) and p.id == ids[j]:
            j += 1
    if j == len(ids):
        j = 0
        for p in pairs:
            if j < len(ids) and p.id == ids[j]:
                yield p
                j += 1
        return
    by_id = {p.id: p for p in pairs}
    yield from (by_id[i] for i in ids)


def identity_parts(run, inputs, plan, fingerprint, accounting, *, study_hash=None, frame_id=None,
                   base_dir=None) -> dict:
    """The dict whose hash is the run id (see the module docstring); ``base_dir`` resolves relative
    checkpoint folders of a ``model.checkpoints`` sequence."""
    fields = declared_fields(plan)
    parts = {"model_fingerprint": fingerprint, "model_name": run.model.name,
             "dataset_checksum": inputs.pairs.checksum, "model_input": inputs.enc.digest(),
             "accounting": accounting, "observable": canonical_observable(run.observable),
             "numerics": numerics(run.model), "package_version": __version__, "study_hash": study_hash}
    if fields:
        parts["pair_fields"] = {"fields": list(fields),
                                "sha256": pair_fields_digest(inputs.pairs, inputs.enc.pair_ids, fields)}
    shape = getattr(inputs.pairs, "shape_record", lambda: None)()
    if shape is not None:                  # a TRL shape: which one, and the template that rendered it
        parts["data_shape"] = shape
    members = getattr(inputs.lm, "member_fingerprints", None)      # an ensemble (kinds.ensemble): each member
    if members:
        parts["member_fingerprints"] = list(members)
    if frame_id is not None:
        parts["frame"] = frame_id
    applied = getattr(inputs.lm, "interventions", None)      # the bytes the loader read, else the files now
    if applied or getattr(run.model, "interventions", None):
        parts["interventions"] = applied if applied else identity(run.model, base_dir)
    cp = chain(run.model, base_dir)
    if cp is not None:                     # a checkpoint of a sequence: its place in the chain
        parts["checkpoint"] = cp
    return parts


def run_id_of(observable: str, parts: dict) -> str:
    return f"{observable}-{spec_hash(parts)[:20]}"
