"""Frames: bases in which frame-dependent quantities (activations, directions, cosines) live.

A ``Frame`` maps each of its models' native residual coordinates into frame coordinates:

  native    the model's own basis (identity map, no centring); gauge ``frame:native:<model>``
  whitened  ZCA whitening by the shrunk covariance Σ̂ of reference activations (``fit_whitened``):
            z = (x − μ) Σ̂^{-1/2}; in it the reference data have covariance ≈ I and the cosine
            of two readout directions is their reward correlation on that data. Gauge
            ``frame:whitened:<id>``. ZCA (symmetric) whitening is the whitening closest to the
            native basis: Kessy, Lewin & Strimmer (2018), "Optimal whitening and
            decorrelation", The American Statistician 72(4):309–314.
  shared    two models run on the SAME inputs, each whitened, then model a's whitened
            coordinates rotated onto model b's by orthogonal Procrustes (Schönemann 1966,
            Psychometrika 31:1–10; ``scipy.linalg.orthogonal_procrustes``): z_a R ≈ z_b.
            Frame coordinates are model b's whitened coordinates. Gauge ``frame:shared:<id>``.

Row-vector convention, everything float64. Activations map as ``to_frame(x, m) = (x − μ_m)
Σ̂_m^{-1/2} R_m`` (``center=False`` for displacements such as chosen − rejected). Readout
directions are covectors (r = w·x) and map the other way: ``direction_to_frame(w, m) =
w Σ̂_m^{1/2} R_m``, so that w·(x − μ) = direction·activation in every frame.

``Frame.id`` is the sha256 of the fitted content (kind, models and every array), so equal
fits share an id and a stored frame can be checked on load (``frames.io.load_frame``).
Errors: ``SpecError`` for bad inputs (shapes, NaN, unknown model), ``GaugeError`` when an
input DataArray is not in the native frame of the model it is mapped from.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import xarray as xr

from ..errors import GaugeError, SpecError
from .covariance import shrunk_spectrum, spectral_power

KINDS = ("native", "whitened", "shared")


def native_gauge(model: str) -> str:
    return f"frame:native:{model}"


@dataclass(frozen=True, eq=False)
class Frame:
    """A fitted frame; per-model tuples are aligned with ``models`` (see the module doc).

    ``mean[i]`` (d,), ``basis[i]`` (d × r_i), ``eigval[i]`` (r_i,), ``iso[i]``: the spectral form of
    model i's shrunk covariance; ``rotation[i]`` (d × d) orthogonal or None (identity).
    """

    id: str
    kind: str
    models: tuple[str, ...]
    mean: tuple[np.ndarray, ...]
    basis: tuple[np.ndarray, ...]
    eigval: tuple[np.ndarray, ...]
    iso: tuple[float, ...]
    rotation: tuple[np.ndarray | None, ...]
    provenance: dict = field(default_factory=dict)

    @property
    def gauge(self) -> str:
        return native_gauge(self.models[0]) if self.kind == "native" else f"frame:{self.kind}:{self.id}"

    @property
    def d(self) -> int:
        return int(self.mean[0].shape[0])

    def _index(self, model: str) -> int:
        if model not in self.models:
            raise SpecError("frame.model", f"frame {self.id[:12]} ({self.kind}) was fitted for models "
                            f"{list(self.models)}, not '{model}'.", value=model, options=self.models)
        return self.models.index(model)

    def _map(self, x, model: str, power: float, center: bool):
        i = self._index(model)
        arr = x.values if isinstance(x, xr.DataArray) else x
        arr = np.asarray(arr, dtype=np.float64)
        if arr.shape[-1] != self.d:
            raise SpecError("frame.d_model", f"vectors have {arr.shape[-1]} entries, frame has d={self.d}.",
                            fix="map vectors of a model this frame was fit on (same d_model).")
        if self.kind == "native":
            return self._wrap(x, arr.copy(), model)
        if center:
            arr = arr - self.mean[i]
        out = spectral_power(arr, self.basis[i], self.eigval[i], self.iso[i], power)
        if self.rotation[i] is not None:
            out = out @ self.rotation[i]
        return self._wrap(x, out, model)

    def _wrap(self, x, out: np.ndarray, model: str):
        if not isinstance(x, xr.DataArray):
            return out
        g = x.attrs.get("gauge")
        if g not in (None, "", native_gauge(model)):
            raise GaugeError(f"variable '{x.name}' has gauge {g!r}; only vectors in {native_gauge(model)} "
                             f"can be mapped into frame {self.gauge}. Fix: map native-frame vectors only.")
        if x.dims[-1] != "d_model":
            raise SpecError("frame.d_model", f"variable '{x.name}' must have d_model as its last dim, got {x.dims}.",
                            fix=f"transpose it first: {x.name}.transpose(..., 'd_model').")
        arr = xr.DataArray(out, dims=x.dims, coords={k: v for k, v in x.coords.items() if "d_model" not in v.dims},
                           name=x.name)
        arr.attrs = {**x.attrs, "gauge": self.gauge, "frame_id": self.id, "model": model}
        return arr

    def to_frame(self, x, model: str, *, center: bool = True):
        """Activations ``x`` (..., d) of ``model`` → frame coordinates (same shape; DataArray in → out)."""
        return self._map(x, model, -0.5, center)

    def direction_to_frame(self, w, model: str):
        """Readout covectors ``w`` (..., d) of ``model`` (e.g. head rows) → frame coordinates."""
        return self._map(w, model, 0.5, False)

    def direction_from_frame(self, u, model: str):
        """Inverse of ``direction_to_frame``: frame covectors ``u`` (..., d) → ``model``'s native basis.

        ``w = u Rᵀ Σ̂^{-1/2}``. A DataArray must carry this frame's gauge; the result carries
        ``frame:native:<model>``. Raises ``GaugeError`` for a DataArray in another frame.
        """
        i = self._index(model)
        arr = np.asarray(u.values if isinstance(u, xr.DataArray) else u, dtype=np.float64)
        if arr.shape[-1] != self.d:
            raise SpecError("frame.d_model", f"vectors have {arr.shape[-1]} entries, frame has d={self.d}.",
                            fix="map vectors of a model this frame was fit on (same d_model).")
        if isinstance(u, xr.DataArray) and u.attrs.get("gauge") != self.gauge:
            raise GaugeError(f"variable '{u.name}' has gauge {u.attrs.get('gauge')!r}, not {self.gauge}; only "
                             "vectors in this frame can be mapped back. Fix: load the frame the vector was stored in.")
        if self.kind != "native":
            if self.rotation[i] is not None:
                arr = arr @ self.rotation[i].T
            arr = spectral_power(arr, self.basis[i], self.eigval[i], self.iso[i], -0.5)
        if not isinstance(u, xr.DataArray):
            return arr
        out = xr.DataArray(arr, dims=u.dims, coords={k: v for k, v in u.coords.items() if "d_model" not in v.dims},
                           name=u.name)
        out.attrs = {**{k: v for k, v in u.attrs.items() if k != "frame_id"}, "gauge": native_gauge(model),
                     "model": model}
        return out

    def covariance(self, model: str) -> np.ndarray:
        """Dense shrunk covariance Σ̂ (d × d) of ``model``'s reference activations (small d only)."""
        i = self._index(model)
        return spectral_power(np.eye(self.d), self.basis[i], self.eigval[i], self.iso[i], 1.0)


def frame_id(kind: str, models, mean, basis, eigval, iso, rotation) -> str:
    """sha256 of the fitted content: kind, models, then each array's shape and float64 bytes."""
    h = hashlib.sha256(json.dumps({"kind": kind, "models": list(models)}, sort_keys=True).encode())
    for i in range(len(models)):
        for a in (mean[i], basis[i], eigval[i], np.asarray([iso[i]]), rotation[i]):
            if a is None:
                h.update(b"none")
                continue
            a = np.ascontiguousarray(a, dtype="<f8")
            h.update(str(a.shape).encode())
            h.update(a.tobytes())
    return h.hexdigest()


def make_frame(kind, models, mean, basis, eigval, iso, rotation, provenance=None) -> Frame:
    """Build a ``Frame`` and compute its id (see ``frame_id``)."""
    if kind not in KINDS:
        raise SpecError("frame.name", f"unknown frame kind {kind!r}.", value=kind, options=KINDS)
    parts = [tuple(models), tuple(np.asarray(m, np.float64) for m in mean),
             tuple(np.asarray(b, np.float64) for b in basis), tuple(np.asarray(e, np.float64) for e in eigval),
             tuple(float(v) for v in iso), tuple(None if r is None else np.asarray(r, np.float64) for r in rotation)]
    fid = frame_id(kind, *parts)
    return Frame(fid, kind, *parts, provenance=dict(provenance or {}, frame_id=fid, kind=kind, models=list(models)))


def native_frame(model: str, d: int) -> Frame:
    """The identity frame of one model (no centring, no scaling)."""
    return make_frame("native", (model,), (np.zeros(d),), (np.zeros((d, 0)),), (np.zeros(0),), (1.0,), (None,))


def _checksum(acts: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(acts, dtype="<f8").tobytes()).hexdigest()


def _fit_provenance(spec, acts, shrinkage) -> dict:
    return {"n": spec.n, "d": spec.d, "rank": int(spec.basis.shape[1]), "shrinkage": str(shrinkage),
            "shrinkage_intensity": spec.rho, "trace_over_d": spec.mu, "activations_sha256": _checksum(acts),
            "invariance": _invariance(spec), "timing": spec.timing}


def _invariance(spec) -> str:
    if spec.exact_invariance:
        return "exact: any invertible basis change (no shrinkage, full-rank covariance)"
    return (f"approximate: orthogonal basis changes only (shrinkage intensity {spec.rho:.3g}; "
            f"n={spec.n}, d={spec.d}: an inverse needs it)")


def fit_whitened(acts, model: str = "model", *, shrinkage="auto", provenance: dict | None = None) -> Frame:
    """Whitened frame of one model from reference activations ``acts`` (n × d); see the module doc.

    Raises ``SpecError`` (bad shape, NaN/inf, unknown shrinkage, singular covariance).
    """
    t0 = time.perf_counter()
    spec = shrunk_spectrum(acts, shrinkage)
    prov = {"method": "zca_whitening", "covariance": "shrunk (see frames.covariance)",
            "invariance": _invariance(spec).split(":")[0],
            "models_fit": {model: _fit_provenance(spec, acts, shrinkage)}, **(provenance or {})}
    prov["fit_s"] = round(time.perf_counter() - t0, 4)
    return make_frame("whitened", (model,), (spec.mean,), (spec.basis,), (spec.eigval,), (spec.iso,), (None,), prov)


def fit_shared(acts_a, acts_b, models: tuple[str, str] = ("a", "b"), *, shrinkage="auto",
               provenance: dict | None = None) -> Frame:
    """Shared frame of two models from activations on the SAME inputs (row i of each = input i).

    Each model is whitened (``fit_whitened``), then model a's whitened coordinates are rotated onto
    model b's by orthogonal Procrustes. The rotation is unique only when the whitened activations
    have full column rank (n > d); otherwise it is fixed on the data span only and provenance
    records ``underdetermined: true``. Raises ``SpecError`` for different n or d, or equal names.
    """
    t0 = time.perf_counter()
    A, B = np.asarray(acts_a, np.float64), np.asarray(acts_b, np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape != B.shape:
        raise SpecError("frame.activations", f"a shared frame needs both models' activations on the same inputs "
                        f"with the same d_model; got shapes {A.shape} and {B.shape}.",
                        fix="capture both models on one reference dataset (row i = input i).")
    if models[0] == models[1]:
        raise SpecError("frame.models", f"a shared frame needs two distinct model names, got {models}.",
                        fix="give the two models different names (model.name=...).")
    fa = fit_whitened(A, models[0], shrinkage=shrinkage)
    fb = fit_whitened(B, models[1], shrinkage=shrinkage)
    za, zb = fa.to_frame(A, models[0]), fb.to_frame(B, models[1])
    R, _ = scipy.linalg.orthogonal_procrustes(za, zb)
    resid = float(np.linalg.norm(za @ R - zb) / max(np.linalg.norm(zb), 1e-300))
    prov = {"method": "zca_whitening + orthogonal_procrustes (a onto b)", "reference_model": models[1],
            "models_fit": {**fa.provenance["models_fit"], **fb.provenance["models_fit"]},
            "alignment_residual": resid, "underdetermined": bool(A.shape[0] <= A.shape[1]),
            "invariance": "exact" if fa.provenance["invariance"] == fb.provenance["invariance"] == "exact"
            else "approximate", **(provenance or {})}
    prov["fit_s"] = round(time.perf_counter() - t0, 4)
    return make_frame("shared", tuple(models), fa.mean + fb.mean, fa.basis + fb.basis, fa.eigval + fb.eigval,
                      fa.iso + fb.iso, (R, None), prov)
