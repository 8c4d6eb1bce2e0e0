"""Plan-time work: validate an observable against a model's description before any model loads."""
from __future__ import annotations

from .errors import SpecError
from .models.describe import describe_model, model_config
from .observables import load_observable
from .ops.base import PlanInfo
from .registry import build_plan
from .models.door import nested
from .kinds import kind_of, refused_ops
from .registry import OPERATORS
from .spec import group_config


def plan_for(run, base_dir=None):
    """Validate the observable against the model's description; return ``(plan, info)``."""
    family, n_layers, k = describe_model(run.model, base_dir)
    objectives = tuple(run.model.objectives) or (("reward",) if k == 1 else tuple(f"objective_{i}" for i in range(k)))
    obs = run.observable
    info = PlanInfo(family=family, n_layers=n_layers, n_objectives=k, objectives=objectives,
                    model_name=run.model.name, layers=tuple(obs.layers) if obs.layers is not None else None,
                    components=tuple(obs.components) if obs.components else None, pairs=obs.pairs,
                    gated=run.model.head.value == "gated")
    check_restriction_range(obs, info)
    check_frame_configs(run, base_dir)
    plan = build_plan(obs, info, load_observable)
    restricted_steps(obs, plan)
    refuse_kind_ops(run.model, plan)
    refuse_shape(run.dataset, plan)
    return plan, info


def refuse_shape(dataset, plan) -> None:
    """One-response rows (``dataset=trl_stepwise``) are read only by row operators (``Operator.rows``), and
    those only on such rows: ``SpecError`` naming the first step that does not fit the data's shape."""
    kind = getattr(dataset.kind, "value", dataset.kind)
    for s in plan.steps:
        rows = type(s.op).rows
        if kind == "trl_stepwise" and rows is None:
            raise SpecError(f"observable.steps.{s.name}", f"op '{type(s.op).name}' reads preference pairs; "
                            "dataset=trl_stepwise holds one response per row (prompt, steps, step labels).",
                            fix="use observable=prm_labels on stepwise data, or a preference dataset (e.g. dataset=trl).")
        if kind != "trl_stepwise" and rows == "only":
            raise SpecError("dataset.kind", f"op '{type(s.op).name}' (step {s.name}) reads stepwise rows "
                            f"(prompt, completions, labels); dataset.kind={kind} holds preference pairs.",
                            fix="use dataset=trl_stepwise dataset.path=<file.jsonl>.")


def refuse_kind_ops(model, plan) -> None:
    """``SpecError`` naming the first step whose operator ``model.kind`` (and its mode) does not apply to
    (``kinds.refused_ops``: a one-line reason each), or that reads only other kinds (``Operator.kinds``)."""
    refused = refused_ops(model)
    for s in plan.steps:
        own = type(s.op).kinds
        if own and kind_of(model) not in own:
            raise SpecError(f"observable.steps.{s.name}", f"op '{type(s.op).name}' reads model.kind="
                            f"{'|'.join(own)}; this model is model.kind={kind_of(model)}.",
                            fix=f"use a model with model.kind={own[0]} (e.g. model=tiny_{own[0]}), or drop that step.")
        if type(s.op).name in refused:
            raise SpecError(f"observable.steps.{s.name}", f"op '{type(s.op).name}' does not apply to "
                            f"model.kind={kind_of(model)}: {refused[type(s.op).name]}",
                            fix="drop that step, or read the model as another kind.")


COMPONENTS = ("resid", "attn", "mlp")        # the patch grid's components (ops.patch)


def check_restriction_range(obs, info) -> None:
    """``observable.layers`` within ``0..n_layers-1`` and ``observable.components`` in the patch grid's set,
    for every observable; ``SpecError`` naming the key, with a ``Fix:``."""
    if obs.layers is not None:
        bad = [l for l in obs.layers if not 0 <= l < info.n_layers]
        if bad:
            raise SpecError("observable.layers", f"layer(s) {bad} out of range: model '{info.model_name}' has "
                            f"{info.n_layers} layers (valid 0..{info.n_layers - 1}).", value=bad,
                            fix=f"list layers in 0..{info.n_layers - 1}, e.g. observable.layers=[{info.n_layers - 1}], "
                                "or drop observable.layers.")
    if obs.components:
        bad = [c for c in obs.components if c not in COMPONENTS]
        if bad:
            raise SpecError("observable.components", f"unknown component(s) {bad}.", value=bad[0], options=COMPONENTS,
                            fix="observable.components=[mlp] (any of resid, attn, mlp), or drop it.")


def restricted_steps(obs, plan) -> dict[str, list[str]]:
    """``{key: steps it restricts}`` for each set restriction; ``SpecError`` naming the key when no step of
    the plan honours it (it would be silently ignored)."""
    out = {}
    for key in ("layers", "components", "pairs"):
        if getattr(obs, key) is None:
            continue
        out[key] = [s.name for s in plan.steps if key in type(s.op).restricted_by]
        if not out[key]:
            ops = sorted(n for n, c in OPERATORS.items() if key in c.restricted_by)
            raise SpecError(f"observable.{key}", f"no step of observable '{obs.name}' reads it (only "
                            f"{', '.join(ops)} steps do), so it would be ignored.",
                            fix=f"drop observable.{key}; to keep part of a variable add a step "
                                f"{{name: part, op: select, input: <step>, dim: {key.rstrip('s')}, values: [...]}}.")
    return out


def _width(cfg) -> int:
    return int(getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd"))


def check_frame_configs(run, base_dir=None) -> None:
    """Plan-time checks of ``frame.partner`` / ``frame.reference`` (configs only, no weights)."""
    f = run.frame
    if f.reference:
        group_config("dataset", f.reference, key="frame.reference", base_dir=base_dir)
    if f.partner:
        partner = nested(run.model, f.partner, "frame.partner", base_dir)
        if partner.name == run.model.name:
            raise SpecError("frame.partner", f"the partner model has the same name as this model ('{partner.name}'); "
                            "a shared frame tells its two models apart by name.",
                            fix="give one of them another model.name, or pick another partner.")
        da, db = _width(model_config(run.model, base_dir)), _width(model_config(partner, base_dir))
        if da != db:
            raise SpecError("frame.partner", f"'{run.model.name}' has d_model {da} but partner '{partner.name}' has "
                            f"{db}; a shared frame aligns two residual streams of one width (orthogonal Procrustes).",
                            fix="pick a partner model of the same d_model.")


def frame_dependent(plan) -> list[str]:
    """Outputs the run's frame re-expresses: native-frame vectors (a ``d_model`` dim; ``frames.express``).

    Other outputs are gauge-invariant, or frame-dependent but computed and labelled in one basis
    by their operator (e.g. ``objective_geometry``'s cosines); no run frame changes them.
    """
    return [s.name for s in plan.steps if s.name in plan.outputs and s.gauge.startswith("frame:native:")
            and "d_model" in s.dims]


def stages(plan) -> dict[str, str]:
    """Step name -> ``"pair"`` (runs batch by batch, pair-chunk regions) or ``"reduce"`` (after the last chunk).

    A step is in the pair stage when its operator acts pair by pair (``Operator.acts_per_pair``),
    its output keeps the ``pair`` dim and every input is a pair-stage step — or, for an operator that
    re-runs the model (``Operator.reruns``), a reduction without a ``pair`` dim, read whole by every
    chunk in a later pass (``passes``); anything else runs after the last chunk. Raises ``SpecError`` naming the step when an operator that declares
    itself per-pair drops the ``pair`` dim of an input that has one (it would reduce over pairs).
    """
    out: dict[str, str] = {}
    by_name = {s.name: s for s in plan.steps}
    for s in plan.steps:
        per_pair = s.op.acts_per_pair()
        if per_pair and "pair" not in s.dims and any("pair" in by_name[i].dims for i in s.inputs):
            raise SpecError(f"observable.{plan.observable}.steps.{s.name}",
                            f"operator '{s.op.name}' is declared per-pair but its output ({' × '.join(s.dims)}) "
                            "drops the 'pair' dim of its input.",
                            fix="set per_pair = False on the operator (it reduces over pairs).")
        # a step that re-runs the model may read a reduction without a pair dim (a direction, a mean):
        # every chunk reads it whole, in a later pass (``passes``); other steps reading one reduce
        pair = per_pair and "pair" in s.dims and all(
            out[i] == "pair" or (s.op.reruns and "pair" not in by_name[i].dims) for i in s.inputs)
        out[s.name] = "pair" if pair else "reduce"
    return out


def passes(plan, st=None) -> dict[str, int]:
    """Step name -> pass: 0, plus one for every reduction → pair-stage step edge on its longest input path.

    Pass ``p`` runs its pair-stage steps chunk by chunk, then its reductions (``run.stream``); a pair-stage
    step that reads a reduction (e.g. ``steer`` along a ``mean_direction``) so runs after it.
    """
    st = st or stages(plan)
    out: dict[str, int] = {}
    for s in plan.steps:
        out[s.name] = max([out[i] + (st[s.name] == "pair" and st[i] == "reduce") for i in s.inputs] or [0])
    return out


def data_dims(plan) -> dict[str, tuple[str, ...]]:
    """Step name -> its output dims whose size depends on the data: those its operator declares
    (``Operator.data_dims``) and those it keeps from an input that has them (e.g. a ``diff`` of PRM step rewards
    keeps ``step``). Steps without any are left out."""
    out: dict[str, tuple[str, ...]] = {}
    for s in plan.steps:
        own = set(type(s.op).data_dims).union(*(out.get(i, ()) for i in s.inputs))
        dims = tuple(d for d in s.dims if d in own)
        if dims:
            out[s.name] = dims
    return out


def data_widths(plan, ctx) -> dict[str, int]:
    """Dim -> its size for this run: the largest any declaring step's operator reports over every pair of ``ctx``
    (``Operator.width``; a ``RunContext`` of the whole run, no capture). The second half of planning, run once the
    pairs are encoded and before the first chunk is written (``run.stream``), so every chunk writes rows of one
    width whatever its own pairs hold; shorter rows are padded (``run.stream_arrays.pad_widths``)."""
    out: dict[str, int] = {}
    for s in plan.steps:
        for d in type(s.op).data_dims:
            if d in s.dims:
                out[d] = max(out.get(d, 0), int(s.op.width(d, ctx)))
    return out
