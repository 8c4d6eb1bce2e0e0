"""Leases and fencing of an attempt's writers (``store.attempts``): whether a lease document may belong to a
live writer, and the zarr store that checks the writer still holds its role before every key it writes.

A lease is live while it is unreleased, its heartbeat is younger than ``LEASE_S`` seconds and, on this host,
its process exists (a zombie counts as dead).
"""
from __future__ import annotations

import asyncio
import os
import socket
import time

from reward_lens_spec.errors import StoreError

# a lease whose heartbeat is older than this is dead (env REWARD_LENS_SPEC_LEASE_S: e.g. shorter in tests)
LEASE_S = float(os.environ.get("REWARD_LENS_SPEC_LEASE_S") or 60.0)
HOST = socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie (killed, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:                                          # a zombie (killed, not yet reaped) is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def lease_live(doc: dict | None, *, lease_s: float | None = None, now: float | None = None) -> bool:
    """True when a lease document may belong to a live writer (unreleased, fresh heartbeat,
    and — on this host — its process exists)."""
    if not doc or doc.get("released"):
        return False
    if doc.get("host") == HOST and isinstance(doc.get("pid"), int) and not pid_alive(doc["pid"]):
        return False
    beat = doc.get("beat")
    return isinstance(beat, (int, float)) and (now or time.time()) - beat < (lease_s or LEASE_S)


def fenced_store(zstore, guard):
    """A zarr store over ``zstore`` that calls ``guard()`` (raising StoreError when this writer no longer
    holds its role) before every write, and refuses every delete. ``fence_parts()`` gives ``(guard, the store
    it wraps)`` to ``store.zarr_io.put_batches``, which calls ``guard()`` once per batch of keys it writes."""
    store = _fenced_class()(zstore)
    store._guard = guard
    return store


_FENCED = []


def _fenced_class():
    """The fenced store's class, made once (zarr's store classes are costly to subclass per call)."""
    if _FENCED:
        return _FENCED[0]
    from zarr.storage import WrapperStore

    class FencedStore(WrapperStore):
        _guard = None

        def _with_store(self, store):              # zarr's copies (read-only, context) keep the guard
            out = type(self)(store=store)
            out._guard = self._guard
            return out

        async def set(self, key, value):
            await asyncio.to_thread(self._guard)
            await self._store.set(key, value)

        async def set_if_not_exists(self, key, value):
            await asyncio.to_thread(self._guard)
            await self._store.set_if_not_exists(key, value)

        def fence_parts(self):
            return self._guard, self._store

        async def _set_many(self, values):
            for key, value in values:
                await self.set(key, value)

        async def delete(self, key):
            raise StoreError(f"refusing to delete {key} from an attempt: stored arrays are write-once")

        async def delete_dir(self, prefix):
            raise StoreError(f"refusing to delete {prefix} from an attempt: stored arrays are write-once")

    _FENCED.append(FencedStore)
    return FencedStore
