"""Operators by name (``registries.OPERATORS``), and observable spec → validated plan (a DAG of steps).

``build_plan`` checks, before any model loads: unknown operators and params
(with "did you mean"), missing required params, inputs naming no earlier step,
dims that do not line up, sites the model family lacks and layer indices out
of range. Every error names the observable, the step and the fix.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from .errors import SpecError
from .ops.base import Operator, PlanInfo
from .registries import OPERATORS

register = OPERATORS.register       # class decorator: make an operator available under ``cls.name``


def _load_builtin_ops() -> None:
    """Import the built-in operator modules (``ops/``), which register themselves."""
    OPERATORS.names()


def get_operator(name: str, where: str = "observable.steps") -> type[Operator]:
    """The operator class registered as ``name``; ``SpecError`` on ``where`` with "did you mean"."""
    return OPERATORS.get(name, where)


def list_operators() -> dict[str, str]:
    """Registered operator names → first docstring line."""
    return OPERATORS.describe()


def _param_line(f) -> str:
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if f.default is not dataclasses.MISSING:
        return f"{f.name}: {typ} = {f.default!r}"
    if f.default_factory is not dataclasses.MISSING:
        return f"{f.name}: {typ} = {f.default_factory()!r}"
    return f"{f.name}: {typ} (required)"


def describe_operator(name: str, full: bool = False) -> str:
    """What ``reward-lens-spec ops [NAME]`` prints: first docstring line (``full``: the class and module
    docstrings), params with types and defaults (or required), inputs, dims, and the restrictions it honours.
    Raises ``SpecError`` for an unknown name (did you mean)."""
    cls = get_operator(name, "ops")
    doc = inspect.cleandoc(cls.__doc__ or "")
    params = [_param_line(f) for f in dataclasses.fields(cls.Params)]
    named = ["input"] + [f"{e} (a step name)" for e in cls.extra_inputs]
    inputs = "none (reads the capture pass / re-runs)" if cls.n_inputs == 0 and not cls.extra_inputs else \
        " + ".join(named)
    lines = [f"{cls.name:<20} {doc.splitlines()[0] if doc else ''}",
             f"{'':<20} params: {'; '.join(params) or '(none)'}",
             f"{'':<20} inputs: {inputs}; dims: {cls.dims or '(see docstring)'}"
             + (f"; honours observable.{'/'.join(cls.restricted_by)}" if cls.restricted_by else "")]
    if full:
        mod = inspect.cleandoc(sys.modules[cls.__module__].__doc__ or "")
        lines += ["", doc, ""] + ([f"module {cls.__module__}:", mod] if mod else [])
    return "\n".join(lines)


@dataclass
class Step:
    name: str
    op: Operator
    inputs: list[str]
    dims: tuple[str, ...] = ()
    gauge: str = ""


@dataclass
class Plan:
    observable: str
    steps: list[Step]
    outputs: list[str]
    sites: set[str] = field(default_factory=set)
    reruns: bool = False

    def describe(self) -> str:
        lines = [f"observable {self.observable}: capture sites {sorted(self.sites) or '[]'}"
                 f"{'; model re-runs' if self.reruns else ''}"]
        for s in self.steps:
            mark = "*" if s.name in self.outputs else " "
            params = {k: v for k, v in dataclasses.asdict(s.op.p).items() if v is not None}
            lines.append(f" {mark} {s.name:<24} = {s.op.name}({', '.join(s.inputs)}) {params or ''}"
                         f"  -> ({' × '.join(s.dims)}) [{s.gauge}]")
        return "\n".join(lines)


def _make_params(cls, raw: dict, where: str):
    names = cls.param_names()
    for key in raw:
        if key not in names:
            raise SpecError(f"{where}.{key}", f"operator '{cls.name}' has no param '{key}'.", value=key,
                            options=names or ["(none)"])
    try:
        return cls.Params(**raw)
    except TypeError as exc:
        missing = [f.name for f in dataclasses.fields(cls.Params)
                   if f.default is dataclasses.MISSING and f.name not in raw]
        raise SpecError(where, f"operator '{cls.name}' is missing params {missing or str(exc)}.",
                        fix=f"add {', '.join(f'{m}: ...' for m in missing)} to the step.") from None


def expand_steps(obs, resolve_include) -> tuple[list[dict], list[str]]:
    """Inline ``include``d observables (depth-first, de-duplicated by step name). ``outputs:`` decides what is
    stored: an observable that lists its own ``outputs`` stores exactly those (an included observable's
    outputs only where listed, in their included order); one that lists none (``battery``) stores the outputs
    of everything it includes."""
    steps: list[dict] = []
    outputs: list[str] = []
    for inc in obs.include:
        sub = resolve_include(inc)
        s2, o2 = expand_steps(sub, resolve_include)
        for st in s2:
            if st["name"] not in {s["name"] for s in steps}:
                steps.append(st)
        outputs += [o for o in o2 if o not in outputs]
    for raw in obs.steps:
        st = OmegaConf.to_container(raw) if not isinstance(raw, dict) else dict(raw)
        if st.get("name") in {s["name"] for s in steps}:
            continue
        steps.append(st)
    if obs.outputs:                              # its own list decides: included outputs only where listed
        outputs = [o for o in outputs if o in obs.outputs]
    outputs += [o for o in obs.outputs if o not in outputs]
    return steps, outputs


def _no_includes(name: str):
    raise SpecError("observable.include", f"cannot resolve '{name}': no observable resolver was given.",
                    fix="compose the run (reward_lens_spec.run.compose.compose_run) "
                        "so includes resolve, or pass resolve_include=.")


def build_plan(obs, info: PlanInfo, resolve_include=None) -> Plan:
    """Validate ``obs`` (an ``ObservableSpec``) against ``info``; return the ``Plan``."""
    raw_steps, outputs = expand_steps(obs, resolve_include or _no_includes)
    if not raw_steps:
        raise SpecError(f"observable.{obs.name}.steps", "an observable needs at least one step.",
                        fix="add a steps: list (or include: [<observable>]) to the observable YAML.")
    steps: dict[str, Step] = {}
    plan = Plan(observable=obs.name, steps=[], outputs=outputs)
    for i, raw in enumerate(raw_steps):
        where = f"observable.{obs.name}.steps[{i}]"
        raw = dict(raw)
        name, op_name = raw.pop("name", None), raw.pop("op", None)
        if name and op_name is None and "op" in dict(raw_steps[i]):
            raise SpecError(where + ".op", "op is empty: YAML reads a bare `null` as no value.",
                            fix='quote it: op: "null".')
        if not name or not op_name:
            raise SpecError(where, "every step needs a 'name' and an 'op'.", fix="e.g. {name: margin, op: diff, input: reward}")
        where = f"observable.{obs.name}.steps.{name}"
        cls = get_operator(op_name, where + ".op")
        inp = raw.pop("input", None)
        inputs = [inp] if isinstance(inp, str) else list(inp or [])
        params = _make_params(cls, raw, where)
        op = cls(params)
        inputs += [getattr(params, k) for k in cls.extra_inputs if getattr(params, k) is not None]
        if len(inputs) < cls.n_inputs:
            raise SpecError(where + ".input", f"operator '{op_name}' reads {cls.n_inputs} input(s), got {len(inputs)}.",
                            fix="name an earlier step in 'input'.")
        for src in inputs:
            if src not in steps:
                raise SpecError(where + ".input", f"'{src}' is not an earlier step.", value=src, options=steps or ["(none)"])
        dims = op.out_dims([steps[s].dims for s in inputs], info, where)
        gauge = op.gauge([steps[s].gauge for s in inputs], info)
        st = Step(name=name, op=op, inputs=inputs, dims=dims, gauge=gauge)
        steps[name] = st
        plan.steps.append(st)
        plan.sites |= op.sites(info)
        plan.reruns |= cls.reruns
    for o in outputs:
        if o not in steps:
            raise SpecError(f"observable.{obs.name}.outputs", f"'{o}' is not a step.", value=o, options=steps)
    return plan
