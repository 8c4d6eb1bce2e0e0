"""Stored variables an operator reads as an input: ``store:<url>#<run_id>/<observable>/<variable>``.

Operators never open a store (issue 38): the executor hands each run's ``RunContext`` one ``StoredInputs``
(``RunContext.stores``), which opens each referenced store once per run through ``store.store_handle`` —
the run's own handle when the reference names the run's own store URL (its storage options come with it) —
and reads through the public reader (``Store.load``: digests checked, trust derived).
"""
from __future__ import annotations

from reward_lens_spec.errors import SpecError
from reward_lens_spec.store._backend import Backend, store_handle
from reward_lens_spec.store.reader import open_store

PREFIX = "store:"


def parse_ref(ref: str, where: str) -> tuple[str, str, str, str]:
    """``(url, run_id, observable, variable)`` of ``store:<url>#<run_id>/<observable>/<variable>``; ``SpecError``
    naming ``where`` when it has another shape."""
    url, _, path = ref.removeprefix(PREFIX).partition("#")
    parts = path.split("/")
    if not ref.startswith(PREFIX) or not url or len(parts) != 3 or not all(parts):
        raise SpecError(where, f"'{ref}' is not a stored variable reference.",
                        fix="store:<url>#<run_id>/<observable>/<variable>")
    return url, parts[0], parts[1], parts[2]


class StoredInputs:
    """The stores a run's operators read from, each opened once (``handle``). ``run_store``: the run's own
    store handle (None for none)."""

    def __init__(self, run_store: Backend | None = None):
        self._handles: dict[str, Backend] = {}
        if run_store is not None:
            self._handles[run_store.url] = run_store

    def handle(self, url: str) -> Backend:
        """The open handle on the store at ``url`` (opened on first use); ``StoreError`` when it cannot be."""
        if url not in self._handles:
            self._handles[url] = store_handle(url)
        return self._handles[url]

    def variable(self, ref: str, *, lazy: bool, where: str):
        """The stored variable ``ref`` (``parse_ref``) as an ``xarray.DataArray``, read now (``lazy=False``) or
        dask-backed. Raises ``SpecError`` (``where``) for a malformed reference, ``StoreError`` for an absent
        store, run or observable, ``KeyError`` for an absent variable."""
        url, run_id, obs, var = parse_ref(ref, where)
        return open_store(self.handle(url)).load(run_id, obs, lazy=lazy)[var]
