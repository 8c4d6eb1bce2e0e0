"""Trust levels, computed from what a run has — never typed into a config.

exploratory   the default, and the level of every output variable no passing card graded.
calibrated    every latest scorecard (per organism kind and base) for this observable's
              content hash on the run's model family is valid and passes — ranking,
              floor, magnitude against planted truth and identities (``trust.scorecard``)
              — and the run's own exactness identities hold (``trust.identities``).
registered    calibrated, and the run executes a verified frozen study, frozen before
              the run, whose pins (observable content hash, model fingerprint,
              dataset checksum) equal the run's (``trust.studies``).
adjudicated   the trust of an adjudication record whose runs all derive registered.

The level is derived on read from the evidence chain (``trust.evidence_chain``); what a
run stores is a cache, written by ``seal_run`` from the same derivation.
``spec.validate`` refuses a ``trust`` key anywhere in a config.
"""
from __future__ import annotations

from datetime import datetime, timezone

from ..levels import LEVELS
from ..trust.evidence import seal
from ..trust.evidence_chain import Evidence
from ..errors import StoreError
from ..store.digest import KEY, result_digests
from ..trust.sae_gate import sae_record
from ..trust.study_doc import load_study, study_hash

__all__ = ["LEVELS", "seal_run", "derive_pending"]


def derive_pending(run_id: str, attrs: dict, store) -> dict:
    """The verdict ``attrs`` would get on read if written now as ``run_id`` (reads the store only; ``store``:
    the run's store handle, ``store.store_handle``)."""
    from ..store import open_store                 # xarray: off the cli's import (a rerun reads JSON documents)

    try:
        st = open_store(store)
        docs, log = st.documents(), st.log()
    except StoreError:          # no store yet: no cards, no studies, an empty log
        docs, log = {}, None
    now = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    docs[run_id] = {"created": now, **attrs, "run_id": run_id}
    return Evidence(docs, log, pending=run_id).derive(run_id)


def seal_run(run_id: str, attrs: dict, result, observable, experiment, store, *, logits, pair_ids, lm) -> dict:
    """``attrs`` of a computed result, completed for the evidence chain, sealed, with the trust cache.

    Adds ``observable_spec_hash``, the hash of the study it executed (frozen or not) and the
    run's ``identities`` (checked against the model's own head output ``logits``, pair × side ×
    output in reward units, for ``pair_ids`` in order), seals, then caches the derived level as
    ``trust`` and ``trust_by_variable`` — also as each output variable's ``trust`` attr in ``result``.
    ``observable``: the run's ``ObservableSpec``; ``experiment``: its study (``run.experiment``; empty for none);
    ``store``: the run's store handle (``store.store_handle``), read for the evidence the verdict derives from.

    ``result`` is the run's stored outputs (opened from the store): the identities are checked on the
    stored arrays, and the digest of every stored array (``store.digest``: data block by block on its
    chunk grid, every coordinate incl. the ``pair`` index and pair labels) goes under the seal as
    ``data_digests``, so editing the data or a digest breaks the run on read.
    """
    from ..trust.identities import check_identities
    from ..identity import observable_hash
    attrs = {**attrs, KEY: {observable.name: result_digests(result)},
             "observable_spec_hash": observable_hash(observable),
             "identities": check_identities(result, logits, pair_ids,
                                            n_layers=lm.n_layers, objectives=lm.head.objectives,
                                            dtype=str(lm.dtype), signal=getattr(lm, "signal", None))}
    sae = sae_record(result)
    if sae is not None:                 # an SAE's fit to this model, under the seal (trust.sae_gate)
        attrs["sae"] = sae
    if experiment and not attrs.get("study_hash"):         # executed a study never frozen: say which
        attrs["study_hash"] = study_hash(load_study(dict(experiment)))
    attrs.pop("trust", None)
    sealed = seal(attrs)
    verdict = derive_pending(run_id, sealed, store)
    for v in result.data_vars:
        result[v].attrs["trust"] = verdict["trust_by_variable"].get(v, verdict["trust"])
    return {**sealed, "trust": verdict["trust"], "trust_by_variable": verdict["trust_by_variable"]}
