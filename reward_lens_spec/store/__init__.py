"""The result store: one Zarr v3 hierarchy (local path or fsspec URL) shared by a lab.

Layout (``reward_lens_spec_layout: 4`` in the root attrs; ``docs/store-format.md``)::

    <url>/zarr.json                    root; its consolidated metadata lists every complete run
    <url>/runs/<run_id>/               run group; attrs = provenance (+ complete: true and
                                       the attempt, last)
    <url>/runs/<run_id>/<observable>/  one xarray Dataset: every output variable, its coordinates, the
                                       pair labels, and the attrs a reader needs (trust, gauge, units,
                                       run id, provenance summary, ``output_variables``), readable without
                                       this package: xarray.open_zarr(url, group=...), xr.open_datatree(url)
    <url>/_internal/                   attempts, staging, control files, the evidence log, keys

Writers go skeleton -> data -> completion document (see ``writer``); readers
list only complete runs (see ``reader``). Nothing here imports torch. The names below are imported on
first use, so reading the JSON documents alone (``state``, ``log``, ``run_doc``) imports no xarray.
"""
from importlib import import_module

_WHERE = {"decode_json_attrs": "_attrs", "LAYOUT_KEY": "_backend", "LAYOUT_VERSION": "_backend",
          "Backend": "_backend", "store_handle": "_backend", "COLUMNS": "reader", "Store": "reader", "open_store": "reader",
          "is_complete": "writer", "migrate": "migration", "write_run": "writer"}
__all__ = ["write_run", "is_complete", "open_store", "Store", "migrate", "decode_json_attrs",
           "COLUMNS", "LAYOUT_KEY", "LAYOUT_VERSION", "Backend", "store_handle"]


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'reward_lens_spec.store' has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
