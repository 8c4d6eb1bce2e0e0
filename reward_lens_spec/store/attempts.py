"""One writer's prefix of a run: attempts, leases and chunk markers (completion: ``store.completion``).

However many processes write one run id, each launch writes under an **attempt**
prefix of its own, outside the Zarr hierarchy plain readers open (``_internal/``), and the
run becomes visible by one atomic write of the run document naming the attempt whose
data it lists, after that attempt's data are published into the run group (``store.publish``)::

    runs/<run_id>/zarr.json                 run document: empty attrs until completion, then the
                                            run's attrs + ``complete: true`` + ``attempt: <aid>``
    runs/<run_id>/<observable>/             the published data of the attempt the document names
    _internal/attempts/<run_id>/<aid>/zarr.json   attempt group (the root of a Zarr hierarchy of its own);
                                            attrs: shards, chunk_pairs, n_pairs, created
    _internal/attempts/<run_id>/<aid>/<observable>/   that attempt's data (one group per variable)
    _internal/attempts/<run_id>/<aid>/_ctl/lease.<role>.<gen>.json   who works on a role, renewed by a heartbeat
    _internal/attempts/<run_id>/<aid>/_ctl/chunk.<k>.json   chunk ``k``'s regions are written (its counts, its
                                            writer, the digests of its regions, and ``tag``: an HMAC under
                                            the writing user's key, ``Attempt.authentic``)
    _internal/attempts/<run_id>/<aid>/_ctl/skeleton.json   the arrays of every chunk exist
    _internal/attempts/<run_id>/_publish/_ctl/lease.publish.<gen>.json   who publishes the run now
    _internal/attempts/_root/_publish/_ctl/lease.root.<gen>.json   who updates the root's consolidated
                                            metadata now (``store.publish.consolidate``)

Roles are ``write`` (a whole-dataset ``write_run``), ``skeleton``, ``shard-<i>``
(the pair chunks ``k`` with ``k % shards == i``) and ``reduce`` (the steps that
reduce over pairs, then completion). A role is claimed by creating generation
``g + 1`` of its lease exclusively (hard link locally, ``If-None-Match`` on object
stores), only when generation ``g`` is released or dead: its writer's heartbeat is
older than ``lease_s`` or, on the same host, its process no longer exists. So shards
of one launch share an attempt, a rerun after a kill adopts the dead attempt and
computes only its missing chunks, and a second live launch gets an attempt of its own.
The lock leases (``publish``, ``root``) keep only their latest generations: a claim removes the one before.

Fencing: before every write a holder checks that its own heartbeat succeeded within
``lease_s / 2`` and that no later generation of its role exists; a displaced or
stalled writer stops there. Array data go through ``Attempt.zstore(role)``, a zarr store
that repeats that check before **every key** it writes and refuses every delete, so a
writer stopped (SIGSTOP, a long GC pause) in the middle of a zarr call and resumed
after another writer took its role over and completed the attempt stops at its next
key: at most the one key write in flight when it stopped lands, and nothing is ever
deleted (groups are created with ``mode="w-"`` or written into with ``"a"``, never
``"w"``). Data of an attempt named by a complete run document is
never written again (no role of it can be claimed), so a displaced or killed writer
can never change what readers list.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid

from reward_lens_spec.errors import StoreError
from reward_lens_spec.signed_cache import tagged_by_user, user_tag
from reward_lens_spec.store._backend import DOC, INTERNAL, RUNS, Backend, group_doc
from reward_lens_spec.store.leases import HEARTBEAT, HOST, LEASE_S, fenced_store, lease_live
from reward_lens_spec.store.state import complete_attrs, run_state

PREFIX = "attempt-"
MARKER_TAG = "chunk-marker"     # the kind of a marker's tag (signed_cache.user_tag)
CTL = "_ctl"
ATTEMPTS = f"{INTERNAL}/attempts"     # <run_id>/<aid>: every attempt of a run
PUBLISH = "_publish"           # the run-level lease completion and publication are serialised by
_LEASE = re.compile(r"^lease\.(?P<role>[A-Za-z0-9-]+)\.(?P<gen>\d+)\.json$")
_CHUNK = re.compile(r"^chunk\.(?P<k>\d+)\.json$")


def list_attempts(b: Backend, run_id: str) -> list[str]:
    """Attempt ids of ``run_id`` (never through a symlink), sorted."""
    return [n for n in b.list_dirs(f"{ATTEMPTS}/{run_id}") if n.startswith(PREFIX)]


class Attempt:
    """One attempt prefix of one run, as seen (and, for claimed roles, written) by this process."""

    def __init__(self, b: Backend, run_id: str, aid: str, meta: dict, *, lease_s: float = LEASE_S):
        self.b, self.run_id, self.aid, self.meta, self.lease_s = b, run_id, aid, meta, lease_s
        self.prefix = f"{ATTEMPTS}/{run_id}/{aid}"
        self._zs = None
        self.writer = f"{HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._held: dict[str, int] = {}
        self._last_ok = time.monotonic()
        self._lock = threading.Lock()
        self._beating = threading.Lock()          # held while the heartbeat renews this attempt's leases
        self._closed = False

    # -- creation and discovery -------------------------------------------------------
    @classmethod
    def create(cls, b: Backend, run_id: str, meta: dict, *, aid: str | None = None, role: str | None = None,
               lease_s: float = LEASE_S) -> "Attempt":
        """A new attempt (``aid`` given: join it if it exists with the same ``meta``).

        The run document is created first as an empty placeholder (zarr then never writes it
        while it builds parent groups; a garbage one is replaced by the placeholder).
        With ``role``, the role is claimed before the attempt document exists, so a gc never
        sees the attempt without a live lease. Raises StoreError when a given ``aid`` exists
        with other meta, or ``role`` is held there.
        """
        b.check_inside(f"{RUNS}/{run_id}")
        b.check_inside(f"{ATTEMPTS}/{run_id}")
        if not b.create_exclusive(f"{RUNS}/{run_id}/{DOC}", group_doc({})) and \
                run_state(b, run_id)[0] == "corrupt":        # garbage lists nothing: a placeholder replaces it
            b.write_atomic(f"{RUNS}/{run_id}/{DOC}", group_doc({}))
        att = cls(b, run_id, aid or PREFIX + uuid.uuid4().hex[:16], dict(meta), lease_s=lease_s)
        if role is not None and not att.claim(role):
            raise StoreError(f"store {b.url}: run {run_id} attempt {att.aid}: role {role} is held by a live writer.")
        doc = group_doc({**meta, "created": time.time()})
        if not b.create_exclusive(f"{att.prefix}/{DOC}", doc):
            other = att.read_meta()
            if other is None or any(other.get(k) != v for k, v in meta.items()):
                att.close()
                raise StoreError(f"store {b.url}: run {run_id} attempt {att.aid} exists with other settings "
                                 f"({other}); refusing to join it.")
        return att

    @classmethod
    def open(cls, b: Backend, run_id: str, aid: str, *, lease_s: float = LEASE_S) -> "Attempt | None":
        """An existing attempt, or None when its document is missing or garbage."""
        att = cls(b, run_id, aid, {}, lease_s=lease_s)
        meta = att.read_meta()
        if meta is None:
            return None
        att.meta = meta
        return att

    def read_meta(self) -> dict | None:
        try:
            doc = self.b.read_json(f"{self.prefix}/{DOC}")
        except ValueError:
            return None
        return None if doc is None else dict(doc.get("attributes") or {})

    # -- leases ------------------------------------------------------------------------
    def leases(self) -> dict[str, tuple[int, dict | None]]:
        """role -> (highest generation, its lease document or None when unreadable)."""
        best: dict[str, int] = {}
        for name in self.b.list_files(f"{self.prefix}/{CTL}"):
            m = _LEASE.match(name)
            if m and int(m["gen"]) >= best.get(m["role"], -1):
                best[m["role"]] = int(m["gen"])
        out = {}
        for role, gen in best.items():
            try:
                out[role] = (gen, self.b.read_json(self._lease_key(role, gen)))
            except ValueError:
                out[role] = (gen, None)
        return out

    def live_roles(self) -> list[str]:
        """Roles whose latest lease may belong to a live writer."""
        now = time.time()
        return sorted(r for r, (_, d) in self.leases().items() if lease_live(d, lease_s=self.lease_s, now=now))

    def last_activity(self) -> float | None:
        """Newest heartbeat (or release) of any lease, else the attempt's creation time (POSIX s)."""
        beats = [d.get("beat") for _, d in self.leases().values() if d and isinstance(d.get("beat"), (int, float))]
        if beats:
            return max(beats)
        created = (self.read_meta() or {}).get("created")
        return created if isinstance(created, (int, float)) else self.b.mtime(self.prefix)

    def released(self, role: str) -> bool:
        gen_doc = self.leases().get(role)
        return bool(gen_doc and gen_doc[1] and gen_doc[1].get("released"))

    def claim(self, role: str) -> bool:
        """Claim ``role`` when it is free, released-and-``reclaimable`` or dead; True when this process holds it."""
        if self.named():
            return False                  # a listed attempt is never written again
        cur = self.leases().get(role)
        if cur is not None and lease_live(cur[1], lease_s=self.lease_s):
            return False
        gen = 0 if cur is None else cur[0] + 1
        try:
            created = self.b.create_exclusive(self._lease_key(role, gen), self._lease_doc(False))
        except StoreError as e:
            raise self._collected(e) from None
        if not created:
            return False
        if self.aid == PUBLISH and gen > 0 and self._superseded(role, gen):
            self._remove_lease(role, gen)             # a removed generation re-created: never the lease
            return False
        if self.aid == PUBLISH and gen > 0:
            # A lock lease (a run's ``publish``, the store's ``root``) gets a generation per claim: the one
            # before is removed, so the folder holds one or two files however often it is claimed. Safe: the
            # highest generation decides a claim; a claimer that listed before this one took ``gen`` fails
            # its exclusive create of ``gen`` and retries; one that re-creates a removed lower generation (it
            # listed before earlier claims) sees a higher one right after (``_superseded`` above) and fails;
            # and a displaced holder's ``fence`` looks for any higher generation, not only the next.
            self._remove_lease(role, gen - 1)
        with self._lock:
            self._held[role] = gen
            self._last_ok = time.monotonic()
        self._start_heartbeat()
        return True

    def _remove_lease(self, role: str, gen: int) -> None:
        try:
            self.b.remove_file(self._lease_key(role, gen))
        except StoreError:                        # best effort: a file left over is never read as the lease
            pass

    def _superseded(self, role: str, gen: int) -> bool:
        """Whether a generation of ``role`` after ``gen`` exists: the next one, or (a lock lease, whose lower
        generations are removed by later claimers) any later one listed."""
        if self.aid != PUBLISH:
            return self.b.exists_key(self._lease_key(role, gen + 1))
        return any(m and m["role"] == role and int(m["gen"]) > gen
                   for m in map(_LEASE.match, self.b.list_files(f"{self.prefix}/{CTL}")))

    def release(self, role: str) -> None:
        """Mark ``role`` done (its lease says ``released``) and stop renewing it."""
        with self._lock:
            gen = self._held.pop(role, None)
        if gen is not None:
            try:
                self.b.write_atomic(self._lease_key(role, gen), self._lease_doc(True))
            except StoreError as e:
                raise self._collected(e) from None

    def _collected(self, e: StoreError) -> StoreError:
        """``e`` in one line naming what happened when the write failed because this attempt's folder went
        (a ``store gc`` collected it while this writer was stalled), else ``e`` itself."""
        if not isinstance(e.__cause__, (FileNotFoundError, NotADirectoryError)):
            return e
        return StoreError(f"store {self.b.url}: run {self.run_id}: attempt {self.aid} was removed while this writer "
                          "was stalled (`store gc` collects an attempt whose writer looks dead); nothing of this "
                          "writer is listed. Fix: run the same command again.")

    def fence(self, role: str) -> None:
        """Raise StoreError unless this process still holds ``role`` (heartbeat fresh, not superseded)."""
        with self._lock:
            gen, age = self._held.get(role), time.monotonic() - self._last_ok
        if gen is None:
            raise StoreError(f"store {self.b.url}: run {self.run_id}: this process does not hold role {role}.")
        if age > self.lease_s / 2:
            raise StoreError(f"store {self.b.url}: run {self.run_id}: the lease on {role} was not renewed for "
                             f"{age:.0f} s; stopping before writing (another writer may have taken over).")
        if self._superseded(role, gen):
            raise StoreError(f"store {self.b.url}: run {self.run_id} attempt {self.aid}: role {role} was taken "
                             "over by another writer; this one stops without writing.")

    def zarr_store(self):
        """This attempt's zarr store: rooted at its prefix (groups are ``<observable>``, ``_stage``)."""
        if self._zs is None:
            self._zs = self.b.zarr_store(self.prefix)
        return self._zs

    def zstore(self, role: str):
        """This attempt's zarr store, fenced: ``fence(role)`` before every key written, no deletes."""
        return fenced_store(self.zarr_store(), lambda: self.fence(role))

    def generation(self, role: str) -> int | None:
        """The generation of ``role`` this process holds (0: the first holder; more: it took over)."""
        with self._lock:
            return self._held.get(role)

    def _lease_key(self, role: str, gen: int) -> str:
        return f"{self.prefix}/{CTL}/lease.{role}.{gen}.json"

    def _lease_doc(self, released: bool) -> bytes:
        return json.dumps({"writer": self.writer, "host": HOST, "pid": os.getpid(), "beat": time.time(),
                           "released": released}).encode()

    def _start_heartbeat(self) -> None:
        if not self._closed:
            HEARTBEAT.add(self, self.lease_s / 6, self._beat)

    def _beat(self) -> None:
        """Renew every role this attempt holds (``leases.HEARTBEAT`` calls it every ``lease_s / 6`` seconds)."""
        with self._beating:
            if self._closed:
                return
            with self._lock:
                held = dict(self._held)
            try:
                for role, gen in held.items():
                    self.b.write_atomic(self._lease_key(role, gen), self._lease_doc(False))
                with self._lock:
                    self._last_ok = time.monotonic()
            except Exception:         # an unreachable store: fence() stops this writer
                pass

    def close(self) -> None:
        """Stop the heartbeat (held roles then expire; released ones stay released); a renewal under way is
        waited for (at most 5 s), so none is written after this returns."""
        self._closed = True
        HEARTBEAT.discard(self)
        if self._beating.acquire(timeout=5):
            self._beating.release()

    # -- chunks and the run document ---------------------------------------------------------------
    def mark(self, name: str, info: dict, role: str) -> None:
        """Record ``_ctl/<name>.json`` (e.g. ``chunk.3``, ``skeleton``) after its data are written, tagged
        with this user's key (``signed_cache.user_tag``) over the run, the attempt, the name and ``info``."""
        self.fence(role)
        tag = user_tag(MARKER_TAG, self._marker_text(name, info))
        doc = {**info, "tag": tag} if tag else info
        try:
            self.b.write_atomic(f"{self.prefix}/{CTL}/{name}.json", json.dumps(doc, sort_keys=True).encode())
        except StoreError as e:
            raise self._collected(e) from None

    def _marker_text(self, name: str, info: dict) -> str:
        return json.dumps([self.run_id, self.aid, name, {k: v for k, v in info.items() if k != "tag"}],
                          sort_keys=True)

    def authentic(self, name: str, marker: dict | None) -> bool:
        """True when ``marker`` (as read from ``_ctl/<name>.json``) carries this user's tag over exactly its
        content here: a marker edited, copied from another chunk or attempt, or written by someone else (a
        writer with store access, or another user) is not, and its chunk is recomputed, never adopted."""
        return isinstance(marker, dict) and tagged_by_user(MARKER_TAG, self._marker_text(name, marker),
                                                           marker.get("tag"))

    def marker(self, name: str) -> dict | None:
        try:
            return self.b.read_json(f"{self.prefix}/{CTL}/{name}.json")
        except ValueError:
            return None

    def chunks_done(self) -> dict[int, dict]:
        """chunk index -> its marker, for every chunk whose regions are written."""
        ks = [int(m["k"]) for m in map(_CHUNK.match, self.b.list_files(f"{self.prefix}/{CTL}")) if m]
        return {k: self.marker(f"chunk.{k}") or {} for k in ks}

    def named(self) -> bool:
        """True when the run document is complete and names this attempt."""
        attrs = complete_attrs(self.b, self.run_id)         # (the run document alone: nothing listed)
        return attrs is not None and attrs.get("attempt") == self.aid

    def remove(self) -> None:
        """Delete this attempt's prefix (callers only remove attempts no run document names)."""
        self.b.remove_tree(self.prefix)
