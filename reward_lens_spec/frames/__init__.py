"""Frames (native, whitened, shared), the gauge gate and cross-model direction comparison.

See ``fit`` (Frame, fit_whitened, fit_shared), ``covariance`` (shrinkage estimators),
``io`` (save_frame / load_frame in the result store), ``gate`` (require_shared_frame),
``compare`` (compare_directions), ``resolve`` (the run's ``frame=`` config → a fitted, stored,
reused Frame) and ``express`` (a run's outputs mapped into its frame; stored directions mapped
back for projection). Gauge-invariant cross-model comparison of margins lives in
``reward_lens_spec.ops.margin_agreement.compare_margins``; two stored runs are compared by
``reward_lens_spec.compare``.
"""
from .compare import as_direction, compare_directions
from .covariance import Spectrum, shrunk_spectrum
from .fit import Frame, fit_shared, fit_whitened, make_frame, native_frame, native_gauge
from .gate import gauge_of, is_frame_dependent, require_shared_frame
from .io import frame_from_dataset, frame_to_dataset, load_frame, save_frame

__all__ = ["Frame", "fit_whitened", "fit_shared", "make_frame", "native_frame", "native_gauge", "Spectrum",
           "shrunk_spectrum", "save_frame", "load_frame", "frame_to_dataset", "frame_from_dataset",
           "require_shared_frame", "gauge_of", "is_frame_dependent", "as_direction", "compare_directions"]
