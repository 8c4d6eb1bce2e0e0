"""A run's inputs, loaded in one place (below ``run/``: frames, fit, organisms and the trust workflows load
through it too): the pairs a dataset config names, the model (one guarded
loader, ``models.loading.load_model``) and what the model sees (``EncodedPairs``).

Every command — the main run, ``fit``, ``freeze``/``amend`` (design pins), frames (reference pairs),
``calibrate`` (organisms) — loads through these functions, so a config key (``dataset.subset``,
``model.template``, ``model.max_length`` …) means the same on every route. No other module calls
``load_pairs``, ``encode_pairs`` or a loader (``tests/test_one_path.py`` greps for it).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

from .data import load_pairs
from .data.file_pairs import FilePairs
from .data.readers import CONVERSATIONAL
from .errors import SpecError
from .registries import DATASET_READERS
from .models.formatting import encode_pairs
from .kinds import encode_kind, kind_settings, load_kind

_DATASET_LIMIT = object()


def load_dataset(ds, base_dir: str | None = None, *, limit=_DATASET_LIMIT):
    """The ``PairSet`` a ``DatasetSpec`` names (every key honoured: kind, path, fields, limit, dimensions,
    subset), read by the dataset reader ``dataset.kind`` names (``registries.DATASET_READERS``; a third-party
    reader's ``rows`` meet the ``jsonl`` rules). ``limit`` replaces ``dataset.limit`` (a frame's
    ``reference_limit``). Raises ``SpecError`` (an unknown kind: "did you mean")."""
    reader = DATASET_READERS.get(ds.kind, "dataset.kind")
    return load_pairs(reader.reads_as, rows=reader.rows, path=ds.path, fields=dict(ds.fields) or None,
                      limit=ds.limit if limit is _DATASET_LIMIT else limit, dimensions=ds.dimensions,
                      base_dir=base_dir, subset=ds.subset, chat_template=ds.chat_template,
                      step_separator=ds.step_separator)


def load_lm(spec, base_dir: str | None = None):
    """The ``LoadedModel`` a ``ModelSpec`` names, built by its kind's loader (``kinds``: the classifier's
    is ``models.loading.load_model``, the one guarded loader; judges and PRMs load through it too)."""
    return load_kind(spec, base_dir)


def encode(lm, pairs, spec=None, **kw):
    """``EncodedPairs`` of ``pairs`` as ``lm`` sees them under ``spec``'s ``format``, ``template`` and
    ``max_length`` (a ``ModelSpec``; ``None``: the defaults, as organisms use); ``kw`` passes
    ``truncated_responses``. Pairs of a conversational TRL shape (``data.readers``) are rendered as messages by
    ``pairs.chat_template`` (``dataset.chat_template``) or the tokenizer's chat template (format ``messages``). Raises ``SpecError`` for a bad template or format."""
    if spec is not None:
        kw = dict(fmt=spec.format.value, template=spec.template, max_length=spec.max_length, **kw)
    if getattr(pairs, "shape", None) in CONVERSATIONAL:     # messages: rendered by a chat template, never model.template
        kw.update(fmt="messages", template=pairs.chat_template or "")
    seq = getattr(pairs, "pairs", pairs)     # a sequence, encoded slice by slice (a file's pairs: read by slice)
    enc = encode_pairs(lm.tokenizer, seq if isinstance(seq, Sequence) else list(seq), model_name=lm.name, **kw)
    return encode_kind(enc, lm, spec, pairs)           # a kind may move the readout (a PRM: after the chosen step)


def ops_view(pairs, fields):
    """``pairs`` as operators see them: ``meta`` cut to the declared per-pair ``fields`` (``Operator.
    pair_fields``), ``rubric``/``source`` blanked unless declared. What an operator can read is so exactly
    what the run identity covers (``run.identity``)."""
    cut = partial(_cut, keep=frozenset(fields))
    inner = getattr(pairs, "pairs", None)
    if isinstance(inner, FilePairs):         # pairs left in their file: the view is applied as each is re-read
        return replace(pairs, pairs=inner.view(cut))
    view = tuple(cut(p) for p in pairs)
    return replace(pairs, pairs=view) if hasattr(pairs, "checksum") else list(view)


def _cut(p, keep: frozenset):
    return replace(p, meta=tuple((k, v) for k, v in p.meta if k in keep),
                   rubric=p.rubric if "rubric" in keep else "", source=p.source if "source" in keep else "")


def batch_size(spec, lm, enc) -> int:
    """Rows per forward for ``spec`` (a ``ModelSpec``) on ``enc``: ``model.batch_size``, or for ``auto`` the
    size ``engine.batch_size.choose_batch_size`` finds on this device (fixed for the whole run)."""
    if spec.batch_size == "auto":
        from .engine.batch_size import choose_batch_size        # torch: not on validate's or a rerun's path
        return choose_batch_size(lm, enc, padding_side=spec.padding_side.value)
    return spec.batch_size


@dataclass
class Inputs:
    pairs: object          # PairSet (file order, after filters)
    lm: object             # LoadedModel
    enc: object            # EncodedPairs: what the model sees, in order
    batch_size: int = 16   # rows per forward (``model.batch_size``, ``auto`` resolved)


def load_inputs(run, base_dir: str | None = None, *, pairs=None) -> Inputs:
    """Pairs (``pairs``: already read from ``run.dataset``), model and encoding of a validated ``RunConfig``;
    ``SpecError`` when no pair is left."""
    pairs = load_dataset(run.dataset, base_dir) if pairs is None else pairs
    lm = load_lm(run.model, base_dir)
    enc = encode(lm, pairs, run.model)
    if not enc.pair_ids:
        raise SpecError("dataset", "no pair is left to score after exclusions.", fix="check dataset.limit and filters.")
    return Inputs(pairs, lm, enc, batch_size(run.model, lm, enc))


def numerics(spec) -> dict:
    """How a ``ModelSpec`` turns pairs into numbers beyond its weights (the one such dict: runs, frames, fit)."""
    out = {"dtype": spec.dtype.value, "max_length": spec.max_length, "format": spec.format.value,
           "template": spec.template if spec.format.value == "plain" else None, "objectives": list(spec.objectives)}
    if spec.dtype.value != "float32":             # reduced precision: the kernels' rounding shows (models.placement)
        from .models.placement import execution_type
        out["execution"] = execution_type(spec)
    kind = kind_settings(spec)                    # {} for the classifier: its run ids are as before
    return {**out, "signal": kind} if kind else out
