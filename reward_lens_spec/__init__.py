"""reward_lens_spec: declarative, spec-driven interpretability for Bradley–Terry reward models.

Python entry points:
``run(overrides, config_dir=...)`` composes and executes a study as the command line does (``api.run``;
the same checks, identity and reuse) and returns a handle whose ``results`` are labelled xarray objects;
``open_store(url)`` lists runs and loads results as xarray (``Result``: one DataArray per output
variable, each with its own coordinates), with no model needed.
"""
__version__ = "0.1.0"


def open_store(url, **kwargs):
    """Open a result store (local path or fsspec URL); see ``reward_lens_spec.store.open_store``."""
    from .store import open_store as _open

    return _open(url, **kwargs)


def __getattr__(name):
    if name == "run":                     # the callable ``run`` package (reward_lens_spec.run([...]) is api.run)
        from importlib import import_module
        return import_module(".run", __name__)
    raise AttributeError(f"module 'reward_lens_spec' has no attribute {name!r}")
