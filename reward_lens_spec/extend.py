"""The extension API: everything a new operator, dataset reader, calibration criterion or command needs, in one
import (``from reward_lens_spec.extend import ...``); ``docs/extending.md`` has a recipe for each.

Operators (``ops/``): subclass ``Operator`` (typed ``Params``, ``out_dims(in_dims, info: PlanInfo, where)``
checked before any model loads — ``need_dim`` for the common check —, ``run(ctx: RunContext, *inputs)``
returning one DataArray labelled with ``units`` and ``gauge`` by ``labelled``) and decorate it with
``@register``. Dataset readers: subclass ``DatasetReader`` (``rows(path)``, xarray's ``BackendEntrypoint``
shape) and register it in ``DATASET_READERS``. Criteria: a ``Criterion`` carries its reading, floor and
magnitude band; register it in ``CRITERIA``. Kinds of reward signal: a ``Kind`` (``kinds/<name>/``, its loader
held as a ``Lazy`` reference where it imports torch) registered in ``KINDS``; model families: a ``Family``
table registered in ``FAMILIES``. A package of your own offers them through the entry-point groups
``reward_lens_spec.operators``, ``reward_lens_spec.readers``, ``reward_lens_spec.criteria``,
``reward_lens_spec.families`` and ``reward_lens_spec.kinds`` (values
``"module:attribute"``), loaded only for distributions the user lists in ``+plugins.allow=[...]``.

Every registry (``Registry``) gives ``get(name)`` ("did you mean" in a ``SpecError``), ``names()`` and
``describe()``; ``reward-lens-spec ops|readers|criteria`` list them.
"""
from __future__ import annotations

from .context import RunContext
from .dataset_readers import DatasetReader
from .errors import SpecError
from .kinds.base import Kind, Lazy
from .ops.base import NoParams, Operator, PlanInfo, labelled, need_dim, without
from .registries import (COMMANDS, CRITERIA, DATASET_READERS, FAMILIES, KINDS, OPERATORS, REGISTRIES, Registry,
                         allow_plugins)
from .registry import register
from .trust.criteria import Criterion

__all__ = ["COMMANDS", "CRITERIA", "DATASET_READERS", "FAMILIES", "KINDS", "OPERATORS", "REGISTRIES", "Criterion",
           "DatasetReader", "Kind", "Lazy", "NoParams", "Operator", "PlanInfo", "Registry", "RunContext", "SpecError",
           "allow_plugins", "labelled", "need_dim", "register", "without"]
