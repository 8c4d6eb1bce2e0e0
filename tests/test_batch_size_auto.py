"""Issue 40 item 3: ``model.batch_size: auto`` finds the largest batch the device holds before the first chunk
(halving on out-of-memory), keeps it for the whole run, records it, and changes no number: the stored arrays equal
a run with that fixed batch size bit for bit. Out-of-memory is planted by a forward hook on the real model."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.engine.batch_size import choose_batch_size, is_oom

PLANTED = 5                                   # a forward of more rows than this "runs out of memory"


def _oom_above(model, limit):
    def hook(_mod, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[0] > limit:
            raise torch.OutOfMemoryError(f"planted: {ids.shape[0]} rows > {limit}")
    return model.register_forward_pre_hook(hook, with_kwargs=True)


def test_oom_is_recognised_on_every_device():
    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes"))
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory"))


def _run(overrides, url, planted):
    from reward_lens_spec import inputs
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run.executor import execute
    from reward_lens_spec.store import open_store

    real = inputs.load_lm
    hooks = []

    def load_lm(spec, base_dir=None):
        lm = real(spec, base_dir)
        hooks.append(_oom_above(lm.model, planted))
        return lm
    inputs.load_lm = load_lm
    try:
        run, text = compose_run(["observable=battery", "dataset.limit=12", f"store.url={url}", *overrides])
        with contextlib.redirect_stdout(io.StringIO()):
            out = execute(run, resolved_yaml=text, base_dir=str(url.parent), store_url=str(url), progress=False)
    finally:
        inputs.load_lm = real
        for h in hooks:
            h.remove()
    s = open_store(str(url))
    return s.provenance(out.run_id), s.load(out.run_id, "battery", lazy=False)


def test_auto_halves_past_a_planted_oom_and_equals_the_fixed_batch_bit_for_bit(tmp_path, monkeypatch):
    from reward_lens_spec.engine import batch_size as bs
    monkeypatch.setattr(bs, "estimate", lambda lm, longest, n_rows: 16)       # 16 → 8 → 4 fits under 5
    prov_a, auto = _run(["model.batch_size=auto"], tmp_path / "a.zarr", PLANTED)
    prov_f, fixed = _run(["model.batch_size=4"], tmp_path / "f.zarr", PLANTED)
    assert prov_a["batch_size"] == 4 and prov_f["batch_size"] == 4
    assert list(auto) == list(fixed)
    for v in auto:
        a, f = np.asarray(auto[v].values), np.asarray(fixed[v].values)
        assert a.dtype == f.dtype and np.array_equal(a, f, equal_nan=True), v


def test_one_row_that_does_not_fit_is_one_line():
    from reward_lens_spec.inputs import encode, load_dataset, load_lm
    from reward_lens_spec.spec import DatasetSpec, ModelSpec

    lm = load_lm(ModelSpec())
    enc = encode(lm, load_dataset(DatasetSpec(limit=3)))
    h = _oom_above(lm.model, 0)
    try:
        with pytest.raises(SpecError, match=r"^model\.batch_size: auto: one row of \d+ tokens does not fit"):
            choose_batch_size(lm, enc, start=8)
    finally:
        h.remove()
    assert choose_batch_size(lm, enc, start=64) == 6         # never more than the rows there are
