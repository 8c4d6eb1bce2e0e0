"""Fitting a Bradley–Terry reward head on frozen backbone features, with held-out checks.

``split.split_by_prompt`` (train/dev/test by prompt cluster), ``head.fit_bt_head`` (L2 +
L-BFGS, λ by dev loss), ``head.save_checkpoint`` (standard HF folder), ``evaluate`` (accuracy
with cluster-bootstrap CIs, BT loss, reliability/ECE, length baseline), ``cli.main``
(``reward-lens-spec fit ...``).
"""
from .evaluate import accuracy, bootstrap_ci, length_report, margin_report, reliability
from .head import HeadFit, clear_quantizer, fit_bt_head, save_checkpoint, set_head
from .split import Split, split_by_prompt

__all__ = ["split_by_prompt", "Split", "fit_bt_head", "HeadFit", "set_head", "save_checkpoint",
           "clear_quantizer", "accuracy", "bootstrap_ci", "margin_report", "length_report", "reliability"]
