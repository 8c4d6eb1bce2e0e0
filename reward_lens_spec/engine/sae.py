"""A TopK sparse autoencoder (SAE) over activations at one site: the model, streamed training, and
SAE-Lens' on-disk format. No operator here (``ops.sae_attribution`` reads it).

Model (Gao et al. 2024, "Scaling and evaluating sparse autoencoders", §2.3): with W_enc (d_in × d_sae),
b_enc (d_sae), W_dec (d_sae × d_in, unit-norm rows d_i) and b_dec (d_in),
    f(h) = TopK(ReLU((h − b_dec) W_enc + b_enc))        (d_sae; all but the k largest set to 0)
    ĥ    = f W_dec + b_dec = Σ_i f_i d_i + b_dec         (d_in)
    e    = h − ĥ                                         (reconstruction error; h = ĥ + e exactly)
Encoding and decoding run in float64 numpy so identities built on them hold to float64 rounding.
(``apply_b_dec_to_input: false`` in a loaded cfg drops the ``− b_dec`` before encoding, as SAE-Lens does.)

Training (``train_sae``): Adam on the mean squared reconstruction error over minibatches; decoder rows
renormalized to unit norm after every step; W_enc initialized to W_decᵀ and b_dec to the first chunk's
geometric median (Gao et al. §2.3–2.4; no AuxK dead-latent loss: the tiny SAEs here need none). The data come from
``chunks()``, a callable returning a fresh iterator of (rows × d_in) arrays per epoch, so at most one
chunk is ever held (``rows_of`` slices any sliceable array — a lazily opened store variable included —
one chunk at a time). Seeded: the same chunks and seed give the same SAE.

Format (SAE-Lens, github jbloomAus/SAELens): a folder with ``cfg.json`` (``d_in``, ``d_sae``,
``architecture: "topk"``, ``k``, ``apply_b_dec_to_input``, ``normalize_activations``, ``dtype``,
``metadata``; ``model_name``, at the top level or in ``metadata``, names the model it was trained on: the
``sae_base_model`` of ``ops.sae_attribution``) and ``sae_weights.safetensors`` (``W_enc`` [d_in, d_sae], ``b_enc`` [d_sae], ``W_dec``
[d_sae, d_in], ``b_dec`` [d_in]). Older cfgs giving ``activation_fn_str: "topk"`` with
``activation_fn_kwargs: {k}`` load too. Errors: ``SpecError`` naming ``where`` for a missing file, a
non-TopK architecture, normalized activations, or shapes that disagree with the cfg.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from ..errors import SpecError

CFG, WEIGHTS = "cfg.json", "sae_weights.safetensors"


@dataclass
class TopKSAE:
    W_enc: np.ndarray                 # d_in × d_sae
    b_enc: np.ndarray                 # d_sae
    W_dec: np.ndarray                 # d_sae × d_in
    b_dec: np.ndarray                 # d_in
    k: int
    apply_b_dec_to_input: bool = True
    metadata: dict = field(default_factory=dict)

    @property
    def d_in(self) -> int:
        return int(self.W_dec.shape[1])

    @property
    def d_sae(self) -> int:
        return int(self.W_dec.shape[0])

    def pre(self, h) -> np.ndarray:
        h = np.asarray(h, np.float64)
        x = h - self.b_dec if self.apply_b_dec_to_input else h
        return x @ np.asarray(self.W_enc, np.float64) + np.asarray(self.b_enc, np.float64)

    def encode(self, h) -> np.ndarray:
        """f(h): (..., d_in) → (..., d_sae), float64, at most k non-zeros per row."""
        z = np.maximum(self.pre(h), 0.0)
        if self.k < self.d_sae:
            drop = np.argpartition(-z, self.k, axis=-1)[..., self.k:]
            np.put_along_axis(z, drop, 0.0, axis=-1)
        return z

    def decode(self, f) -> np.ndarray:
        return np.asarray(f, np.float64) @ np.asarray(self.W_dec, np.float64) + np.asarray(self.b_dec, np.float64)

    def error(self, h) -> np.ndarray:
        """e = h − ĥ(h), float64."""
        return np.asarray(h, np.float64) - self.decode(self.encode(h))

    def digest(self) -> str:
        """sha256 over k and the four weight arrays (float32 bytes): what the numbers depend on."""
        s = hashlib.sha256(f"topk:{self.k}:{self.apply_b_dec_to_input}".encode())
        for a in (self.W_enc, self.b_enc, self.W_dec, self.b_dec):
            s.update(np.ascontiguousarray(a, np.float32).tobytes())
        return s.hexdigest()


def save_sae(sae: TopKSAE, folder) -> Path:
    """Write ``sae`` to ``folder`` in SAE-Lens' format (float32); returns the folder."""
    from safetensors.numpy import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architecture": "topk", "d_in": sae.d_in, "d_sae": sae.d_sae, "k": int(sae.k), "dtype": "float32",
           "device": "cpu", "apply_b_dec_to_input": bool(sae.apply_b_dec_to_input), "normalize_activations": "none",
           "metadata": dict(sae.metadata)}
    (folder / CFG).write_text(json.dumps(cfg, indent=2, sort_keys=True))
    save_file({n: np.ascontiguousarray(getattr(sae, n), np.float32) for n in ("W_enc", "b_enc", "W_dec", "b_dec")},
              str(folder / WEIGHTS))
    return folder


_FIX_FORMAT = "point it at a folder saved in SAE-Lens' format (cfg.json + sae_weights.safetensors)."


def load_sae(folder, where: str = "path") -> TopKSAE:
    """Read an SAE-Lens TopK SAE from ``folder``; ``SpecError`` (one line) at ``where`` when it is not one:
    a missing or non-JSON ``cfg.json``, weights that are not safetensors (a pickle is never unpickled), another
    architecture, or shapes that disagree with the cfg."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    folder = Path(folder)
    for name in (CFG, WEIGHTS):
        if not (folder / name).is_file():
            raise SpecError(where, f"no {name} in '{folder}'.", fix=_FIX_FORMAT)
    try:
        cfg = json.loads((folder / CFG).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SpecError(where, f"{CFG} in '{folder}' is not JSON ({exc}).", fix=_FIX_FORMAT) from None
    if not isinstance(cfg, dict):
        raise SpecError(where, f"{CFG} in '{folder}' is not a JSON object.", fix=_FIX_FORMAT)
    arch = cfg.get("architecture", "standard")
    k = cfg.get("k", (cfg.get("activation_fn_kwargs") or {}).get("k"))
    if not (arch == "topk" or cfg.get("activation_fn_str") == "topk") or not isinstance(k, int) or k < 1:
        raise SpecError(where, f"'{folder}' holds a '{arch}' SAE without an integer k; only TopK SAEs are read.",
                        fix="train or load a TopK SAE (cfg.json: architecture topk, k: <int>).")
    if cfg.get("normalize_activations", "none") not in ("none", None):
        raise SpecError(where, f"'{folder}' normalizes its inputs ({cfg['normalize_activations']}); the exact "
                        "margin decomposition needs the SAE to read raw activations.",
                        fix="fold the normalization into the weights, or use an SAE trained with none.")
    try:
        w = load_file(str(folder / WEIGHTS))
    except SafetensorError as exc:
        head = (folder / WEIGHTS).read_bytes()[:4]
        what = "a pickle" if head[:1] == b"\x80" or head == b"PK\x03\x04" else "not a safetensors file"
        raise SpecError(where, f"{WEIGHTS} in '{folder}' is {what} ({exc}); it was not unpickled.",
                        fix=_FIX_FORMAT) from None
    missing = [n for n in ("W_enc", "b_enc", "W_dec", "b_dec") if n not in w]
    if missing:
        raise SpecError(where, f"{WEIGHTS} in '{folder}' lacks {missing}.", fix=_FIX_FORMAT)
    d_in, d_sae = cfg.get("d_in"), cfg.get("d_sae")
    want = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
    for n, shape in want.items():
        if tuple(w[n].shape) != shape:
            raise SpecError(where, f"{n} has shape {tuple(w[n].shape)}, cfg.json says {shape}.", fix=_FIX_FORMAT)
    meta = dict(cfg.get("metadata") or {})
    if isinstance(cfg.get("model_name"), str):          # SAE-Lens: the model it was trained on (older cfgs: top level)
        meta.setdefault("model_name", cfg["model_name"])
    return TopKSAE(w["W_enc"], w["b_enc"], w["W_dec"], w["b_dec"], int(k),
                   bool(cfg.get("apply_b_dec_to_input", True)), meta)


def rows_of(arr, chunk: int) -> Callable[[], Iterator[np.ndarray]]:
    """Chunks of ``arr`` (leading dim, the rest flattened to d_in) read ``chunk`` leading entries at a
    time: works on numpy, zarr and lazily opened xarray variables without loading the whole."""
    n = int(arr.shape[0])

    def it():
        for s in range(0, n, chunk):
            a = arr[s:s + chunk]
            a = np.asarray(getattr(a, "values", a), np.float32)
            yield a.reshape(-1, a.shape[-1])
    return it


def train_sae(chunks: Callable[[], Iterable[np.ndarray]], d_in: int, d_sae: int, k: int, *, epochs: int = 20,
              lr: float = 1e-2, batch: int = 64, seed: int = 0) -> tuple[TopKSAE, dict]:
    """Train a TopK SAE on the rows ``chunks()`` yields (module docstring); returns ``(sae, stats)`` with
    ``fvu`` (fraction of variance unexplained over the last epoch), ``rows`` and ``steps``."""
    import torch
    g = torch.Generator().manual_seed(seed)
    W_dec = torch.randn(d_sae, d_in, generator=g, dtype=torch.float32)
    W_dec /= W_dec.norm(dim=1, keepdim=True)
    params = {"W_enc": W_dec.T.clone(), "b_enc": torch.zeros(d_sae), "W_dec": W_dec, "b_dec": None}
    opt, steps, stats = None, 0, {}
    for epoch in range(epochs):
        sse = sst = 0.0
        rows = 0
        for c in chunks():
            x = torch.as_tensor(np.asarray(c, np.float32))
            if x.ndim != 2 or x.shape[1] != d_in:
                raise SpecError("d_in", f"a training chunk has shape {tuple(x.shape)}; expected (rows, {d_in}).",
                                fix="train on activations of one site (rows × d_in); check train_on and layer.")
            if params["b_dec"] is None:
                params["b_dec"] = geometric_median(x)
                for t in params.values():
                    t.requires_grad_(True)
                opt = torch.optim.Adam(list(params.values()), lr=lr)
            perm = torch.randperm(x.shape[0], generator=g)
            for s in range(0, x.shape[0], batch):
                xb = x[perm[s:s + batch]]
                err = xb - _forward(params, xb, k)
                loss = err.pow(2).sum(1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                with torch.no_grad():
                    params["W_dec"] /= params["W_dec"].norm(dim=1, keepdim=True).clamp_min(1e-12)
                steps += 1
                sse += float(err.detach().pow(2).sum())
                sst += float((xb - xb.mean(0)).pow(2).sum())
            rows += x.shape[0]
        if rows == 0:
            raise SpecError("train", "no training rows: the source yielded nothing.",
                            fix="train on a source with rows: run the capture over more pairs, or check train_on.")
        stats = {"fvu": sse / max(sst, 1e-30), "rows": rows, "steps": steps, "epochs": epoch + 1}
    p = {n: t.detach().numpy().copy() for n, t in params.items()}
    return TopKSAE(p["W_enc"], p["b_enc"], p["W_dec"], p["b_dec"], int(k)), stats


def geometric_median(x, iters: int = 64, eps: float = 1e-8):
    """The point minimizing the summed Euclidean distance to the rows of ``x`` (Weiszfeld's iteration,
    from the mean); Gao et al. 2024 initialize b_dec with it."""
    m = x.mean(0)
    for _ in range(iters):
        w = 1.0 / (x - m).norm(dim=1).clamp_min(eps)
        m = (w[:, None] * x).sum(0) / w.sum()
    return m


def _forward(p, x, k):
    import torch
    z = torch.relu((x - p["b_dec"]) @ p["W_enc"] + p["b_enc"])
    top = torch.topk(z, k, dim=-1)
    f = torch.zeros_like(z).scatter(-1, top.indices, top.values)
    return f @ p["W_dec"] + p["b_dec"]
