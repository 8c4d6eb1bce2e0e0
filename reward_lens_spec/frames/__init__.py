"""Frames (native, whitened, shared), the gauge gate and cross-model direction comparison.

See ``fit`` (Frame, fit_whitened, fit_shared), ``covariance`` (shrinkage estimators),
``io`` (save_frame / load_frame in the result store), ``gate`` (require_shared_frame),
``compare`` (compare_directions), ``resolve`` (the run's ``frame=`` config → a fitted, stored,
reused Frame) and ``express`` (a run's outputs mapped into its frame; stored directions mapped
back for projection). Gauge-invariant cross-model comparison of margins lives in
``reward_lens_spec.ops.margin_agreement.compare_margins``; two stored runs are compared by
``reward_lens_spec.compare``.
"""
import importlib

_WHERE = {"as_direction": "compare", "compare_directions": "compare", "Spectrum": "covariance",
          "shrunk_spectrum": "covariance", "Frame": "fit", "fit_shared": "fit", "fit_whitened": "fit",
          "make_frame": "fit", "native_frame": "fit", "native_gauge": "fit", "gauge_of": "gate",
          "is_frame_dependent": "gate", "require_shared_frame": "gate", "frame_from_dataset": "io",
          "frame_to_dataset": "io", "load_frame": "io", "save_frame": "io"}


def __getattr__(name):               # imported on first use: validating a config needs no xarray or scipy
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Frame", "fit_whitened", "fit_shared", "make_frame", "native_frame", "native_gauge", "Spectrum",
           "shrunk_spectrum", "save_frame", "load_frame", "frame_to_dataset", "frame_from_dataset",
           "require_shared_frame", "gauge_of", "is_frame_dependent", "as_direction", "compare_directions"]
