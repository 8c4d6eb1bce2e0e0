"""Leases and fencing of an attempt's writers (``store.attempts``): whether a lease document may belong to a
live writer, the process's one heartbeat thread that renews them (``HEARTBEAT``), and the zarr store that checks
the writer still holds its role before every key it writes.

A lease is live while it is unreleased, its heartbeat is younger than ``LEASE_S`` seconds and, on this host,
its process exists (a zombie counts as dead).
"""
from __future__ import annotations

import asyncio
import os
import socket
import threading
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


class Heartbeat:
    """One daemon thread (started with the first ``add``) that calls each added owner's ``renew()`` every
    ``period`` seconds from when it was added, until it is discarded; one owner's slow ``renew`` delays the
    others' by as long as it takes. A claim's first renewal wakes the thread only when it is due before the
    thread wakes by itself (idle: every ``LEASE_S / 6`` seconds). A forked child starts with no thread and no
    owner. ``store.attempts`` adds every attempt that claims a role (its leases, every ``lease_s / 6`` s)."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._due: dict = {}                  # owner -> [monotonic time of its next renewal, period, renew]
        self._cond = threading.Condition()
        self._thread = None
        self._wakes = float("inf")            # when the thread wakes next by itself

    def add(self, owner, period: float, renew) -> None:
        with self._cond:
            if owner in self._due:
                return
            due = time.monotonic() + period
            self._due[owner] = [due, period, renew]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
                self._thread.start()
            elif due < self._wakes:           # else it wakes in time by itself (no thread switch per claim)
                self._cond.notify()

    def discard(self, owner) -> None:
        with self._cond:
            self._due.pop(owner, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [e for e in self._due.values() if e[0] <= now]
                for e in due:
                    e[0] = now + e[1]
                if not due:                   # idle: wake a default renewal period from now
                    self._wakes = min((e[0] for e in self._due.values()), default=now + LEASE_S / 6)
                    self._cond.wait(self._wakes - now)
                    self._wakes = float("inf")
                    continue
            for e in due:
                e[2]()


HEARTBEAT = Heartbeat()


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
