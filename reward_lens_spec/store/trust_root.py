"""The reader's trust root: which signers a store requires and which keys are trusted, from a lab trust
file on the READER's side, never from the store.

The file is named by the environment variable ``REWARD_LENS_SPEC_TRUST_FILE`` or, typed on the command
line, ``store.trust_file=PATH`` (``cli.main`` turns the word into the variable for that process and its
jobs; a shared YAML cannot name one). Its shape follows git's ``allowed_signers`` (``ssh-keygen(1)``,
ALLOWED SIGNERS): one signer a line, ``#`` starts a comment::

    # principal   scope (store URL pattern)   key
    alice@lab     /data/lab/*.zarr            ed25519:<64 hex: the raw public key>
    ci@lab        *                           sha256:<64 hex: sha256 of the raw public key>
    @require      /data/lab/*.zarr

* a signer line pins a key for the stores whose URL (for a local store: its absolute or its resolved
  path) matches ``scope`` (``fnmatch``: ``*`` also matches ``/``, so ``*`` alone is every store).
  ``ed25519:`` gives the key itself; ``sha256:`` pins its full fingerprint, and the key is then taken
  from the store's ``keys/`` list only where it hashes to that fingerprint;
* ``@require PATTERN``: the stores matching it require signers: an unsigned log entry, or one signed
  by a key not pinned for the store, orders nothing (``store.log``).

The store's own ``keys/`` (``store.keys``) is a list, not trust: a key listed only there is not
trusted, and deleting ``keys/``, deleting ``keys/policy.json`` or writing ``{"require_signers": false}``
lowers nothing. ``keys/policy.json`` saying ``true`` can only raise the requirement (a store may ask
for more than its reader does). Without a trust file no key is trusted.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from dataclasses import dataclass, field

from reward_lens_spec.errors import SpecError
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.keys import KEYS, require_signers, trusted_keys

ENV_TRUST = "REWARD_LENS_SPEC_TRUST_FILE"
WORD = "store.trust_file"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FIX = ("one signer a line: `PRINCIPAL SCOPE ed25519:<hex public key>` or `PRINCIPAL SCOPE sha256:<hex "
        "fingerprint>`, or `@require SCOPE` (see `reward-lens-spec store --help`).")


@dataclass(frozen=True)
class Signer:
    principal: str
    scope: str
    fingerprint: str                 # sha256 hex of the raw public key
    public_key: str | None           # hex, or None where only the fingerprint is pinned
    line: int


@dataclass(frozen=True)
class TrustFile:
    path: str | None
    signers: tuple = ()
    require: tuple = ()              # (pattern, line)


@dataclass
class Policy:
    """The effective policy of one store for this reader."""
    required: bool
    keys: dict = field(default_factory=dict)     # key id -> {"public_key", "principal", "line"}
    source: str = ""                             # where each part came from, one line


def fingerprint(public_hex: str) -> str:
    """sha256 hex of a raw public key (hex); its first 16 digits are the key id (``trust.signing.key_id``)."""
    return hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()


def _bad(path: str, n: int, problem: str) -> SpecError:
    return SpecError(WORD, f"{path} line {n}: {problem}.", fix=_FIX)


def load(path: str) -> TrustFile:
    """Parse the trust file at ``path``; ``SpecError`` naming the file and line when it cannot be used."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(WORD, f"cannot read the trust file {path} ({type(e).__name__}: {e}).",
                        fix=f"point {ENV_TRUST} (or {WORD}=) at a readable lab trust file.") from None
    signers, require = [], []
    for n, raw in enumerate(text.splitlines(), 1):
        words = re.sub(r"(^|\s)#.*$", "", raw).split()
        if not words:
            continue
        if words[0] == "@require":
            if len(words) != 2:
                raise _bad(path, n, "`@require` takes one store URL pattern")
            require.append((words[1], n))
            continue
        if len(words) != 3 or words[0].startswith("@"):
            raise _bad(path, n, f"expected 3 fields (principal, scope, key), got {len(words)}")
        kind, _, value = words[2].partition(":")
        value = value.lower()
        if kind == "ed25519" and re.fullmatch(r"[0-9a-f]{64}", value):
            signers.append(Signer(words[0], words[1], fingerprint(value), value, n))
        elif kind == "sha256" and _HEX64.match(value):
            signers.append(Signer(words[0], words[1], value, None, n))
        else:
            raise _bad(path, n, f"key {words[2][:40]!r} is neither ed25519:<64 hex> nor sha256:<64 hex>")
    return TrustFile(path, tuple(signers), tuple(require))


def reader_file() -> TrustFile:
    """The reader's trust file (``REWARD_LENS_SPEC_TRUST_FILE``), or an empty one when none is named."""
    path = os.environ.get(ENV_TRUST)
    return load(os.path.abspath(os.path.expanduser(path))) if path else TrustFile(None)


def _names(b: Backend) -> set[str]:
    names = {b.url, b.url.rstrip("/")}
    if b.local:
        names |= {b.root, os.path.realpath(b.root)}
    return names


def _matches(b: Backend, pattern: str) -> bool:
    pattern = os.path.expanduser(pattern)
    return any(fnmatch.fnmatchcase(n, pattern) for n in _names(b))


def policy(b: Backend, root: TrustFile | None = None) -> Policy:
    """The effective signer policy of store ``b`` for this reader (``root``: default ``reader_file()``):
    required when the trust file requires it for this store or the store's ``keys/policy.json`` asks for
    it; trusted keys only those the trust file pins for this store. ``SpecError`` for a bad trust file."""
    root = reader_file() if root is None else root
    has_keys = b.exists_key(KEYS)
    listed = trusted_keys(b) if has_keys else {}
    by_fp = {fingerprint(k["public_key"]): k["public_key"] for k in listed.values()}
    keys, unresolved = {}, []
    for s in root.signers:
        if not _matches(b, s.scope):
            continue
        pub = s.public_key or by_fp.get(s.fingerprint)
        if pub is None:
            unresolved.append(s)
            continue
        keys[fingerprint(pub)[:16]] = {"public_key": pub, "principal": s.principal, "line": s.line}
    req = [(p, n) for p, n in root.require if _matches(b, p)]
    store_req = has_keys and require_signers(b)
    parts = []
    if root.path is None:
        parts.append(f"no trust file ({ENV_TRUST} or {WORD}=PATH): no key is trusted")
    else:
        parts.append(f"trust file {root.path}: " + (", ".join(
            f"{v['principal']} key {k} (line {v['line']})" for k, v in sorted(keys.items())) or "no key pinned")
            + " for this store")
        parts += [f"{s.principal} (line {s.line}) pinned by fingerprint, key not listed in the store"
                  for s in unresolved]
    if req:
        parts.append(f"signers required by {root.path} line {req[0][1]} (@require {req[0][0]})")
    elif store_req:
        parts.append("signers required by the store's keys/policy.json (a store can raise the requirement, "
                     "never lower it)")
    else:
        parts.append("signers not required")
    if listed:
        parts.append(f"the store's keys/ lists {len(listed)} key(s): trusted only where the trust file pins them")
    return Policy(bool(req) or store_req, keys, "; ".join(parts))


def use_words(argv: list[str], *words: str) -> list[str]:
    """``argv`` without the words ``<word>=PATH`` (``words``: default ``store.trust_file``), the last one
    of which becomes this process's trust file (``REWARD_LENS_SPEC_TRUST_FILE``, inherited by its jobs).
    Only a word typed on the command line names a trust file: never a config file. ``SpecError`` when
    the file cannot be read or parsed."""
    words = words or (WORD,)
    rest, path = [], None
    for a in argv:
        key, sep, value = a.partition("=")
        if sep and key in words:
            path = value
        else:
            rest.append(a)
    if path is not None:
        if not path:
            raise SpecError(WORD, "empty path.", fix=f"{WORD}=/path/to/lab.trust")
        path = os.path.abspath(os.path.expanduser(path))
        load(path)
        os.environ[ENV_TRUST] = path
    return rest
