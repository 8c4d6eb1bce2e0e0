"""One observable's outputs, each variable with the coordinates it really has.

An observable's outputs need not share coordinate sets: in ``battery``, ``dla`` has
``component`` ∈ {embed, attn, mlp} over layers −1..L−1 and ``patch_effect`` has {resid, attn, mlp}
over 0..L−1. One ``xarray.Dataset`` would align them on the union and pad each with NaN cells for
combinations that do not exist. ``Result`` holds them side by side instead (the store publishes them in
one Dataset, a coordinate two variables hold differently under the later one's own name: ``store.publish``),
and reads like a
Dataset where that is unambiguous: ``res["dla"]`` is the DataArray; ``res.coords`` / ``res.sizes``
are the coordinates and dims every variable that has them agrees on (``pair``, ``dimension``, ...);
``res.attrs`` the observable's attrs. ``to_dataset()`` is the explicit outer-join Dataset.
"""
from __future__ import annotations

from collections.abc import Mapping

import xarray as xr

from .errors import did_you_mean


class Result(Mapping):
    """Variable name → ``xarray.DataArray`` (insertion order), plus the observable's ``attrs``.

    Raises ``KeyError`` (naming the valid variables) for an unknown name that is neither a
    variable nor a coordinate every variable holding it agrees on.
    """

    def __init__(self, variables: Mapping, attrs: dict | None = None):
        self._vars = {str(k): v for k, v in variables.items()}
        for k, v in self._vars.items():
            if not isinstance(v, xr.DataArray):
                raise TypeError(f"Result[{k!r}] is {type(v).__name__}, not an xarray.DataArray.")
        self.attrs = dict(attrs or {})
        self._agreed = None                          # cache of ``coords`` (reset when a variable changes)

    @classmethod
    def of(cls, ds) -> "Result":
        """A ``Result`` from a Dataset (each variable keeps the coords on its own dims) or a Result."""
        if isinstance(ds, Result):
            return ds
        return cls({v: ds[v] for v in ds.data_vars}, ds.attrs)

    # -- mapping of variables ------------------------------------------------------------
    def __getitem__(self, name):
        if name in self._vars:
            return self._vars[name]
        holders = [k for k, v in self._vars.items() if name in v.coords]
        coords = self.coords if holders else {}      # a name no variable holds: no agreement computed (comparing
        if name in coords:                           # every coord's values, e.g. 100,000 pair ids, per variable)
            return coords[name]
        if holders:
            raise KeyError(f"coordinate {name!r} differs between variables ({', '.join(holders)}): each has the "
                           f"values it really has. Fix: read it from one, e.g. res[{holders[0]!r}][{name!r}].")
        raise KeyError(f"no variable {name!r}.{did_you_mean(str(name), self._vars)} "
                       f"Variables: {', '.join(self._vars) or '(none)'}.")

    def __getattr__(self, name):                 # res.margin, res.pair: as on a Dataset
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(str(e)) from None

    def __setitem__(self, name, value: xr.DataArray) -> None:
        self._vars[str(name)] = value
        self._agreed = None

    def __contains__(self, name) -> bool:
        return name in self._vars

    def __iter__(self):
        return iter(self._vars)

    def __len__(self) -> int:
        return len(self._vars)

    @property
    def data_vars(self) -> "Result":
        return self

    # -- what every variable agrees on ---------------------------------------------------
    @property
    def coords(self) -> dict[str, xr.DataArray]:
        """Coordinates identical in every variable that holds them (a conflicting one is left out)."""
        if self._agreed is None:
            out: dict[str, xr.DataArray] = {}
            bad: set[str] = set()
            for da in self._vars.values():
                for k, c in da.coords.items():
                    if k in bad:
                        continue
                    if k not in out:
                        out[k] = c
                    elif not (out[k].variable is c.variable or out[k].variable.identical(c.variable)):
                        bad.add(k)
                        del out[k]
            self._agreed = out
        return dict(self._agreed)

    @property
    def sizes(self) -> dict[str, int]:
        """Dim sizes every variable with that dim agrees on (a dim of different lengths is left out)."""
        out: dict[str, int] = {}
        bad: set[str] = set()
        for da in self._vars.values():
            for d, n in da.sizes.items():
                if out.setdefault(d, n) != n:
                    bad.add(d)
        return {d: n for d, n in out.items() if d not in bad}

    @property
    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self._vars.values())

    def load(self) -> "Result":
        """Read every variable into memory, in place (the dask-backed ones in one dask pass); returns self."""
        lazy = [k for k, v in self._vars.items() if v.chunks is not None]
        if lazy:
            import dask
            for k, v in zip(lazy, dask.compute(*[self._vars[k] for k in lazy])):
                self._vars[k] = v
        for v in self._vars.values():         # in place, each variable's own load (what ``DataArray.load`` does
            v.variable.load()                  # through a temporary Dataset, ~0.15 ms a variable)
            for c in v.coords.variables.values():
                c.load()
        self._agreed = None
        return self

    def identical(self, other) -> bool:
        """Same variables in the same order, each ``DataArray.identical`` (values, coords, attrs), same attrs."""
        return (isinstance(other, Result) and list(self) == list(other) and self.attrs == other.attrs
                and all(self[k].identical(other[k]) for k in self))

    def to_dataset(self) -> xr.Dataset:
        """One Dataset (outer join): cells that exist in no variable's own coordinates are NaN (a string
        coordinate that must be padded, like ``dla``'s ``unit``, is held as object strings to allow it)."""
        def obj(da):                                   # numpy's StringDType has no NaN to pad with
            return da.assign_coords({k: c.astype(object) for k, c in da.coords.items()
                                     if c.dtype.kind == "T" and k not in da.dims})
        return xr.Dataset({k: obj(v) for k, v in self._vars.items()}, attrs=self.attrs)

    def __repr__(self) -> str:
        lines = [f"<reward_lens_spec.Result: {len(self._vars)} variable(s)>"]
        for k, v in self._vars.items():
            dims = ", ".join(f"{d}: {n}" for d, n in v.sizes.items())
            lines.append(f"  {k} ({dims}) {v.dtype} {v.attrs.get('units', '')}".rstrip())
        return "\n".join(lines)
