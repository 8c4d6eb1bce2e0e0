"""Express a run's outputs in the run's frame (``frame=`` config): the last step of every run.

Operators compute in the model's native basis, where the model lives. Afterwards every output
whose gauge is this model's native frame and that has a ``d_model`` dim is mapped into ``frame``:

  units ``direction``             readout covectors (head rows): ``Frame.direction_to_frame``
  ``affine: point`` activations   positions in the residual stream (captured activations, means of
                                  them): ``Frame.to_frame`` with centring, (x − μ) Σ̂^{-1/2} R
  ``affine: vector`` activations  displacements (chosen − rejected, component writes): no centring

Gauge-invariant outputs (margins, rewards, probabilities, fractions) are unchanged by
construction. Frame-dependent outputs without a ``d_model`` dim (e.g. native head-row cosines)
keep their native gauge label: they were computed in that basis and say so.
Raises ``SpecError`` naming the output when an activation does not say whether it is a point or
a displacement (an ``affine`` attr), rather than guess its centring.
"""
from __future__ import annotations

import xarray as xr

from ..errors import SpecError
from ..result import Result
from .fit import Frame, native_gauge
from .gate import gauge_of
from ..errors import GaugeError
from .io import load_frame


def express(ds, frame: Frame | None, model: str):
    """``ds`` (a ``Result`` or Dataset; the same type back) with every native-frame ``d_model`` output of
    ``model`` mapped into ``frame``."""
    if frame is None or frame.kind == "native":
        return ds
    native = native_gauge(model)
    out = {}
    for name, arr in ds.data_vars.items():
        if gauge_of(arr) != native or "d_model" not in arr.dims:
            out[name] = arr
            continue
        x = arr.transpose(..., "d_model")
        affine = arr.attrs.get("affine")
        if arr.attrs.get("units") == "direction":
            mapped = frame.direction_to_frame(x, model)
        elif affine in ("point", "vector"):
            mapped = frame.to_frame(x, model, center=affine == "point")
        else:
            raise SpecError(f"observable.outputs.{name}", f"output '{name}' ({arr.attrs.get('units')}) has no "
                            "'affine' attr (point or vector), so its centring in the frame is unknown.",
                            fix="output it from capture (points), diff (vectors) or direction, or use frame=native.")
        out[name] = mapped.astype(arr.dtype).transpose(*arr.dims)
        out[name].attrs["invariance"] = frame.provenance.get("invariance", "approximate")  # frames.covariance
    return Result(out, ds.attrs) if isinstance(ds, Result) else xr.Dataset(out, attrs=ds.attrs)


def native_direction(arr: xr.DataArray, store, model: str, where: str) -> xr.DataArray:
    """A stored direction (``d_model`` last) brought into ``model``'s native basis for projection.

    Its gauge must be ``model``'s native frame, or a whitened/shared frame stored in ``store`` (a store URL or
    handle, ``store.store_handle``)
    and fitted for ``model`` (mapped back by ``Frame.direction_from_frame``). Raises
    ``GaugeError`` naming the variable otherwise (another model's basis, or no gauge label).
    """
    g, native, name = gauge_of(arr), native_gauge(model), str(arr.name)
    if g == native:
        return arr
    if g.startswith(("frame:whitened:", "frame:shared:")) and arr.attrs.get("units") == "direction":
        frame = load_frame(store, g.rsplit(":", 1)[1])
        if model in frame.models:
            return frame.direction_from_frame(arr.transpose(..., "d_model"), model)
    raise GaugeError(f"{where}: stored variable '{name}' is in {g}, not in model '{model}''s basis ({native}) nor in a "
                     f"stored frame fitted for it. Fix: store the direction from a run with frame=shared "
                     f"frame.partner=<this model> (a shared frame fitted for both models) and project it from there.")
