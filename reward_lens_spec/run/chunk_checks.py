"""Whether a streamed run's stored chunks may be adopted (``run.stream``): each chunk marker's HMAC tag
(``store.attempts.Attempt.authentic``) and the digest of every region it records, re-read from the store.

A chunk whose marker is forged, edited, copied or unsigned, or whose stored regions no longer match its
recorded digests (a flipped bit, a missing chunk, a chunk failing its checksum) is recomputed, never adopted.
An array or group the marker records that is gone altogether (removed by hand) cannot be recomputed into: the
attempt is refused in one line naming its folder.
"""
from __future__ import annotations

from ..errors import StoreError
from ..store.digest import values_digest
from ..store.groups import open_variable


def unverified_chunks(att, slices, labels, p: int, marks: dict) -> set:
    """Chunks among ``marks`` (index -> marker) whose marker is not this user's as written (``Attempt.authentic``),
    records no digests, or records digests their stored regions do not match: recomputed, never adopted.
    ``slices``: the run's pair chunks (``run.stream.chunk_slices``); ``labels``: ``labels(group)``, the groups'
    pair labels read once (``run.stream_arrays.labels_once``); ``p``: the pass whose markers these are."""
    if not marks:
        return set()
    cache, bad = {}, set()
    for k, m in sorted(marks.items()):
        want = (m or {}).get("digests")
        if not want or not isinstance(want, dict) or not att.authentic(f"{f'pass{p}.' if p else ''}chunk.{k}", m):
            bad.add(k)
            continue
        sl = slices[k]
        for key, digest in want.items():
            path, _, coord = key.partition(":")
            group, _, name = path.rpartition("/")
            try:
                if path not in cache:
                    cache[path] = open_variable(att.zarr_store(), group, name, labels=labels(group))
                v = cache[path].isel(pair=sl)
                got = values_digest((v.coords[coord] if coord else v).values)
            except Exception as e:               # a missing chunk, a chunk failing its checksum, ...
                if _gone(e):
                    raise StoreError(f"store {att.b.url}: run {att.run_id}: attempt {att.aid} no longer holds "
                                     f"{path}, which its chunk {k} records (removed by hand or damaged), so it "
                                     f"cannot be resumed. Fix: remove the folder {att.prefix} from the store and "
                                     "run again.") from None
                got = None
            if got != digest:
                bad.add(k)
                break
    return bad


def _gone(e: Exception) -> bool:
    """Whether reading a recorded region failed because its array or group is not there at all."""
    from zarr.errors import NodeNotFoundError

    return isinstance(e, (NodeNotFoundError, FileNotFoundError, KeyError))
