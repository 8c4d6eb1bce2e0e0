"""reward_lens_spec: declarative, spec-driven interpretability for Bradley–Terry reward models.

Python entry points for readers of a result store (no model needed):
``open_store(url)`` lists runs and loads results as xarray (``Result``: one DataArray per
output variable, each with its own coordinates).
"""
__version__ = "0.1.0"


def open_store(url, **kwargs):
    """Open a result store (local path or fsspec URL); see ``reward_lens_spec.store.open_store``."""
    from .store import open_store as _open

    return _open(url, **kwargs)
