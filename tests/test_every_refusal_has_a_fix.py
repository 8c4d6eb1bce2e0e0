"""Every refusal names its fix: each ``SpecError(...)`` call in the package passes ``fix=`` or ``options=``.

The scan is the boundary (one AST walk over every module); the spot checks run real refusals through
``compose_run``, ``plan_for``, an operator's ``out_dims`` and a frame fit, and read "Fix:" in the one line.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import reward_lens_spec
from reward_lens_spec.errors import SpecError

PACKAGE = Path(reward_lens_spec.__file__).parent

def _calls_without_a_fix() -> list[tuple[str, int, str]]:
    """``(module path, line, field source)`` of every ``SpecError(...)`` call with neither ``fix=`` nor
    ``options=`` (a ``**kwargs`` splat does not count)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(src, filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name != "SpecError" or {"fix", "options"} & {k.arg for k in node.keywords}:
                continue
            field = ast.get_source_segment(src, node.args[0]) if node.args else ""
            out.append((path.relative_to(PACKAGE).as_posix(), node.lineno, field))
    return out


def test_every_spec_error_call_passes_fix_or_options():
    missing = _calls_without_a_fix()
    assert not missing, "SpecError(...) without fix= or options=:\n" + "\n".join(f"{p}:{n} ({f})" for p, n, f in
                                                                                missing)


def test_the_scan_sees_the_package():
    """The walk reaches every subpackage (a scan that found no calls would pass vacuously)."""
    n = 0
    for path in PACKAGE.rglob("*.py"):
        n += path.read_text(encoding="utf-8").count("SpecError(")
    assert n > 500


def _one_line_fix(exc: SpecError, field: str) -> str:
    msg = str(exc)
    assert exc.field == field and "\n" not in msg, msg
    assert " Fix: " in msg, msg
    return msg.split(" Fix: ", 1)[1]


def _plan_refusal(tmp_path, step: str, pre: str = "") -> SpecError:
    from reward_lens_spec.planning import plan_for
    from reward_lens_spec.run.compose import compose_run

    (tmp_path / "o.yaml").write_text("name: o\nversion: 1\nsteps:\n  - {name: reward, op: capture, site: readout}\n"
                                     + pre + f"  - {{{step}}}\noutputs: [out]\n")
    run, _ = compose_run([f"observable={tmp_path / 'o.yaml'}"])
    with pytest.raises(SpecError) as e:
        plan_for(run, str(tmp_path))
    return e.value


def test_a_steer_layer_out_of_range_names_the_valid_layers(tmp_path):
    e = _plan_refusal(tmp_path, "name: out, op: steer, direction: head, layer: 99, alphas: [0, 1]")
    fix = _one_line_fix(e, "observable.o.steps.out.layer")
    assert "set layer: <0.." in fix and "> in the step." in fix


def test_a_select_step_with_neither_index_nor_values_names_both(tmp_path):
    e = _plan_refusal(tmp_path, "name: out, op: select, input: reward, dim: side")
    assert "index: last" in _one_line_fix(e, "observable.o.steps.out")


def test_attribution_patching_at_every_position_names_the_exact_op():
    from reward_lens_spec.ops.patch import AttributionPatch, PatchParams
    from reward_lens_spec.ops.base import PlanInfo

    info = PlanInfo(family="llama", n_layers=2, n_objectives=1, objectives=("reward",), model_name="m")
    with pytest.raises(SpecError) as e:
        AttributionPatch(PatchParams(positions="all")).out_dims((), info, "observable.steps.p")
    assert "op: patch" in _one_line_fix(e.value, "observable.steps.p.positions")


def test_a_zero_max_memory_names_a_size():
    from reward_lens_spec.run.compose import compose_run

    with pytest.raises(SpecError) as e:
        compose_run(["model.device_map=auto", "model.max_memory={cpu: 0}"])
    assert "give model.max_memory.cpu a size above 0, e.g. 2GiB" in _one_line_fix(e.value, "model.max_memory.cpu")


def test_a_shared_frame_of_one_model_name_names_the_fix():
    from reward_lens_spec.frames.fit import fit_shared

    acts = np.random.default_rng(0).standard_normal((8, 4))
    with pytest.raises(SpecError) as e:
        fit_shared(acts, acts, models=("m", "m"))
    assert "model.name=" in _one_line_fix(e.value, "frame.models")
