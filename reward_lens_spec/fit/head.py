"""A linear Bradley–Terry reward head on FROZEN backbone features, and saving it as a checkpoint.

Features: ``dh = h_c − h_r`` (pair × d_model, float64), ``h`` the final-norm output at the
readout token (``engine.capture.capture(..., sites=())`` → ``CaptureResult.h``).

Model: ``Δ = w·dh`` (the head bias cancels in a margin, so it is fixed at 0). Objective
(Bradley & Terry 1952, with an L2 penalty; the reward-model loss of Ouyang et al. 2022):

    f(w) = mean_i softplus(−u·x_i) + (λ/2)·‖u‖²,    x_i = dh_i / s,   w = u / s

``s`` (d_model) is the root mean square of each feature over the training pairs (no
centring: centring would break the antisymmetry Δ(c, r) = −Δ(r, c)); the penalty is thus a
ridge on standardised features. Each λ of ``l2_grid`` is fitted full-batch with L-BFGS
(Liu & Nocedal 1989; ``scipy.optimize.minimize(method="L-BFGS-B")``) with the exact gradient
``∇f = −Xᵀσ(−Xu)/n + λu``, warm-started from the previous λ (largest first). The λ with the
lowest DEV loss is kept (model selection on the dev part replaces early stopping: with a
convex objective the regularisation path plays that role). Pairs with ``dh == 0`` (identical
sides) carry no information and are left out of the fit (counted in ``n_zero``).

Errors: ``SpecError`` (``fit.l2_grid``, ``fit``) for an empty grid or no usable pair;
``SpecError`` (``model.num_labels``) when the model's head has more than one row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit

from ..errors import SpecError

DEFAULT_L2_GRID = tuple(float(x) for x in np.logspace(1, -4, 11))


@dataclass
class HeadFit:
    """``w``: float64 (d_model,) in raw feature units; ``l2``: chosen λ; ``path``: one row per λ."""

    w: np.ndarray
    l2: float
    scale: np.ndarray
    path: list = field(default_factory=list)
    n_train: int = 0
    n_dev: int = 0
    n_zero: int = 0

    def margins(self, dh: np.ndarray) -> np.ndarray:
        """Margins ``dh @ w`` (pair,), reward units."""
        return np.asarray(dh, np.float64) @ self.w


def _objective(u, X, lam):
    z = X @ u
    loss = -log_expit(z).mean() + 0.5 * lam * (u @ u)
    grad = -(X.T @ expit(-z)) / len(z) + lam * u
    return loss, grad


def fit_bt_head(dh_train: np.ndarray, dh_dev: np.ndarray, *, l2_grid: Sequence[float] = DEFAULT_L2_GRID,
                max_iter: int = 1000, progress: bool = False) -> HeadFit:
    """Fit ``w`` on ``dh_train`` (pair × d) choosing λ by mean BT loss on ``dh_dev``; see module doc."""
    grid = sorted({float(x) for x in l2_grid}, reverse=True)
    if not grid or any(not math.isfinite(x) or x < 0 for x in grid):
        raise SpecError("fit.l2_grid", f"need one or more finite λ ≥ 0, got {list(l2_grid)}.",
                        fix="e.g. fit.l2_grid=[1,0.1,0.01,0.001].")
    Xtr, Xdv = np.asarray(dh_train, np.float64), np.asarray(dh_dev, np.float64)
    nz = np.abs(Xtr).sum(1) > 0
    n_zero = int((~nz).sum())
    Xtr = Xtr[nz]
    if len(Xtr) == 0 or len(Xdv) == 0:
        raise SpecError("fit", f"no usable pairs to fit ({len(Xtr)} train with distinct sides, {len(Xdv)} dev).",
                        fix="give more pairs (dataset.limit, fit.max_train).")
    scale = np.sqrt((Xtr ** 2).mean(0))
    scale = np.where(scale > 0, scale, 1.0)
    X, Xd = Xtr / scale, Xdv / scale
    u = np.zeros(X.shape[1])
    best = None
    path = []
    it = grid
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(grid, desc="fit λ path", unit="λ")
    for lam in it:
        res = minimize(_objective, u, args=(X, lam), jac=True, method="L-BFGS-B",
                       options={"maxiter": max_iter, "gtol": 1e-7, "ftol": 1e-12})
        u = res.x
        dev_m = Xd @ u
        row = {"l2": lam, "train_loss": float(-log_expit(X @ u).mean()), "dev_loss": float(-log_expit(dev_m).mean()),
               "dev_accuracy": float(np.mean(np.where(dev_m > 0, 1.0, np.where(dev_m == 0, 0.5, 0.0)))),
               "n_iter": int(res.nit), "converged": bool(res.success), "w_norm": float(np.linalg.norm(u / scale))}
        path.append(row)
        if best is None or row["dev_loss"] < best[0]["dev_loss"]:
            best = (row, u.copy())
    row, u_best = best
    return HeadFit(w=u_best / scale, l2=row["l2"], scale=scale, path=path, n_train=int(len(X)),
                   n_dev=int(len(Xd)), n_zero=n_zero)


def set_head(lm, w: np.ndarray):
    """Write ``w`` into the model's head (bias, if any, set to 0); return a refreshed ``LoadedModel``.

    The float32 weight is what the checkpoint stores, so margins are recomputed from it.
    """
    import torch

    from ..models.head import get_module
    from ..models.loading import wrap_model

    lin = get_module(lm.model, lm.family.head)
    if lin.weight.shape[0] != 1:
        raise SpecError("model.num_labels", f"a Bradley–Terry head has one row; this model's head has "
                        f"{lin.weight.shape[0]}.", fix="set model.num_labels=1.")
    with torch.no_grad():
        lin.weight.copy_(torch.as_tensor(np.asarray(w, np.float32)[None, :], dtype=lin.weight.dtype))
        if getattr(lin, "bias", None) is not None:
            lin.bias.zero_()
    return wrap_model(lm.name, lm.model, lm.tokenizer, dtype=lm.dtype, device=lm.device,
                      objectives=lm.head.objectives)


def clear_quantizer(model) -> bool:
    """Drop the GGUF quantizer flag and ``config.quantization_config`` transformers 5 leaves on a
    de-quantized model (its weights are plain float tensors); return True if anything was cleared.

    Without this, ``save_pretrained`` refuses ("not serializable").
    """
    cleared = False
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
        cleared = True
    for obj in (model.config, getattr(model, "base_model", None) and model.base_model.config):
        if obj is not None and getattr(obj, "quantization_config", None) is not None:
            try:
                delattr(obj, "quantization_config")
            except AttributeError:
                obj.quantization_config = None
            cleared = True
    return cleared


def save_checkpoint(lm, folder: str | Path, *, extra_files: dict | None = None) -> Path:
    """Save model (safetensors, ``config.json``) and tokenizer to ``folder``; loadable by
    transformers' ``AutoModelForSequenceClassification`` (loading the folder) and ``model.source=<folder>``.

    ``extra_files``: name → text written alongside (e.g. the fit report as JSON).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    clear_quantizer(lm.model)
    lm.model.config.num_labels = 1
    if lm.model.config.pad_token_id is None:
        lm.model.config.pad_token_id = lm.tokenizer.pad_token_id
    lm.model.save_pretrained(str(folder), safe_serialization=True)
    lm.tokenizer.save_pretrained(str(folder))
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder
