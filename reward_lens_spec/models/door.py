"""The one guarded door for every model spec: each place a model enters a run is resolved here.

A model enters at the top level (``model``), as an ensemble member (``model.members.<i>``), as the reference of
an implicit reward (``model.implicit.reference``) and as the partner of a shared frame (``frame.partner``).
Checkpoint lists (``model.checkpoints``) and the bases of judges and PRMs are sources of the top-level spec and
inherit its admission (``MODEL_REFS`` lists every field; ``tests/test_model_door.py`` walks the schemas for more).
A reference is a ``conf/model`` option (the built-in tree or a ``--config-dir`` folder), the path of a model YAML,
or an inline mapping; each is resolved by ``admit`` under the top level's rules:

- **No foreign code, no environment reads.** The YAML is parsed as plain data first (``yaml.safe_load``) and
  checked like any user config (``config_rules.check_tree`` and ``check_values``): no resolver call
  (``${oc.env:...}``, ``${oc.decode:...}``), no ``ext://``, no ``_target_``. So a secret is never resolved into a
  model name, and never reaches a store.
- **``trust_remote_code`` and ``allow_pickle`` count only when typed for that exact spec.** ``grants`` reads
  the command line the person typed: ``<key>.<flag>=true`` (``model.trust_remote_code=true``), or the flag
  inside an inline mapping typed as that key's value (``model.members=[tiny,{source: X, trust_remote_code:
  true}]``, ``model.implicit.reference={source: X, allow_pickle: true}``). Keys are absolute: a spec named
  inside another (a frame partner's members) is admitted under its parent's key (``rebased``:
  ``frame.partner.members.0``), which nothing typed can grant. A YAML file (``conf/``, ``--config-dir``, an experiment, a file named by path) never enables
  them; neither does a stored study (it is composed with nothing typed). A ``frame.partner`` is a name or
  path only, so a partner never runs checkpoint code or unpickles.
- **Artifacts read safely.** A spec's ``interventions`` (``models.artifacts``) are read here, under the spec's
  own key (``model.members.1.interventions.0.path``): ``.safetensors`` only, each file equal to the digest its
  provenance JSON records; the loader checks the bytes it reads again.
- **The same loader guards.** Every spec leaves the door stamped (``admission``); every loader reads
  its flags through ``admission.permitted``, so a spec changed after the door, or one a config produced that
  never crossed it, is refused with one line.

Errors: ``SpecError`` with one line naming the key (and the file), before any model loads.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from ..config_rules import TRUE_WORDS, check_tree, check_values
from ..config_sources import override_values
from ..errors import SpecError, schema_error
from ..paths import find_config, group_options
from ..spec import ModelSpec, default_model_name
from ..admission import FLAGS, Admission, flag_error, stamp, stamp_of
from hydra.core.override_parser.overrides_parser import OverridesParser
from .artifacts import check_files

# every config field that names a model: (dotted key, form); tests/test_model_door.py enumerates the schemas
MODEL_REFS = {"model": "spec", "model.members": "list of references", "model.implicit.reference": "reference",
              "frame.partner": "name or path", "model.checkpoints": "sources of the top-level spec"}
_FIX_REF = "give a conf/model option name, a model YAML path or an inline mapping of model keys."


# ----------------------------------------------------------------------------- what the person typed

def grants(typed: list[str]) -> frozenset:
    """``{(key, flag)}`` the person typed true on the command line (see the module doc). ``typed``: the
    overrides as typed (``key=value``); a sweep grants where any of its values does."""
    out: set = set()
    parser = OverridesParser.create()
    for line in typed:
        key, eq, raw = line.partition("=")
        if not eq or key.startswith("-"):
            continue
        key = key.lstrip("+~").partition("@")[0]
        try:
            values = list(override_values(parser.parse_overrides([line])[0]._value))
        except Exception:
            values = [v.strip() for v in raw.split(",")]
        for v in values:
            _walk(key.split("."), v, out)
    return frozenset(out)


def _walk(path: list[str], value, out: set) -> None:
    if path and path[-1] in FLAGS and (value is True or str(value).strip().strip("'\"").lower() in TRUE_WORDS):
        out.add((".".join(path[:-1]), path[-1]))
    if isinstance(value, Mapping):
        for k, v in value.items():
            _walk(path + str(k).split("."), v, out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _walk(path + [str(i)], v, out)


# ----------------------------------------------------------------------------- references to specs

def _file_of(ref: str, key: str, base_dir: str | None) -> Path:
    path = find_config("model", ref)
    if path is None:
        cand = Path(ref) if Path(ref).is_absolute() or base_dir is None else Path(base_dir) / ref
        if ref.endswith((".yaml", ".yml")) and cand.is_file():
            path = cand
        else:
            raise SpecError(key, f"no model config '{ref}'.", value=ref, options=group_options("model"),
                            fix="name an option of conf/model/ or the path of a model YAML file.")
    return path


def _read_file(path: Path, key: str) -> dict:
    """The YAML of a model file as plain data (nothing resolved), checked like a user config."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError(key, f"{path} is not readable YAML ({(str(exc).strip().splitlines() or ['?'])[0]}).",
                        fix="fix the YAML of that model config.") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise SpecError(key, f"{path} is not a mapping of model keys.", fix=_FIX_REF)
    return doc


def _build(raw: dict, key: str, where: str) -> ModelSpec:
    """A ``ModelSpec`` from plain data already checked (no resolver left to read anything)."""
    check_tree(raw, where)
    check_values(raw, key, where)
    try:
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelSpec), raw))
    except Exception as exc:
        raise schema_error(key, f"{where} is not a valid model config", exc,
                           [f.name for f in dataclasses.fields(ModelSpec)], fix=_FIX_REF) from None
    return obj


def _resolve(ref, key: str, base_dir: str | None) -> tuple[ModelSpec, str]:
    """``(spec, where it came from)`` of a reference (see the module doc); the flags are not judged here. A
    model file without ``name`` is named after its source (``spec.default_model_name``), an inline mapping
    without one by its source."""
    if isinstance(ref, ModelSpec):
        return ref, "the composed config"
    if isinstance(ref, str):
        path = _file_of(ref, key, base_dir)
        raw, where = _read_file(path, key), f"model file {path}"
        spec = _build(raw, key, where)
        if "name" not in raw:
            spec.name = default_model_name(spec.source, spec.gguf_file)
        return spec, where
    if isinstance(ref, Mapping) or OmegaConf.is_dict(ref):
        raw = OmegaConf.to_container(ref, resolve=False) if OmegaConf.is_dict(ref) else dict(ref)
        spec = _build(raw, key, "the inline model mapping")
        if "name" not in raw:
            spec.name = str(spec.source)
        return spec, "the inline model mapping"
    raise SpecError(key, f"expected a model option name, a YAML path or a mapping, got {ref!r}.", fix=_FIX_REF)


def admit(ref, key: str, *, granted: frozenset = frozenset(), base_dir: str | None = None) -> ModelSpec:
    """The ``ModelSpec`` a reference names at ``key``, checked and stamped by the door (module doc).

    ``ref``: a ``ModelSpec`` (the composed top level), a ``conf/model`` option, a model YAML path or an inline
    mapping; ``granted``: ``grants`` of what the person typed. Raises ``SpecError`` naming ``key`` (or
    ``<key>.<flag>``) for an unknown option or file, a resolver / ``ext://`` / code name, a spec that does not
    fit the schema, and a flag set true that was not typed for ``key``."""
    spec, where = _resolve(ref, key, base_dir)
    for flag in FLAGS:
        if getattr(spec, flag, False) is True and (key, flag) not in granted:
            raise flag_error(key, flag, where)
    if spec.interventions:                      # artifacts: safetensors only, each file its provenance's bytes
        check_files(spec, key, base_dir)
    return stamp(spec, Admission(key=key, via="door", grants=frozenset(granted)))


def nested(parent, ref, key: str, base_dir: str | None = None) -> ModelSpec:
    """A model named inside ``parent`` (a ``ModelSpec``: its member, reference or frame partner) at ``key``,
    through ``admit`` with the grants ``parent`` left the door with. A parent built in Python grants what its
    own inline mappings set (the program decided them); a file never enables a flag. A parent composed but not
    yet through the door (``spec.validate``'s checks) resolves the reference without judging its flags: its
    spec is stamped ``config`` and no loader honours its flags (``admission.permitted``)."""
    adm = stamp_of(parent)
    if adm is None:
        own = frozenset((key, f) for f in FLAGS if _get(ref, f) is True)
        return admit(ref, key, granted=own, base_dir=base_dir)
    key = rebased(adm.key, key)
    if adm.via != "door":
        spec, _ = _resolve(ref, key, base_dir)
        return stamp(spec, Admission(key=key, via="config"))
    return admit(ref, key, granted=adm.grants, base_dir=base_dir)


def rebased(parent_key: str, key: str) -> str:
    """``key`` (named relative to a top-level ``model``: ``model.members.0``) under the parent's own key, so a
    grant typed for one spec never covers another's: a frame partner's member 0 is ``frame.partner.members.0``,
    a member's reference ``model.members.1.implicit.reference``; the top level's keys are unchanged."""
    if parent_key != "model" and (key == "model" or key.startswith("model.")):
        return parent_key + key[len("model"):]
    return key


def _get(ref, flag: str):
    if isinstance(ref, ModelSpec):
        return getattr(ref, flag, None)
    return ref.get(flag) if isinstance(ref, Mapping) else None


def derive(spec, **changes) -> ModelSpec:
    """``dataclasses.replace(spec, **changes)`` keeping ``spec``'s admission (a spec the run already admitted,
    pointed at another source: ``fit``'s reload of the folder it wrote). The flags are not changed here."""
    if any(f in changes for f in FLAGS):
        raise ValueError("derive never changes trust_remote_code or allow_pickle")
    out = dataclasses.replace(spec, **changes)
    adm = stamp_of(spec)
    return stamp(out, adm) if adm is not None else out


def admit_run(run, typed: list[str], base_dir: str | None = None):
    """Send every model of a composed ``RunConfig`` through the door (``run.model`` is stamped in place; each
    member, implicit reference and frame partner is resolved once, so a refusal comes before anything runs).
    ``typed``: the overrides the person typed (a stored study's design: none). Returns ``run``."""
    granted = grants(list(typed))
    m = run.model
    admit(m, "model", granted=granted, base_dir=base_dir)
    for key, ref in model_refs(run):
        nested(m, ref, key, base_dir)
    return run


def model_refs(run) -> list[tuple[str, object]]:
    """``[(key, reference)]`` of every model a ``RunConfig`` names besides its own (members, implicit
    reference, frame partner), in that order."""
    m = run.model
    out = [(f"model.members.{i}", ref) for i, ref in enumerate(m.members or ())]
    if m.implicit.reference is not None:
        out.append(("model.implicit.reference", m.implicit.reference))
    if run.frame.partner:
        out.append(("frame.partner", run.frame.partner))
    return out
