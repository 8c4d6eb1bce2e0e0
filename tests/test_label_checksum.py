"""The dataset checksum (so the run id) covers the label fields the preference operators read."""
from __future__ import annotations

import hashlib
import json

from reward_lens_spec.data import Pair, dataset_checksum
from reward_lens_spec.data.checksum import pair_hash
from reward_lens_spec.data.pairs import make_meta


def test_votes_groups_and_agreement_change_the_checksum_other_meta_does_not():
    base = Pair(id="a", prompt="p", chosen="c", rejected="r", dimension="d")
    direct = hashlib.sha256(json.dumps(["p", None, "c", "r", "d"], separators=(",", ":")).encode()).hexdigest()
    assert pair_hash(base) == direct                                     # unchanged without label fields
    other = Pair(**{**base.__dict__, "meta": make_meta({"source_line": 3})})
    assert pair_hash(other) == direct
    hashes = {pair_hash(Pair(**{**base.__dict__, "meta": make_meta(m)}))
              for m in ({"votes": [1, 1, 0]}, {"votes": [1, 1, 1]}, {"agreement": 0.5}, {"group": "g1"},
                        {"group": "g2"})}
    assert len(hashes) == 5 and direct not in hashes
    a = [Pair(id="x", prompt="p", chosen="c", rejected="r", meta=make_meta({"votes": [1, 0]}))]
    b = [Pair(id="x", prompt="p", chosen="c", rejected="r", meta=make_meta({"votes": [1, 1]}))]
    assert dataset_checksum(a) != dataset_checksum(b)
