"""Key-level access to one result store: a local folder or any fsspec URL.

The store is one Zarr v3 hierarchy (layout 4, ``docs/store-format.md``)::

    <url>/zarr.json                 root group; attrs {"reward_lens_spec_layout": 4} and the
                                    consolidated metadata of every complete run (``store.publish``)
    <url>/runs/zarr.json            the group holding every run
    <url>/runs/<run_id>/zarr.json   run group; its attrs are the run's provenance and,
                                    written last, ``complete: true`` + ``attempt``
    <url>/runs/<run_id>/<obs>/      one xarray Dataset: every output variable (``store.publish``)
    <url>/_internal/                not a Zarr node: attempts, staging, control files, the
                                    evidence log, the listed keys

This module reads and writes the small JSON documents (``zarr.json``) itself,
so it can create them exclusively (root) or atomically (run documents), list
runs without opening any array, and tell a garbage document from a missing
one; it never lists, writes or deletes through a symlink. Every failure to reach the store becomes a ``StoreError`` naming the URL.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid

import fsspec
from fsspec.utils import get_protocol

from reward_lens_spec.errors import StoreError

LAYOUT_KEY = "reward_lens_spec_layout"
LAYOUT_VERSION = 4
RUNS = "runs"
DOC = "zarr.json"
INTERNAL = "_internal"      # beside runs/, no zarr.json: not part of the Zarr hierarchy plain readers open
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]{0,199}$")   # a run id or observable name (``writer.check_name``)


def group_doc(attributes: dict) -> bytes:
    """Serialise a Zarr v3 group document with ``attributes`` (unindented: Python's C encoder, where an indent
    takes its pure-Python one, ~10x slower on a run's documents)."""
    doc = {"zarr_format": 3, "node_type": "group", "attributes": attributes}
    return json.dumps(doc, sort_keys=True).encode()


def store_handle(store, storage_options: dict | None = None) -> "Backend":
    """The one handle on a result store: ``store`` itself when it is one (a ``Backend``), else the store URL
    ``store`` (a local path or an fsspec URL) opened with ``storage_options``.

    Every store opening of the package goes through here (``tests/test_store_handle.py`` enumerates the call
    sites): a run opens its store once, in ``run.executor``, and hands this object to every reader and writer
    it calls (xarray's one store object handed down), so the URL's filesystem, credentials and zarr store are
    built once and ``storage_options`` is never threaded by hand. Raises ``StoreError`` for an empty URL, a URL
    whose filesystem cannot be built, or a handle given together with ``storage_options`` (the handle holds
    its own: pass one or the other).
    """
    if isinstance(store, Backend):
        if storage_options and dict(storage_options) != store.storage_options:
            raise StoreError(f"store {store.url}: storage options given beside an open store handle, which has "
                             "its own. Fix: pass the handle alone.")
        return store
    return Backend(store, storage_options)


class Backend:
    """One store URL resolved to a filesystem, a root path and a Zarr store: the store handle
    (``store_handle`` makes one; it is handed down, never re-made from its URL).

    Raises ``StoreError`` when the URL's filesystem cannot be built (unknown
    protocol, missing driver such as ``s3fs``).
    """

    def __init__(self, url: str, storage_options: dict | None = None):
        if not isinstance(url, str) or not url:
            raise StoreError(f"store url must be a non-empty string, got {url!r}.")
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.local = get_protocol(url) in ("file", "local")
        try:
            if self.local:
                self.root = os.path.abspath(os.path.expanduser(url.split("://", 1)[-1]))
                self.fs = fsspec.filesystem("file")
            else:
                self.fs, self.root = fsspec.core.url_to_fs(url, **self.storage_options)
                self.root = self.root.rstrip("/")
        except (ImportError, ValueError) as e:
            raise StoreError(f"store {url}: cannot open this URL ({e}).") from e
        self._zarr_store = None

    # -- paths -----------------------------------------------------------------
    def path(self, key: str) -> str:
        """Absolute filesystem path of ``key`` (a '/'-separated store key)."""
        return f"{self.root}/{key}" if key else self.root

    def zarr_store(self, prefix: str = ""):
        """The zarr Store object xarray reads and writes through; ``prefix``: a store rooted at that key
        (an attempt: a Zarr hierarchy of its own, so zarr never writes a group document above it). A
        synchronous filesystem's store is ``FsspecStore.from_url``'s, on this handle's filesystem wrapped once
        (``store.async_fs``)."""
        if not prefix and self._zarr_store is not None:
            return self._zarr_store
        import zarr.storage

        if self.local:
            zs = zarr.storage.LocalStore(self.path(prefix))
        elif self.fs.async_impl:
            zs = zarr.storage.FsspecStore.from_url(f"{self.url.rstrip('/')}/{prefix}" if prefix else self.url,
                                                   storage_options=self.storage_options)
        else:
            from zarr.storage._fsspec import ALLOWED_EXCEPTIONS

            from reward_lens_spec.store.async_fs import async_wrapper

            zs = zarr.storage.FsspecStore(fs=async_wrapper(self.fs), path=self.path(prefix),
                                          allowed_exceptions=ALLOWED_EXCEPTIONS)
        if not prefix:
            self._zarr_store = zs
        return zs

    def _fail(self, what: str, e: BaseException) -> StoreError:
        return StoreError(f"store {self.url}: cannot {what} ({type(e).__name__}: {e}).")

    # -- documents ---------------------------------------------------------------
    def read(self, key: str) -> bytes | None:
        """Bytes at ``key``, or None when absent; StoreError when unreachable."""
        try:
            return self.fs.cat_file(self.path(key))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except Exception as e:  # network, permissions, bad credentials
            raise self._fail(f"read {key}", e) from e

    def read_json(self, key: str):
        """Parsed JSON at ``key``; None when absent; ValueError when garbage."""
        raw = self.read(key)
        if raw is None:
            return None
        doc = json.loads(raw.decode("utf-8"))  # ValueError (incl. UnicodeDecodeError)
        if not isinstance(doc, dict):
            raise ValueError(f"{key} is not a JSON object")
        return doc

    def write_atomic(self, key: str, data: bytes) -> None:
        """Write ``key`` so readers see the old or the new bytes, never a part.

        Local: temp file in the same folder, then ``os.replace``. Object stores:
        a single PUT, which is atomic.
        """
        target = self.path(key)
        self.check_inside(key)
        try:
            if self.local:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                tmp = self._tmp_for(target)
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, target)
            else:
                self.fs.pipe_file(target, data)
        except Exception as e:
            raise self._fail(f"write {key}", e) from e

    def put_many(self, files: dict[str, bytes]) -> None:
        """Upload ``{absolute path: bytes}`` (object stores batch these concurrently)."""
        try:
            self.fs.pipe(files)
        except Exception as e:
            raise self._fail(f"upload {len(files)} objects", e) from e

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if absent; True if this call created it.

        Local: complete temp file hard-linked into place (fails if present).
        Object stores: conditional PUT (``If-None-Match: *``); where the service
        refuses that, exists-then-PUT (only identical root documents race there).
        """
        target = self.path(key)
        self.check_inside(key)
        try:
            if self.local:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                tmp = self._tmp_for(target)
                with open(tmp, "wb") as f:
                    f.write(data)
                try:
                    os.link(tmp, target)
                    return True
                except FileExistsError:
                    return False
                finally:
                    os.unlink(tmp)
            try:
                self.fs.pipe_file(target, data, mode="create")
                return True
            except FileExistsError:
                return False
            except (TypeError, NotImplementedError, ValueError):
                if self.fs.exists(target):
                    return False
                self.fs.pipe_file(target, data)
                return True
        except StoreError:
            raise
        except Exception as e:
            raise self._fail(f"create {key}", e) from e

    @staticmethod
    def _tmp_for(target: str) -> str:
        head, tail = os.path.split(target)
        return os.path.join(head, f".{tail}.{os.getpid()}.{uuid.uuid4().hex}.tmp")

    # -- listing and removal ------------------------------------------------------
    def list_dirs(self, key: str) -> list[str]:
        """Names of the child folders of ``key``, sorted; symlinks are never listed.

        A symlink placed in the store may point into another store or anywhere on disk:
        nothing here lists, follows or deletes through one.
        """
        base = self.path(key)
        try:
            if self.local:
                if not os.path.isdir(base) or self.is_link(key):
                    return []
                return sorted(n for n in os.listdir(base) if not n.startswith(".")
                              and not os.path.islink(os.path.join(base, n))
                              and os.path.isdir(os.path.join(base, n)))
            try:
                entries = self.fs.ls(base, detail=True, refresh=True)
            except FileNotFoundError:
                return []
        except Exception as e:
            raise self._fail(f"list {key}", e) from e
        names = {e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries
                 if e.get("type") == "directory"}
        return sorted(n for n in names if not n.startswith("."))

    def list_files(self, key: str) -> list[str]:
        """Names of the plain files directly in ``key`` (no symlinks), sorted; [] when absent."""
        base = self.path(key)
        try:
            if self.local:
                if not os.path.isdir(base) or self.is_link(key):
                    return []
                return sorted(n for n in os.listdir(base) if not n.startswith(".")
                              and os.path.isfile(os.path.join(base, n))
                              and not os.path.islink(os.path.join(base, n)))
            try:
                entries = self.fs.ls(base, detail=True, refresh=True)
            except FileNotFoundError:
                return []
        except Exception as e:
            raise self._fail(f"list {key}", e) from e
        return sorted(e["name"].rsplit("/", 1)[-1] for e in entries if e.get("type") == "file")

    def list_runs(self) -> list[str]:
        """Names of every child folder of ``runs/`` (complete or not), sorted; never a symlink."""
        return self.list_dirs(RUNS)

    def is_link(self, key: str) -> bool:
        """True when ``key`` or any folder between the store root and it is a symlink (local only)."""
        if not self.local:
            return False
        parts = [p for p in key.split("/") if p]
        return any(os.path.islink(self.path("/".join(parts[:i + 1]))) for i in range(len(parts)))

    def check_inside(self, key: str) -> None:
        """Raise StoreError when writing or deleting ``key`` would go through a symlink out of the store."""
        if self.is_link(key):
            raise StoreError(f"store {self.url}: {key} is (or lies under) a symbolic link; refusing to "
                             "write or delete through it. Fix: remove the link from the store.")

    def remove_tree(self, key: str) -> None:
        """Delete the folder ``key`` and everything in it, never following a symlink.

        ``key`` itself (or a folder above it) being a link raises StoreError; links
        inside are removed as links, their targets untouched.
        """
        self.check_inside(key)
        try:
            if self.local:
                if os.path.isdir(self.path(key)):
                    shutil.rmtree(self.path(key))     # rmtree unlinks inner symlinks, never follows them
                return
            try:
                self.fs.rm(self.path(key), recursive=True)
            except FileNotFoundError:
                pass
            self.fs.invalidate_cache(self.path(key))
        except Exception as e:
            raise self._fail(f"remove {key}", e) from e

    def remove_run(self, run_id: str) -> None:
        """Delete ``runs/<run_id>``: its run document first, then the rest (never through a link).

        Removing the document first means a reader never sees a completion
        document over half-deleted data.
        """
        key = f"{RUNS}/{run_id}"
        self.check_inside(key)
        self.remove_file(f"{key}/{DOC}")
        self.remove_tree(key)

    def remove_file(self, key: str) -> None:
        """Delete one file; absent is fine."""
        self.check_inside(key)
        try:
            if self.local:
                if os.path.lexists(self.path(key)):
                    os.remove(self.path(key))
                return
            try:
                self.fs.rm_file(self.path(key))
            except FileNotFoundError:
                pass
        except Exception as e:
            raise self._fail(f"remove {key}", e) from e

    def mtime(self, key: str) -> float | None:
        """Modification time (POSIX seconds) of ``key`` or None when unknown/absent."""
        try:
            if self.local:
                return os.lstat(self.path(key)).st_mtime
            info = self.fs.info(self.path(key))
            t = info.get("LastModified") or info.get("mtime")
            return t.timestamp() if hasattr(t, "timestamp") else (float(t) if t else None)
        except Exception:
            return None

    def run_exists(self, run_id: str) -> bool:
        """True when anything at all is stored under ``runs/<run_id>``."""
        p = self.path(f"{RUNS}/{run_id}")
        try:
            if self.local:
                return os.path.lexists(p)
            self.fs.invalidate_cache(p)
            return bool(self.fs.exists(p))
        except Exception as e:
            raise self._fail(f"check run {run_id}", e) from e

    def check_not_file(self) -> None:
        """Raise StoreError when the URL names a plain file, not a folder."""
        try:
            is_file = os.path.isfile(self.root) if self.local else self.fs.isfile(self.root)
        except Exception as e:
            raise self._fail("reach the store", e) from e
        if is_file:
            raise StoreError(f"store {self.url} is a plain file, not a Zarr store folder. "
                             "Fix: point the store URL (store.url= of a run, url= of a store command) at a folder "
                             "(e.g. results.zarr).")

    def has_foreign_content(self) -> bool:
        """True when the root folder holds anything but a store's own entries.

        A concurrent creator may already have made ``zarr.json``, ``runs`` or a
        temp dotfile; none of those count as foreign.
        """
        try:
            if self.local:
                names = os.listdir(self.root)
            else:
                names = [e.rstrip("/").rsplit("/", 1)[-1]
                         for e in self.fs.ls(self.root, detail=False, refresh=True)]
        except FileNotFoundError:
            return False
        except Exception as e:
            raise self._fail("list the store", e) from e
        return any(not n.startswith(".") and n not in (DOC, RUNS, INTERNAL) for n in names)

    def exists_key(self, key: str) -> bool:
        """True when the object/file ``key`` exists (fresh, uncached)."""
        try:
            if self.local:
                return os.path.lexists(self.path(key))
            self.fs.invalidate_cache(self.path(key))
            return bool(self.fs.exists(self.path(key)))
        except Exception as e:
            raise self._fail(f"check {key}", e) from e

    def exists(self) -> bool:
        """True when the store root folder (or prefix) exists."""
        try:
            if self.local:
                return os.path.isdir(self.root)
            self.fs.invalidate_cache(self.root)
            return bool(self.fs.exists(self.root))
        except Exception as e:
            raise self._fail("reach the store", e) from e
