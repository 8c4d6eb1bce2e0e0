"""Variable-length byte rows held flat (one ``uint8`` buffer and ``n + 1`` int64 offsets, row ``i`` is
``data[off[i]:off[i+1]]``), as Arrow strings and ``models.pair_ids.PairIds`` hold them: ``prefixed`` puts a
fixed-width head before every row in one numpy pass, with no ``bytes`` object per row."""
from __future__ import annotations

import numpy as np


def prefixed(data: np.ndarray, off: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """``heads[0] + row 0 + heads[1] + row 1 + …`` as one ``uint8`` array: ``data`` (``uint8``), ``off`` (the rows'
    ``n + 1`` offsets into ``data``, which may start past 0) and ``heads`` (``uint8``, shape ``(n, width)``)."""
    n, width = heads.shape
    base = int(off[0])
    out = np.empty(n * width + int(off[-1]) - base, np.uint8)
    at = ((width * np.arange(n) + (off[:-1] - base))[:, None] + np.arange(width)).ravel()   # each head's bytes
    body = np.ones(out.size, bool)
    body[at] = False
    out[at] = heads.ravel()
    out[body] = data[base:int(off[-1])]
    return out
