"""Optional ed25519 signatures over the evidence log (extra ``sign``: the ``cryptography`` package).

A lab that wants evidence nobody can forge without a private key:

* ``reward-lens-spec store keygen out=lab.key`` writes a private key (PEM, mode 0600) and its public
  key next to it (``lab.key.pub``: the raw 32-byte key, hex), and prints the key id;
* every reader pins the lab's keys in its own trust file (``store.trust_root``: one line a signer,
  ``PRINCIPAL STORE-PATTERN ed25519:<hex>``, and ``@require STORE-PATTERN``), named by
  ``REWARD_LENS_SPEC_TRUST_FILE`` or ``store.trust_file=PATH``; ``reward-lens-spec store keys url=STORE
  add=lab.key.pub`` only lists a key in the store (``<store>/keys/<key id>.json``): a list, not trust;
* a writer signs with the private key named by the environment variable ``REWARD_LENS_SPEC_SIGN_KEY``
  (a path; never part of a run's config, so it reaches no provenance): every entry of the store's
  evidence log (``store.log``) — which binds a document's seal (its content hash), its sequence number
  and the previous entry's hash — carries ``signer`` (key id) and ``sig`` (ed25519 over the entry hash).

On read, an entry signed by a trusted key must verify; when the reader's policy requires signers for
the store, an entry that is unsigned, signed by a key its trust file does not pin, or badly signed does
not order its document, so that document reads as not in the log (trust cannot rise above
``exploratory`` from it).

Key id = the first 16 hex digits of sha256 of the raw public key. Ed25519: Bernstein et al. 2012,
"High-speed high-security signatures" (RFC 8032).
"""
from __future__ import annotations

import hashlib
import os

from ..errors import StoreError

ENV_KEY = "REWARD_LENS_SPEC_SIGN_KEY"
_MISSING = ("signatures need the `cryptography` package. Fix: pip install 'reward_lens_spec[sign]' "
            "(or pip install cryptography).")


def available() -> bool:
    try:
        import cryptography.hazmat.primitives.asymmetric.ed25519  # noqa: F401
    except ImportError:
        return False
    return True


def key_id(public_hex: str) -> str:
    """Key id of a raw public key (hex): first 16 hex digits of its sha256."""
    return hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()[:16]


def generate(path: str) -> tuple[str, str]:
    """Write a new private key to ``path`` (PEM, 0600; refuses to overwrite) and its public key to
    ``path + '.pub'`` (hex); return ``(key id, public hex)``. StoreError when ``cryptography`` is
    missing or ``path`` exists."""
    if not available():
        raise StoreError(_MISSING)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if os.path.exists(path) or os.path.exists(path + ".pub"):
        raise StoreError(f"store keygen: {path} (or {path}.pub) exists; refusing to overwrite a key. "
                         "Fix: choose another out=.")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = public_hex(key)
    with open(path + ".pub", "w") as f:
        f.write(pub + "\n")
    return key_id(pub), pub


def public_hex(private_key) -> str:
    from cryptography.hazmat.primitives import serialization

    return private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                 serialization.PublicFormat.Raw).hex()


def load_private(path: str):
    """The ed25519 private key in the PEM file ``path``; StoreError naming the path when it is not one."""
    if not available():
        raise StoreError(f"{ENV_KEY}={path}: " + _MISSING)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        with open(path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise StoreError(f"{ENV_KEY}={path}: cannot read an ed25519 private key there ({e}). Fix: point it at "
                         "a key written by `reward-lens-spec store keygen out=PATH`.") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise StoreError(f"{ENV_KEY}={path}: not an ed25519 key. Fix: `reward-lens-spec store keygen out=PATH`.")
    return key


def signing_key():
    """The writer's private key (``REWARD_LENS_SPEC_SIGN_KEY``), or None when it is unset."""
    path = os.environ.get(ENV_KEY)
    return load_private(os.path.expanduser(path)) if path else None


def read_public(path: str) -> str:
    """Public key (hex) from a ``.pub`` file written by ``generate``; StoreError when it is not one."""
    try:
        text = open(path).read().strip()
        if len(bytes.fromhex(text)) != 32:
            raise ValueError("not 32 bytes")
    except (OSError, ValueError) as e:
        raise StoreError(f"store keys: add={path} is not a public key file ({e}). Fix: use the .pub file "
                         "`reward-lens-spec store keygen` wrote.") from e
    return text


def sign(private_key, message: str) -> tuple[str, str]:
    """``(key id, signature hex)`` of ``message`` (UTF-8)."""
    return key_id(public_hex(private_key)), private_key.sign(message.encode()).hex()


def verify(public: str, message: str, signature: str) -> bool:
    """True when ``signature`` (hex) is ``public``'s (hex) ed25519 signature of ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public)).verify(bytes.fromhex(signature), message.encode())
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True
