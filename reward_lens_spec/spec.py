"""Typed config schemas, registered in Hydra's ConfigStore, and their validation.

Every config group (``model``, ``dataset``, ``observable``, ``frame``, ``store``,
``experiment``) has a dataclass schema; choices are Enums. ``validate(cfg)``
merges a composed config into ``RunConfig`` and turns OmegaConf's errors into a
``SpecError`` naming the dotted key and the closest valid name — before any
model loads. A ``trust`` key anywhere is refused: trust is computed by gates.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from types import UnionType
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ConfigTypeError, InterpolationResolutionError, ValidationError

from .errors import SpecError, schema_error
from .admission import Admission, stamp
from .spec_kinds import EnsembleSpec, ImplicitSpec, JudgeSpec, PrmSpec  # noqa: F401  (schemas of ModelSpec)
from pathlib import Path
import yaml
from .registries import allow_plugins
from .model_checks import default_model_name
from .spec_checks import check_values
from .paths import find_config, group_options


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Format(str, Enum):
    plain = "plain"
    chat_template = "chat_template"


class PaddingSide(str, Enum):
    left = "left"
    right = "right"


class Mode(str, Enum):
    run = "run"
    validate = "validate"


class HeadKind(str, Enum):
    linear = "linear"
    gated = "gated"


class DatasetKind(str, Enum):
    """The built-in dataset readers' names, for Python callers (``dataset.kind`` itself is any name
    ``registries.DATASET_READERS`` knows, built-in or an allowed plugin's; a test keeps the two equal)."""
    diagnostic = "diagnostic"
    jsonl = "jsonl"
    hh_rlhf = "hh_rlhf"
    rewardbench = "rewardbench"
    rewardbench2 = "rewardbench2"
    trl = "trl"                      # TRL's four preference shapes (data.readers)
    trl_stepwise = "trl_stepwise"    # TRL's stepwise supervision: one response per row (observable=prm_labels)


class FrameKind(str, Enum):
    native = "native"
    whitened = "whitened"
    shared = "shared"


@dataclass
class InterventionSpec:
    """One artifact applied to the model as it loads (``models.artifacts``; docs/interventions.md).

    ``kind``: ``erase`` (a LEACE eraser), ``steer`` (a vector added ``alpha`` times) or ``head`` (a fitted
    Bradley–Terry head replacing the reward head); ``path``: the ``.safetensors`` file ``reward-lens-spec
    export`` wrote (its provenance JSON beside it); ``site``: ``<resid_post|attn_out|mlp_out>.<layer>`` for
    ``erase`` and ``steer``, ``readout`` (or null) for ``head``.
    """

    kind: str = "steer"
    path: str = ""
    site: Optional[str] = None
    alpha: float = 1.0


@dataclass
class ModelSpec:
    """How to load and read a reward model.

    ``source``: ``builtin:<tiny name>``, a local HF folder, a hub id (local cache
    only when ``HF_HUB_OFFLINE=1``) or ``package:<python module>`` (a folder
    shipped inside a PyPI package); ``gguf_file`` names a GGUF file in it.
    ``name`` labels the runs (store ls, report, compare); a run that overrides ``source`` on top of
    the default ``tiny`` without naming the model is named after the source (``default_model_name``).
    ``head_init``: how to make a reward head the checkpoint lacks (causal-LM, base or GGUF
    checkpoints): null refuses such a checkpoint; ``seeded`` draws it from ``seed`` (0.02·N(0,1),
    zero bias); ``zeros`` makes it zero. The same config always gives the same head
    (``reward_lens_spec.models.head_init``).
    """

    name: str = "tiny"
    source: str = "builtin:tiny"
    gguf_file: Optional[str] = None
    revision: Optional[str] = None
    dtype: DType = DType.float32
    device: str = "cpu"                     # cpu | cuda | cuda:N | auto (model_checks.check_model)
    device_map: Optional[Any] = None        # null | auto | balanced | sequential | {module: device} (models/placement.py)
    max_memory: Optional[Any] = None        # {device: bytes or "2GiB"} for device_map (models/placement.py)
    offload_folder: Optional[str] = None    # where device_map's "disk" modules live (models/placement.py)
    num_labels: int = 1
    head: HeadKind = HeadKind.linear
    objectives: list[str] = field(default_factory=list)
    batch_size: Any = 16                    # rows per forward, or auto (engine/batch_size.py)
    max_tokens: Optional[int] = None
    max_length: int = 512
    format: Format = Format.plain
    template: str = "User: {prompt}\nAssistant: {response}"
    padding_side: PaddingSide = PaddingSide.left
    seed: int = 0
    trust_remote_code: bool = False
    allow_pickle: bool = False
    head_init: Optional[str] = None        # null | seeded | zeros: a missing reward head (models/head_init.py)
    attn_implementation: Optional[str] = "eager"
    threads: Optional[int] = None          # torch intra-op threads (null: torch's default); see docs/sweeps.md (bit-identity and threads)
    checkpoints: Optional[Any] = None      # a checkpoint sequence: [folders] | {folder, steps} (models/checkpoints.py)
    checkpoint: Optional[Any] = None       # the index into checkpoints this run reads (-m ... =all: every one)
    kind: str = "classifier"                # kind of reward signal (kinds/__init__.py): classifier | judge | prm | ...
    judge: JudgeSpec = field(default_factory=JudgeSpec)
    prm: PrmSpec = field(default_factory=PrmSpec)
    implicit: ImplicitSpec = field(default_factory=ImplicitSpec)     # kind=implicit (kinds/implicit/model.py)
    members: list[Any] = field(default_factory=list)                 # kind=ensemble: model options / inline specs
    ensemble: EnsembleSpec = field(default_factory=EnsembleSpec)     # kind=ensemble (kinds/ensemble/model.py)
    interventions: list[InterventionSpec] = field(default_factory=list)  # exported artifacts (models/artifacts.py)


@dataclass
class DatasetSpec:
    """Which preference pairs to read (see ``reward_lens_spec.data.load_pairs``).

    ``chat_template``: kind ``trl``, conversational shapes: the Jinja chat template that renders the messages
    (null: the model's tokenizer's). ``step_separator``: kind ``trl_stepwise``: what follows every step when
    the steps are joined into one response (TRL's ``step_separator``; a PRM's ``model.prm.step_token``).
    """

    name: str = "diagnostic"
    kind: str = "diagnostic"          # a dataset reader's name (registries.DATASET_READERS)
    path: Optional[str] = None
    fields: dict[str, str] = field(default_factory=dict)
    limit: Optional[int] = None
    dimensions: Optional[list[str]] = None
    subset: Optional[str] = None          # rewardbench kinds: the subset of rows that name none
    chat_template: Optional[str] = None   # trl conversational shapes: a declared Jinja template (null: the model's)
    step_separator: str = "\n"            # trl_stepwise: appended to every step (TRL's default)


@dataclass
class ObservableSpec:
    """A named composition of registered operators (see ``registry``).

    ``steps``: list of ``{name, op, input?, ...params}`` mappings; ``outputs``:
    step names written to the store; ``include``: other observables whose steps
    and outputs are merged in (the battery is written that way).
    ``layers``/``components``/``pairs`` restrict interventions.
    """

    name: str = "score"
    version: int = 1
    description: str = ""
    include: list[str] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    layers: Optional[list[int]] = None
    components: Optional[list[str]] = None
    pairs: Optional[int] = None


@dataclass
class FrameSpec:
    """The frame frame-dependent outputs are expressed in (see ``reward_lens_spec.frames``).

    ``reference``: dataset the frame is fitted on (a ``conf/dataset`` option or a YAML path;
    null = this run's dataset); ``reference_limit`` pairs, both sides. ``partner``: the other
    model of a shared frame (a ``conf/model`` option or a YAML path). ``id``: use this stored
    frame (full id or a unique prefix of >= 8 hex digits) instead of fitting one.
    """

    name: FrameKind = FrameKind.native
    reference_limit: int = 256
    shrinkage: str = "auto"
    reference: Optional[str] = None
    partner: Optional[str] = None
    id: Optional[str] = None


@dataclass
class StoreSpec:
    url: Optional[str] = None
    force: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict)
    chunk_pairs: int = 64          # pairs per stored chunk: the unit of streaming, resume and sharding
    shard: int = 0                 # this job computes the chunks k with k % shards == shard
    shards: int = 1
    launch: Optional[str] = None   # shared by the jobs of one sharded launch (default: Hydra's sweep dir)


@dataclass
class RunConfig:
    mode: Mode = Mode.run
    seed: int = 0
    model: ModelSpec = field(default_factory=ModelSpec)
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    observable: ObservableSpec = field(default_factory=ObservableSpec)
    frame: FrameSpec = field(default_factory=FrameSpec)
    store: StoreSpec = field(default_factory=StoreSpec)
    experiment: Optional[dict[str, Any]] = None


GROUP_SCHEMAS = {"model": ModelSpec, "dataset": DatasetSpec, "observable": ObservableSpec,
                 "frame": FrameSpec, "store": StoreSpec}


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (``base_config`` and ``schema/<group>``)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=RunConfig)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group="schema", name=group, node=schema)


def keys_of(schema) -> list[str]:
    return [f.name for f in fields(schema)] if is_dataclass(schema) else []


def _schema_at(path: list[str]):
    """The schema (a dataclass) of the config node at ``path`` (``["model", "prm"]`` → ``PrmSpec``), or None."""
    node = RunConfig
    for part in path:
        if part not in keys_of(node):
            return None
        node = GROUP_SCHEMAS.get(part) if node is RunConfig else _field_schema(node, part)
        if node is None:
            return None
    return node


def _field_schema(schema, name: str):
    """The dataclass a field of ``schema`` holds (``Optional[PrmSpec]`` → ``PrmSpec``), or None."""
    hint = get_type_hints(schema).get(name)
    return next((a for a in get_args(hint) or (hint,) if is_dataclass(a)), None)


def _find_trust(node, prefix: str = "") -> str | None:
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if str(k) == "trust":
                return key
            hit = _find_trust(v, key)
            if hit:
                return hit
    elif isinstance(node, list):
        for i, v in enumerate(node):
            hit = _find_trust(v, f"{prefix}[{i}]")
            if hit:
                return hit
    return None


def _plugins_allowed(node) -> list:
    """``plugins.allow`` of the user's config (a list of distribution names; ``SpecError`` otherwise)."""
    if node is None:
        return []
    if not isinstance(node, dict) or set(node) - {"allow"} or not isinstance(node.get("allow") or [], list):
        raise SpecError("plugins", f"expects {{allow: [distribution, ...]}}, got {node!r}.",
                        fix="e.g. +plugins.allow=[my_pkg] (the distributions whose entry points may load).")
    return list(node.get("allow") or [])


def validate(cfg: DictConfig | dict, *, partial: bool = False) -> RunConfig:
    """Merge ``cfg`` into the ``RunConfig`` schema; return the typed object.

    Raises ``SpecError`` naming the key for unknown keys (with the closest
    valid key), wrong types, bad Enum values and a ``trust`` key anywhere.
    ``partial``: ``cfg`` is one command-line override, not a composed config, so
    checks that relate several keys (e.g. ``frame.partner`` needs ``frame=shared``) wait.
    """
    try:
        raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    except InterpolationResolutionError as exc:        # ${a.b} naming no key of the config
        raise SpecError(str(getattr(exc, "full_key", "") or "") or "config", f"{str(exc).splitlines()[0]}.",
                        fix="write the value itself, or ${a.b} naming a key of the config (${model.name}).") from None
    named = _names_model(raw.pop("hydra", None))
    allow_plugins(_plugins_allowed(raw.pop("plugins", None)))   # third-party code: only what the user allows
    hit = _find_trust(raw)
    if hit:
        raise SpecError(hit, "trust is computed by gates from what the run has, never set in config.",
                        fix="remove the key; see `reward-lens-spec calibrate` and `freeze` for how trust rises.")
    base = OmegaConf.structured(RunConfig)
    try:
        merged = OmegaConf.merge(base, raw)
    except (ConfigKeyError, ValidationError) as exc:
        raise _spec_error(exc) from None
    except ConfigTypeError as exc:               # e.g. a dotted key into a list (observable.steps.0.mode)
        key = str(getattr(exc, "full_key", "") or "") or "config"
        raise SpecError(key, f"cannot merge this value into the config: {str(exc).splitlines()[0]}",
                        fix="set a list as a whole, e.g. 'observable.steps=[{name: e, op: patch, mode: noise}]', "
                            "or write an observable YAML (conf/observable/examples).") from None
    obj = OmegaConf.to_object(merged)
    stamp(obj.model, Admission(key="model", via="config"))      # loaders honour its flags after models.door only
    if not named:
        _name_after_source(obj.model)
    check_values(obj, partial)
    return obj


def _names_model(hydra_node) -> bool:
    """Whether the composed config's own record of command-line overrides (``hydra.overrides.task``, present
    when the config was composed with its hydra node) sets ``model.name``."""
    task = ((hydra_node or {}).get("overrides") or {}).get("task") if isinstance(hydra_node, dict) else None
    return any(str(o).lstrip("+~").split("=", 1)[0] == "model.name" for o in task or ())


def _name_after_source(m: "ModelSpec") -> None:
    """``model.source`` overridden on top of the default model (name still the default ``tiny``, source not
    ``builtin:tiny``): name the model after its source, so its runs are not labelled ``tiny``."""
    default = ModelSpec()
    if m.name == default.name and m.source != default.source:
        m.name = default_model_name(m.source, m.gguf_file)


def _spec_error(exc) -> SpecError:
    full = str(getattr(exc, "full_key", "") or "")
    key = str(getattr(exc, "key", "") or full.rsplit(".", 1)[-1])
    parent = full.rsplit(".", 1)[0] if "." in full else ""
    schema = _schema_at(parent.split(".")) if parent else RunConfig
    msg = str(exc).splitlines()[0]
    if isinstance(exc, ConfigKeyError) or "not in" in msg:
        return SpecError(full or key, "unknown key.", value=key, options=keys_of(schema) or None)
    ftype = get_type_hints(schema).get(key) if schema is not None and key in keys_of(schema) else None
    enum_opts = next(([m.value for m in e] for e in (DType, Format, PaddingSide, Mode, FrameKind, HeadKind)
                      if ftype is not None and e.__name__ in str(ftype)), None)
    value = getattr(exc, "value", None) if hasattr(exc, "value") else None
    if enum_opts:
        bad = msg.split("'")[1] if "'" in msg else value
        return SpecError(full or key, f"{bad!r} is not one of its values.", value=bad, options=enum_opts,
                         fix=f"set {full or key}=<value> with one of the valid values.")
    return SpecError(full or key, f"wrong type: {msg.rstrip('.')}.", fix=f"set {full or key}={_type_example(ftype)}.")


_EXAMPLES = {bool: "true|false", int: "<an integer>", float: "<a number>", str: "<a string>", list: "[a,b]",
             tuple: "[a,b]", dict: "{key: value}"}


def _type_example(ftype) -> str:
    """A value of the schema type ``ftype`` as it is typed on the command line (``<an integer>``, ``true|false``,
    ``[a,b]`` ...; ``(or null)`` where the field takes it)."""
    args = get_args(ftype) if get_origin(ftype) in (Union, UnionType) else (ftype,)
    found = [_EXAMPLES.get(get_origin(a) or a, "<a value of its type>") for a in args if a is not type(None)]
    return " or ".join(dict.fromkeys(found)) + (" (or null)" if type(None) in args else "")


def group_config(group: str, ref: str, *, key: str, base_dir: str | None = None):
    """One group's config, typed by its schema: an option of ``conf/<group>/`` or a YAML file path.

    ``key`` is the config key that named it (for errors, e.g. ``frame.reference``). Raises
    ``SpecError`` naming ``key`` for an unknown option / missing file (listing the options) or a
    config that does not fit the schema. A model is not read here: every model spec crosses the one
    guarded door (``models.door.admit``), which refuses resolvers and untyped flags.
    """
    if group == "model":
        raise TypeError("model specs are resolved by models.door (admit / nested), the one guarded door")

    path = find_config(group, ref)                  # a built-in or user-folder option, else a path
    if path is None:
        cand = Path(ref) if Path(ref).is_absolute() or base_dir is None else Path(base_dir) / ref
        if ref.endswith((".yaml", ".yml")) and cand.is_file():
            path = cand
        else:
            raise SpecError(key, f"no {group} config '{ref}'.", value=ref, options=group_options(group),
                            fix=f"name an option of conf/{group}/ or the path of a {group} YAML file.")
    try:
        loaded = OmegaConf.load(path)
        merged = OmegaConf.merge(OmegaConf.structured(GROUP_SCHEMAS[group]), loaded)
        return OmegaConf.to_object(merged)
    except yaml.YAMLError as exc:
        raise SpecError(key, f"{path} is not valid YAML ({str(exc).splitlines()[0]}).",
                        fix=f"fix the YAML of that {group} config.") from None
    except (ConfigKeyError, ValidationError) as exc:
        raise schema_error(key, f"{path} is not a valid {group} config", exc, keys_of(GROUP_SCHEMAS[group])) from None
