"""The stamp a model spec carries out of the one guarded door (``models.door``), and the check every loader makes.

A ``ModelSpec`` that a config produced (``spec.validate``, ``models.door.admit``/``nested``) carries an
``Admission``: the config key it was resolved at (``model``, ``model.members.1``, ``model.implicit.reference``,
``frame.partner``), where it came from (``"config"``: composed but not yet through the door; ``"door"``: through
it) and the grants of the command line (``(key, flag)`` pairs the person typed true, ``flag`` one of
``trust_remote_code``, ``allow_pickle``). A spec built in Python (``ModelSpec(...)``) carries none: the program
that built it decided its flags, as a person typing them would.

Every loader reads a spec's ``trust_remote_code`` and ``allow_pickle`` only through ``permitted`` (``models.hub``),
so a flag that is true counts only when the stamp grants it for that spec's own key: a spec changed after the door,
or one a config produced that never crossed it, is refused with one line naming the key. This module imports
nothing heavy (``models.hub`` imports it).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import SpecError

FLAGS = ("trust_remote_code", "allow_pickle")
_ATTR = "_admission"
WHAT = {"trust_remote_code": "would run the checkpoint's own Python",
        "allow_pickle": "would unpickle the checkpoint's weights (a pickle can run code)"}


@dataclass(frozen=True)
class Admission:
    """Where a spec was resolved (``key``), by what (``via``: ``config`` | ``door``) and the typed grants."""

    key: str
    via: str
    grants: frozenset = frozenset()

    def allows(self, flag: str) -> bool:
        return (self.key, flag) in self.grants


def stamp(spec, admission: Admission):
    """Attach ``admission`` to ``spec`` (returned)."""
    object.__setattr__(spec, _ATTR, admission)
    return spec


def stamp_of(spec) -> Admission | None:
    """The spec's ``Admission``, ``None`` for a spec built in Python."""
    return getattr(spec, _ATTR, None)


def flag_error(key: str, flag: str, where: str) -> SpecError:
    """One line: ``<key>.<flag>`` true from ``where``, which only the person at the keyboard may allow."""
    return SpecError(f"{key}.{flag}", f"{where} sets it true, which {WHAT[flag]}; only the person at the keyboard "
                     "may allow that, for that one model spec.",
                     fix=_grant_fix(key, flag))


def _grant_fix(key: str, flag: str) -> str:
    """How the person at the keyboard grants ``flag`` for the spec at ``key``, in a form Hydra accepts."""
    parts = key.split(".")
    if key == "model":
        return f"type model.{flag}=true on the command line if you trust this checkpoint."
    if parts[:2] == ["model", "members"] and len(parts) == 3:
        return (f"if you trust this checkpoint, type the member list on the command line with member {parts[2]} "
                f"inline, e.g. 'model.members=[tiny,{{source: ..., {flag}: true}}]'.")
    if key == "model.implicit.reference":
        return f"if you trust this checkpoint, type 'model.implicit.reference={{source: ..., {flag}: true}}'."
    return ("a model named inside another model's file or a frame partner cannot be granted that; use a "
            "checkpoint without its own code (safetensors weights), or name it at the top level.")


def permitted(spec, flag: str) -> bool:
    """``spec.<flag>`` as a bool for a loader (never ``None``). True only when the spec was built in Python, or
    its stamp came from the door and grants that flag for its key; ``SpecError`` (one line) for a true flag a
    config set that no one typed, or a config's spec that never crossed the door."""
    value = getattr(spec, flag, False) is True
    adm = stamp_of(spec)
    if not value or adm is None:
        return value
    if adm.via != "door" or not adm.allows(flag):        # never through the door, or changed after it
        raise flag_error(adm.key, flag, "a config (not the command line)")
    return True


def permissions(spec) -> tuple[bool, bool]:
    """``(trust_remote_code, allow_pickle)`` of ``spec`` through ``permitted``: what every loader calls first,
    whatever the source (built-in, folder, hub id), so no spec reaches a loader without this check."""
    return permitted(spec, "trust_remote_code"), permitted(spec, "allow_pickle")
