"""The gauge gate: frame-dependent variables are combined only inside one frame.

Every variable carries a ``gauge`` attr. ``invariant`` (margins, probabilities, fractions,
correlations of readouts) combines with anything. ``frame:<kind>:<id>`` (activations,
directions, cosines between directions) is meaningful only in that basis: two such variables
can be combined only when their gauges are equal — the same model's native frame
(``frame:native:<model>``), the same whitened frame, or one ``frame:shared:<id>`` fitted for
both models. ``mixed:...`` (what ``combine`` writes for unequal gauges) is refused outright.
Raises ``reward_lens_spec.errors.GaugeError`` naming the variables, their gauges and the fix.
"""
from __future__ import annotations

from ..errors import GaugeError

INVARIANT = "invariant"


def gauge_of(x) -> str:
    """The ``gauge`` attr of a DataArray (``invariant`` when absent or empty)."""
    return str(getattr(x, "attrs", {}).get("gauge") or INVARIANT)


def is_frame_dependent(gauge: str) -> bool:
    return gauge.startswith(("frame:", "mixed:"))


def _owner(gauge: str, attrs: dict) -> str:
    if gauge.startswith("frame:native:"):
        return gauge.split(":", 2)[2]
    return str(attrs.get("model") or gauge)


def require_shared_frame(*arrays, names: list[str] | None = None, op: str = "this comparison") -> str:
    """Return the one gauge the frame-dependent ``arrays`` share (``invariant`` if none is).

    ``names`` labels the arrays in the error (default: each DataArray's ``.name``).
    Raises ``GaugeError`` when two frame-dependent arrays sit in different frames, or one
    carries a ``mixed:`` gauge.
    """
    names = list(names) if names else [str(getattr(a, "name", None) or f"input {i}") for i, a in enumerate(arrays)]
    seen: list[tuple[str, str, dict]] = []
    for name, arr in zip(names, arrays):
        g = gauge_of(arr)
        if g.startswith("mixed:"):
            raise GaugeError(f"{op}: variable '{name}' mixes frames ({g}); it has no single basis. "
                             "Fix: map every frame-dependent input into one frame (frame=shared) before combining.")
        if is_frame_dependent(g):
            seen.append((name, g, dict(getattr(arr, "attrs", {}))))
    if not seen:
        return INVARIANT
    first = seen[0]
    for other in seen[1:]:
        if other[1] != first[1]:
            models = sorted({_owner(first[1], first[2]), _owner(other[1], other[2])})
            raise GaugeError(
                f"{op}: variable '{first[0]}' is in {first[1]} but '{other[0]}' is in {other[1]}. "
                "Directions, activations and cosines are only comparable inside one frame. "
                f"Fix: fit a shared frame for {' and '.join(models)} on the same reference inputs and express "
                "both in it (config: frame=shared frame.partner=<the other model> in both runs; Python: "
                "frames.fit_shared, then Frame.direction_to_frame / Frame.to_frame), or compare only "
                "gauge-invariant variables such as margins (compare: vars=margin; Python: compare_margins).")
    return first[1]
