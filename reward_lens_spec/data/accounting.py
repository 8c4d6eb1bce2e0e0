"""Every pair accounted for: which pairs were left out and why, which kept pairs carry a flag.

``pair_flags(pairs, encoded, ids)`` gives, for the kept pair ids ``ids`` (dims: ``pair``), one
boolean array per flag of ``PAIR_FLAGS`` (``data.pairs``): ``empty_response`` and
``identical_sides`` come from the loaded ``PairSet.flags``; ``prompt_truncated`` and
``response_truncated`` from the ``EncodedPairs`` (``models.formatting.encode_pairs``); a kind's own
flags (``KIND_FLAGS``, e.g. a PRM's ``no_step_separator``) from ``EncodedPairs.kind_flags``, on that kind's runs
only. Every stored result with a ``pair`` dim carries them as coords (``RunContext.pair_coords``).

``accounting(pairs, encoded)`` is what the run attrs record: ``excluded`` (reason -> ids:
``prompt_mismatch`` from the loader, ``identical_after_truncation`` and ``response_truncated``
from the encoding) and ``pair_flags`` (flag -> ids of KEPT pairs). ``summary_line`` is the one
console line with the counts and where the ids are.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .pairs import KIND_FLAGS, PAIR_FLAGS
import yaml


def _flag_ids(pairs: Any, encoded: Any) -> dict[str, set[str]]:
    flags = getattr(pairs, "flags", None) or {}
    return {"empty_response": set(flags.get("empty_response", ())),
            "identical_sides": set(flags.get("identical_sides", ())),
            "prompt_truncated": set(getattr(encoded, "prompt_truncated", ()) or ()),
            "response_truncated": set(getattr(encoded, "response_truncated", ()) or ()),
            **{k: set(v) for k, v in (getattr(encoded, "kind_flags", None) or {}).items() if k in KIND_FLAGS}}


def pair_flags(pairs: Any, encoded: Any, ids: Sequence[str]) -> dict[str, np.ndarray]:
    """Flag -> bool array over ``ids`` (dims: ``pair``), one per name of ``PAIR_FLAGS`` and per kind flag the
    encoding carries (``EncodedPairs.kind_flags``)."""
    sets = _flag_ids(pairs, encoded)
    cols = {name: np.zeros(len(ids), dtype=bool) for name in sets}
    flagged = set().union(*sets.values())
    if flagged:                                   # one pass over the ids (a PairIds decodes each once)
        for k, i in enumerate(ids):
            if i in flagged:
                for name, ids_on in sets.items():
                    cols[name][k] = i in ids_on
    return cols


def accounting(pairs: Any, encoded: Any) -> dict[str, dict[str, list[str]]]:
    """``{"excluded": reason -> ids, "pair_flags": flag -> kept ids}`` (JSON-safe, ids in data order)."""
    excluded = {"prompt_mismatch": list((getattr(pairs, "flags", None) or {}).get("prompt_mismatch", ()))}
    excluded.update({k: list(v) for k, v in encoded.excluded.items()})
    kept = encoded.pair_ids              # a list or PairIds: walked once, only the flagged ids indexed
    arrays = pair_flags(pairs, encoded, kept)
    return {"excluded": excluded,
            "pair_flags": {name: [kept[k] for k in np.flatnonzero(col).tolist()] for name, col in arrays.items()}}


def _n(v) -> int:
    return len(v) if isinstance(v, (list, tuple, set)) else int(v or 0)


def _by_kind(d: dict | None) -> str:
    """``{kind: ids or n}`` -> ``" (kind n, ...)"`` over the non-zero kinds, or ``""``."""
    hit = sorted((k, _n(v)) for k, v in (d or {}).items() if _n(v))
    return f" ({', '.join(f'{k} {v}' for k, v in hit)})" if hit else ""


def n_flagged(pair_flags: dict | None) -> int:
    """Scored pairs carrying at least one flag: a pair with two flags counts once."""
    ids: set = set()
    for v in (pair_flags or {}).values():
        ids.update(v if isinstance(v, (list, tuple, set)) else ())
    return len(ids)


def pairs_phrase(excluded: dict | None, pair_flags: dict | None, n_scored: int | None,
                 restricted: tuple[int, list[str]] | None = None) -> str:
    """The one vocabulary of every console line, the store and the report, each count that of the ids stored:

    - **excluded**: not scored, by reason (run attr ``excluded``: reason -> ids);
    - **flagged**: scored but carrying a pair flag, by flag (run attr ``pair_flags``: flag -> ids of scored
      pairs); a pair with two flags counts once in the total;
    - **restricted**: scored but outside ``observable.pairs`` for the restricted outputs
      (``restricted = (n_covered, [outputs])``), so those outputs cover ``n_covered`` of the scored pairs.

    ``"20 of 20 scored; excluded 0; flagged 8 (prompt_truncated 8)"``.
    """
    n_ex = sum(_n(v) for v in (excluded or {}).values())
    scored = "?" if n_scored is None else n_scored
    total = "?" if n_scored is None else n_scored + n_ex
    flagged = ("not recorded" if pair_flags is None else f"{n_flagged(pair_flags)}{_by_kind(pair_flags)}")
    out = f"{scored} of {total} scored; excluded {n_ex}{_by_kind(excluded)}; flagged {flagged}"
    if restricted is not None and n_scored is not None and restricted[0] < n_scored:
        out += (f"; restricted outputs cover {restricted[0]} of {n_scored} pairs "
                f"(observable.pairs: {', '.join(restricted[1])})")
    return out


def pairs_limit(prov: dict) -> int | None:
    """``observable.pairs`` of a stored run (from its resolved config), or None when unset or unknown."""
    try:
        n = ((yaml.safe_load(prov.get("config_yaml") or "") or {}).get("observable") or {}).get("pairs")
    except (yaml.YAMLError, AttributeError):
        return None
    return int(n) if isinstance(n, int) else None


def pairs_covered(var) -> int:
    """Pairs (along ``pair``) with at least one finite value of ``var``."""
    other = [d for d in var.dims if d != "pair"]
    v = np.asarray(var.transpose("pair", *other).values, dtype=float).reshape(var.sizes["pair"], -1)
    return int(np.isfinite(v).any(axis=1).sum())


def restricted_outputs(ds, limit: int | None) -> tuple[int, list[str]] | None:
    """``(n_covered, [variables])``: the outputs ``observable.pairs=limit`` restricts (a ``pair`` dim and no
    finite value past the first ``limit`` pairs); None when nothing is restricted."""
    if limit is None:
        return None
    names = []
    for name in sorted(map(str, ds.data_vars)):
        var = ds[name]
        if "pair" not in var.dims or not np.issubdtype(var.dtype, np.number) or var.sizes["pair"] <= limit:
            continue
        if pairs_covered(var.isel(pair=slice(limit, None))) == 0:
            names.append(name)
    return (min(limit, max(ds.sizes.get("pair", 0), 0)), names) if names else None


def summary_line(acc: dict, n_scored: int) -> str:
    """One line: pairs scored, excluded and flagged by reason (``pairs_phrase``), and where the ids are."""
    return (f"pairs: {pairs_phrase(acc['excluded'], acc['pair_flags'], n_scored)}; "
            "ids: run attrs 'excluded' and 'pair_flags', and each result's per-pair coords")
