"""The store root's layout: what a reader and a writer check at the root before anything else.

A result store's root ``zarr.json`` names its layout (``reward_lens_spec_layout``, docs/store-format.md §1);
``check_layout`` refuses what is not a store of this package's layout (and creates one where asked),
``check_writable`` refuses, before any model loads, a URL a run could not write to. No xarray, no torch: the
command line's reuse check runs them before importing either.
"""
from __future__ import annotations

import json

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store._backend import DOC, LAYOUT_KEY, LAYOUT_VERSION, RUNS, Backend, group_doc, store_handle


def check_layout(b: Backend, *, create: bool = False) -> int:
    """Check (and with ``create``, create-if-absent) the store root; return its layout.

    Raises StoreError when: the URL is a plain file or unreachable; there is no
    store there (read) or a non-store folder (create); the root document is
    garbage; the layout is newer than this package (refused) or older / missing
    (names ``reward-lens-spec store migrate url=...``).
    """
    b.check_not_file()
    raw = b.read(DOC)
    if create and raw is None:
        _refuse_foreign_folder(b)
        b.create_exclusive(DOC, group_doc({LAYOUT_KEY: LAYOUT_VERSION}))
        b.create_exclusive(f"{RUNS}/{DOC}", group_doc({}))
        raw = b.read(DOC)                       # ours, or a concurrent creator's
    if raw is None:
        raise StoreError(f"no result store at {b.url} (no zarr.json). Fix: check url=, or write "
                         "a run there first.")
    return _layout_of(b, raw)


def check_writable(store, storage_options: dict | None = None) -> None:
    """Refuse, before any model loads, a store a run could not write to (``store``: a URL, with its
    ``storage_options``, or an open handle, ``store_handle``): what ``check_layout(b, create=True)`` refuses (a
    plain file, a folder of other files, a Zarr group this package did not write, a layout older or newer than
    this package's), creating nothing; a store not there yet passes (the run creates it). Raises StoreError."""
    b = store_handle(store, storage_options)
    b.check_not_file()
    raw = b.read(DOC)
    if raw is None:
        _refuse_foreign_folder(b)
    else:
        _layout_of(b, raw)


def _layout_of(b: Backend, raw: bytes) -> int:
    """The layout the root document ``raw`` names, refused as ``check_layout`` says."""
    try:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:                     # (UnicodeDecodeError too)
        raise StoreError(f"store {b.url}: root zarr.json is not valid JSON ({e}).") from e
    version = (doc.get("attributes") or {}).get(LAYOUT_KEY)
    if version is None and not b.exists_key(f"{RUNS}/{DOC}"):
        raise StoreError(f"store {b.url} is a Zarr group reward_lens_spec did not write (no {LAYOUT_KEY} "
                         "attribute, no runs/ group). Fix: point the store URL (store.url= of a run, url= of a "
                         "store command) at a result store this package wrote.")
    if not isinstance(version, int) or version < LAYOUT_VERSION:
        raise StoreError(f"store {b.url} has layout {version!r}, older than this package's "
                         f"{LAYOUT_VERSION}. Fix: run `reward-lens-spec store migrate url={b.url}`.")
    if version > LAYOUT_VERSION:
        raise StoreError(f"store {b.url} was written by a newer version of reward_lens_spec "
                         f"(layout {version} > {LAYOUT_VERSION}); refusing to read or write it. "
                         "Fix: upgrade reward_lens_spec.")
    return version


def _refuse_foreign_folder(b: Backend) -> None:
    if b.exists() and b.has_foreign_content():
        raise StoreError(f"store {b.url}: folder exists, holds other files and no zarr.json; "
                         "refusing to turn it into a store. Fix: use a new or empty folder.")
