"""Outcomes remembered in the user's cache only this user can have written: entries signed with a per-user key.

Every cache entry that feeds a decision to skip work is kept here: a check that passed (``run.compose.prepare``,
kinds ``argv`` and ``compose``: the safety rules and typo checks of a command line), a plan that validated
(``validate``), a file's sha256 (``files``, ``models.fingerprint_cache.file_sha256``), a model's fingerprint
(``fingerprints``), a model's description (``describe``) and the run a reuse key names (``runs``,
``run.reuse``). Each is remembered under a digest of *everything it read*, so the same inputs skip the work and
any changed input does it again. Skipping a safety check, or taking a stored run for this one, on the word of
a file is only safe if nobody else can write that word, so each entry is signed: its name and content
carry an HMAC-SHA256 under a random 32-byte key (``$REWARD_LENS_SPEC_CACHE/checks/key``) that is
created with mode 0600 and used only while it is owned by this user and readable by no one else. A
planted, edited or copied entry, a key with loose permissions, or a system without per-user file
ownership (no ``os.getuid``) only means the work is done again — never that it is skipped.

``package_digest`` (every source and data file of the installed package) is part of every check's digest
and of a built-in model's weights key: a change to the code that checks, or that builds the model, changes
the outcome.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

_PACKAGE_SUFFIXES = (".py", ".jsonl", ".json", ".yaml")
_PACKAGE_DIGEST: dict = {}


def package_digest() -> str:
    """sha256 of every source and data file of the installed package (path and bytes), once per process."""
    if "d" not in _PACKAGE_DIGEST:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.is_file() and p.suffix in _PACKAGE_SUFFIXES and "__pycache__" not in p.parts:
                h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
        _PACKAGE_DIGEST["d"] = h.hexdigest()
    return _PACKAGE_DIGEST["d"]


def cache_dir() -> Path:
    """The user's cache folder: ``$REWARD_LENS_SPEC_CACHE``, default ``~/.cache/reward_lens_spec``."""
    return Path(os.environ.get("REWARD_LENS_SPEC_CACHE") or Path.home() / ".cache" / "reward_lens_spec")


def _folder() -> Path:
    return cache_dir() / "checks"


def _own_private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO)


def _key(create: bool) -> bytes | None:
    """The per-user signing key (created when ``create``), or ``None`` where it cannot be trusted."""
    if not hasattr(os, "getuid"):
        return None
    path = _folder() / "key"
    if create and not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
        except OSError:
            pass                                           # another process made it, or no cache: read below
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not _own_private(os.fstat(fh.fileno())):
            return None
        key = fh.read()
    return key if len(key) == 32 else None


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def user_tag(kind: str, text: str) -> str | None:
    """HMAC-SHA256 of ``text`` under this user's key (created if needed), or ``None`` where no key can be
    trusted: a tag only this user can have written (``store.attempts``: chunk markers)."""
    key = _key(create=True)
    return None if key is None else _mac(key, kind, text)


def tagged_by_user(kind: str, text: str, tag) -> bool:
    """True when ``tag`` is ``user_tag(kind, text)`` under this user's key."""
    key = _key(create=False)
    return key is not None and isinstance(tag, str) and hmac.compare_digest(tag, _mac(key, kind, text))


def read_signed(kind: str, digest: str) -> dict | None:
    """The entry remembered for ``(kind, digest)`` when its signature verifies under this user's key, else ``None``."""
    key = _key(create=False)
    if key is None:
        return None
    path = _folder() / kind / f"{_mac(key, kind, digest)}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("mac"), str) or not isinstance(doc.get("doc"), dict):
        return None
    body = json.dumps(doc["doc"], sort_keys=True)
    return doc["doc"] if hmac.compare_digest(doc["mac"], _mac(key, kind, digest, body)) else None


def write_signed(kind: str, digest: str, doc: dict) -> None:
    """Remember ``doc`` (plain JSON) for ``(kind, digest)``, signed; a cache that cannot be written is only slower."""
    key = _key(create=True)
    if key is None:
        return
    body = json.dumps(doc, sort_keys=True)
    path = _folder() / kind / f"{_mac(key, kind, digest)}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"doc": doc, "mac": _mac(key, kind, digest, body)}, sort_keys=True),
                       encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
