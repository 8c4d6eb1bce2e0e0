"""``model.device``: ``cpu``, ``cuda`` (the first GPU), ``cuda:N`` (GPU N) or ``auto``. Every other value is refused
in one line naming the key and a fix, on every route a spec crosses (the command-line precheck and the composed
run); a GPU that is not there is refused when the device is resolved, before a model loads."""
from __future__ import annotations

import pytest

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.placement import resolve_device
from reward_lens_spec.overrides import precheck_overrides
from reward_lens_spec.run.compose import compose_run

GOOD = ["cpu", "auto", "cuda", "cuda:0", "cuda:1", "cuda:12"]
BAD = ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:1:2", "cpu:0", "mps", "cuda 1", " cpu"]


@pytest.mark.parametrize("value", GOOD)
def test_each_device_form_is_taken(value):
    precheck_overrides([f"model.device={value}"])
    assert compose_run([f"model.device={value}"])[0].model.device == value


@pytest.mark.parametrize("value", BAD)
def test_any_other_device_is_one_line_naming_the_key(value):
    for route in (lambda: precheck_overrides([f"model.device='{value}'"]),
                  lambda: compose_run([f"model.device='{value}'"])):
        with pytest.raises(SpecError) as e:
            route()
        msg = str(e.value)
        assert e.value.field == "model.device" and "\n" not in msg and "Fix:" in msg and "cuda:N" in msg, msg


def test_a_gpu_that_is_not_there_is_refused_when_resolved(monkeypatch):
    import torch

    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_device("auto") == "cpu"
    for value in ("cuda", "cuda:0", "cuda:1"):
        with pytest.raises(SpecError, match=f"model.device: {value} was asked for but no CUDA device is visible"):
            resolve_device(value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [resolve_device(v) for v in ("auto", "cuda", "cuda:0", "cuda:1")] == ["cuda", "cuda", "cuda:0", "cuda:1"]
    with pytest.raises(SpecError, match=r"cuda:2 was asked for but only 2 CUDA device\(s\) are visible") as e:
        resolve_device("cuda:2")
    assert "cuda:N with N < 2" in str(e.value)


@pytest.mark.parametrize("line, field, hint", [
    ("device: [cpu]", "model.device", False),
    ("device: '${nope}'", "model.device", False),
    ("device: gpu", "model.device", False),
    ("devce: cpu", "model", True),
])
def test_a_model_files_bad_device_names_model_device(tmp_path, line, field, hint):
    """In a model YAML file, a bad value of ``device`` names ``model.device`` with no "did you mean 'device'" (it
    named ``model`` and suggested the key it already was); a misspelt key still gets its suggestion."""
    path = tmp_path / "mine.yaml"
    path.write_text(f"name: m\nsource: builtin:tiny\n{line}\n")
    with pytest.raises(SpecError) as e:
        compose_run([f"model={path}"])
    msg = str(e.value)
    assert e.value.field == field and "\n" not in msg and "Fix:" in msg, msg
    assert ("Did you mean 'device'" in msg) == hint, msg
