"""Command-line overrides checked against the config tree and schemas before Hydra composes.

A typo in a group option or key gets "did you mean" and a non-zero exit instead of Hydra's
traceback; shared by the main app and ``fit``.
"""
from __future__ import annotations

from .errors import SpecError
from .paths import group_options
from .spec import GROUP_SCHEMAS

GROUPS = ("model", "dataset", "observable", "frame", "store", "experiment")


def precheck_overrides(args: list[str]) -> None:
    """Check ``group=option`` and ``group.key=value`` overrides against the tree and the schemas."""
    from dataclasses import fields

    from omegaconf import OmegaConf

    from .spec import validate

    for arg in args:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, _, value = arg.lstrip("+~").partition("=")
        if key.startswith("hydra"):
            continue
        if "trust" in key.split("."):
            raise SpecError(key, "trust is computed by gates from what the run has, never set in config.",
                            fix="remove the override; see `reward-lens-spec calibrate` and `freeze` for how trust rises.")
        head, _, rest = key.partition(".")
        if head in GROUPS and not rest:
            opts = group_options(head)
            for v in value.split(","):
                if v and not any(c in v for c in "*?()[]$") and v not in opts:
                    raise SpecError(head, f"unknown option '{v}'.", value=v, options=opts)
        elif head in GROUP_SCHEMAS and rest:
            names = [f.name for f in fields(GROUP_SCHEMAS[head])]
            sub = rest.split(".")[0]
            if sub not in names:
                raise SpecError(key, "unknown key.", value=sub, options=names)
            if "," not in value or value.startswith("["):        # a sweep is checked per job
                try:
                    validate(OmegaConf.from_dotlist([f"{key}={value}"]), partial=True)
                except SpecError as exc:
                    if exc.field != "config":
                        raise
                    raise SpecError(key, str(exc).split(": ", 1)[1]) from None
        elif not rest and head not in ("mode", "seed") and head not in GROUPS:
            raise SpecError(key, "unknown key.", value=head, options=("mode", "seed") + GROUPS)
