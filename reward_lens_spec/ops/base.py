"""The operator contract every primitive follows.

An operator is one class with a frozen ``Params`` dataclass, the number of
inputs it reads, the dims it reads and writes (``out_dims``, checked at plan
time, before any model loads), what it needs from the runtime (``sites`` to
capture, ``reruns`` for interventions), its stage (``per_pair``: pair by pair, or
reducing over pairs; checked at plan time by ``planning.stages``), its gauge
behaviour (``gauge``), and which output dims have a size that depends on the data
(``data_dims``, with ``width``: their size over every pair, taken before the first chunk).
``run`` maps ``xarray.DataArray`` inputs to one ``DataArray`` with ``units``
and ``gauge`` attrs.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Optional

import xarray as xr

from ..errors import SpecError, did_you_mean

INVARIANT = "invariant"


@dataclass(frozen=True)
class PlanInfo:
    """What plan validation knows about the model without loading weights."""

    family: Any
    n_layers: int
    n_objectives: int
    objectives: tuple[str, ...]
    model_name: str = "model"
    layers: Optional[tuple[int, ...]] = None        # observable.layers (interventions)
    components: Optional[tuple[str, ...]] = None    # observable.components
    pairs: Optional[int] = None                     # observable.pairs (first N pairs for re-runs)
    gated: bool = False                             # head outputs one gated score over K rows

    @property
    def n_outputs(self) -> int:
        return 1 if self.gated else self.n_objectives

    @property
    def native_frame(self) -> str:
        return f"frame:native:{self.model_name}"


@dataclass(frozen=True)
class NoParams:
    pass


class Operator:
    """Base class; subclasses set ``name``, ``Params``, ``n_inputs`` and implement the hooks."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    n_inputs: ClassVar[int] = 1
    extra_inputs: ClassVar[tuple[str, ...]] = ()   # params that name other steps (e.g. "reference")
    reruns: ClassVar[bool] = False                 # needs model re-runs beyond the capture pass
    per_pair: ClassVar[bool] = False               # stage: out[pairs] depends only on in[pairs] (see below)
    reads_capture: ClassVar[bool] = False          # a reduce step that reads ctx.capture.h of every pair
    needs_all_pairs: ClassVar[bool] = False        # a pair-stage step whose rows read every pair's capture
                                                   # (e.g. mean ablation): the run streams as one chunk
    dims: ClassVar[str] = ""                       # input → output dims, for `reward-lens-spec ops`
    restricted_by: ClassVar[tuple[str, ...]] = ()  # observable.layers / components / pairs this op honours
    pair_fields: ClassVar[tuple[str, ...]] = ()    # per-pair fields it reads beyond the text and dimension
                                                   # (Pair.meta keys, rubric, source): in the run identity, and
                                                   # the only ones it sees (inputs.ops_view)
    kinds: ClassVar[tuple[str, ...]] = ()          # model.kind values it reads (empty: any kind that does not
                                                   # refuse it); others are refused at plan time
    rows: ClassVar[Optional[str]] = None           # None: reads preference pairs (refused on one-response rows,
                                                   # dataset=trl_stepwise); "only": reads such rows only;
                                                   # "any": reads only other row steps (planning.refuse_shape)
    data_dims: ClassVar[tuple[str, ...]] = ()      # output dims whose size depends on the data (PRM steps,
                                                   # response positions): sized over every pair by ``width``

    def __init__(self, params):
        self.p = params

    def sites(self, info: PlanInfo) -> set[str]:
        """Capture sites this step needs (runtime site names)."""
        return set()

    def prefix_rows(self, info: PlanInfo, n_pairs: int) -> set[tuple[int, int]]:
        """``(pair, side)`` rows this step re-runs from a KV-cached prefix (the capture keeps those caches)."""
        return set()

    def acts_per_pair(self) -> bool:
        """True when this step acts pair by pair: its rows for a set of pairs depend only on the
        inputs' (and the capture's) rows for those pairs. Such steps run batch by batch in the
        first stage of a plan and write pair-chunk regions; the others reduce over pairs and run
        after the last chunk, on the stored arrays (``planning.stages``)."""
        return self.per_pair

    def out_dims(self, in_dims: list[tuple[str, ...]], info: PlanInfo, where: str) -> tuple[str, ...]:
        raise NotImplementedError

    def width(self, dim: str, ctx) -> int:
        """Size of ``dim`` (one of ``data_dims``) over every pair of ``ctx``: a ``RunContext`` of the whole run
        with no capture (model, pairs, encoded pairs). Called once per run, before the first chunk
        (``planning.data_widths``); a chunk's rows are then padded to it (``run.stream_arrays.pad_widths``), so
        index ``k`` of ``dim`` must mean the same on every pair (step ``k``, response position ``k``)."""
        raise NotImplementedError

    def gauge(self, in_gauges: list[str], info: PlanInfo) -> str:
        return in_gauges[0] if in_gauges else INVARIANT

    def run(self, ctx, *inputs: xr.DataArray) -> xr.DataArray:
        raise NotImplementedError

    @classmethod
    def param_names(cls) -> list[str]:
        return [f.name for f in fields(cls.Params)]


def need_dim(dims: tuple[str, ...], dim: str, where: str, why: str, param: str | None = None) -> None:
    """Raise ``SpecError`` at ``where`` unless ``dim`` is in ``dims``. ``param``: the step's parameter that
    named ``dim`` (a user's choice, e.g. ``dim``): the error then suggests the input's closest dim."""
    if dim not in dims:
        hint = did_you_mean(dim, dims) if param else ""
        fix = (f"set {param}: to one of the input's dims ({', '.join(dims)}), or feed it a step that keeps "
               f"'{dim}'." if param else "feed it the output of a step that keeps that dim.")
        raise SpecError(where, f"needs an input with a '{dim}' dim ({why}), got dims {dims}.{hint}", fix=fix)


def need_readout_sides(dims: tuple[str, ...], where: str) -> None:
    """Raise ``SpecError`` at ``where`` unless ``dims`` are exactly readout activations (pair × side × d_model)."""
    for d in ("pair", "side", "d_model"):
        need_dim(dims, d, where, "readout activations of both sides")
    if set(dims) - {"pair", "side", "d_model"}:
        raise SpecError(where + ".input", f"needs readout activations (pair × side × d_model), got {dims}.",
                        fix="feed it {op: capture, site: readout}.")


def without(dims: tuple[str, ...], *drop: str) -> tuple[str, ...]:
    return tuple(d for d in dims if d not in drop)


def labelled(arr: xr.DataArray, units: str, gauge: str, description: str = "") -> xr.DataArray:
    arr.attrs = {"units": units, "gauge": gauge, **({"description": description} if description else {})}
    return arr
