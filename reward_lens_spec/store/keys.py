"""A store's listed signers: ``<store>/_internal/keys/<key id>.json`` (one public key each) and
``<store>/_internal/keys/policy.json`` (``{"require_signers": true|false}``).

Plain JSON files beside the Zarr hierarchy (zarr ignores them), written with the store's own exclusive
and atomic writes (``Backend``). They are a list, not trust: someone who can write the store can edit
them, so a reader trusts only the keys its own trust file pins (``store.trust_root``), and the policy
file can raise the requirement for signers, never lower it.
"""
from __future__ import annotations

import json
import re
import time

from reward_lens_spec.store._backend import INTERNAL, Backend
from reward_lens_spec.store.signing import key_id

KEYS = f"{INTERNAL}/keys"
POLICY = f"{KEYS}/policy.json"
_KEY = re.compile(r"^(?P<id>[0-9a-f]{16})\.json$")


def trusted_keys(b: Backend) -> dict[str, dict]:
    """The keys the store lists (not trusted by that alone: ``store.trust_root``):
    ``{key id: {"public_key": hex, "name": str}}``; a file whose key does not hash to its name is skipped."""
    out = {}
    for name in b.list_files(KEYS):
        m = _KEY.match(name)
        if not m:
            continue
        try:
            doc = b.read_json(f"{KEYS}/{name}") or {}
            if key_id(str(doc.get("public_key"))) == m["id"]:
                out[m["id"]] = {"public_key": doc["public_key"], "name": doc.get("name", "")}
        except (ValueError, TypeError):
            continue
    return out


def add_key(b: Backend, public_hex: str, name: str = "") -> str:
    """List ``public_hex`` in this store; return its key id (adding a key already there is a no-op)."""
    kid = key_id(public_hex)
    doc = {"key_id": kid, "public_key": public_hex, "name": name, "added": time.time()}
    b.create_exclusive(f"{KEYS}/{kid}.json", json.dumps(doc, sort_keys=True).encode())
    return kid


def require_signers(b: Backend) -> bool:
    """True when the store's own policy file asks for signers (a garbled one counts as asking); it can
    only raise the reader's requirement (``store.trust_root.policy``)."""
    try:
        doc = b.read_json(POLICY)
    except ValueError:
        return True
    return doc is not None and doc.get("require_signers") is not False


def set_require_signers(b: Backend, value: bool) -> None:
    b.write_atomic(POLICY, json.dumps({"require_signers": bool(value)}).encode())
