"""The result store: one Zarr v3 hierarchy (local path or fsspec URL) shared by a lab.

Layout (``reward_lens_spec_layout: 3`` in the root attrs)::

    <url>/runs/<run_id>/                         run group; attrs = provenance (+ complete: true and
                                                 the attempt, last)
    <url>/runs/<run_id>/<attempt>/<observable>/  attrs a reader needs (trust, gauge, units, run id,
                                                 provenance summary, ``output_variables``)
    <url>/runs/<run_id>/<attempt>/<observable>/<variable>/
                                                 one xarray Dataset per variable, readable without
                                                 this package: xarray.open_zarr(url, group=...)

Writers go skeleton -> data -> completion document (see ``writer``); readers
list only complete runs (see ``reader``). Nothing here imports torch.
"""
from reward_lens_spec.store._attrs import decode_json_attrs
from reward_lens_spec.store._backend import LAYOUT_KEY, LAYOUT_VERSION, Backend
from reward_lens_spec.store.reader import COLUMNS, Store, open_store
from reward_lens_spec.store.writer import is_complete, migrate, write_run

__all__ = ["write_run", "is_complete", "open_store", "Store", "migrate", "decode_json_attrs",
           "COLUMNS", "LAYOUT_KEY", "LAYOUT_VERSION", "Backend"]
