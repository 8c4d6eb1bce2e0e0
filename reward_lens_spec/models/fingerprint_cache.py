"""A model's fingerprint without loading its weights: remembered per checkpoint content.

``model_fingerprint`` hashes every tensor, so it needs the weights in memory. To decide whether a run
is already in the store (``run.executor``) without loading them, the fingerprint a load computed is
remembered under a *weights key*: sha256 of the ``ModelSpec`` fields that shape the loaded model
(source, GGUF file, revision, dtype, labels, head kind and init, seed, attention, objectives), for a kind
other than the classifier its settings and the digest of its folder's code (``Kind.code_digest``: derived
from the kind, so no file of it can be left out), the package version and, for a checkpoint folder, the
sha256 of every file in it (``file_sha256``); for a built-in tiny model, the digest of every source file of the package (``signed_cache.package_digest``:
derived, so no file the builder imports can be left out). A hub id has no key (its files are not ours to
stat): such runs load the weights to decide.

Both caches are entries of the per-user signed cache (``signed_cache``, kinds ``files`` and
``fingerprints``): a planted, edited or copied entry is not taken, and a corrupt or unwritable cache only
costs a load. A reused run's fingerprint always comes from a load on this machine of the same bytes, and a
full load that finds a different fingerprint replaces the entry.

A file's digest is trusted only while its stat identity is unchanged: ``(st_dev, st_ino, size, mtime_ns,
ctime_ns)``. ``mtime`` can be set back by any tool that restores times (``cp -p``, ``rsync -t``, ``tar x``,
``touch -r``, ``os.utime``); ``ctime`` cannot be set by a user, and every write, rename or ``utime`` moves
it. As in git's "racily clean" rule, a digest is remembered only when the file's ctime is at least
``RACY_NS`` older than the moment hashing began and the stat is the same after hashing, so an edit within
the filesystem clock's tick of a hash can never be hidden behind an unchanged ctime.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from .. import __version__
from ..signed_cache import cache_dir, package_digest, read_signed, write_signed  # noqa: F401  (cache_dir: public here)
from ..admission import permissions
from .hub import load_tokenizer
from ..kinds import get_kind, kind_of, kind_settings
from .sources import resolve_source
from .artifacts import resolve

_SPEC_FIELDS = ("source", "gguf_file", "revision", "dtype", "num_labels", "head", "head_init", "seed",
                "attn_implementation", "objectives", "allow_pickle", "trust_remote_code")
RACY_NS = 2_000_000_000       # 2 s: the coarsest ctime granularity of common filesystems (1 s ext3, 2 s FAT)


def stat_identity(st: os.stat_result) -> str:
    """``"dev|ino|size|mtime_ns|ctime_ns"``: what a remembered file digest is keyed on."""
    return f"{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes; remembered (signed, kind ``files``) under its stat identity
    (``stat_identity``), re-hashed on any difference. Raises ``OSError`` when the file cannot be read."""
    st = os.stat(path)
    ident = stat_identity(st)
    doc = read_signed("files", ident)
    if doc is not None and isinstance(doc.get("sha256"), str):
        return doc["sha256"]
    began = time.time_ns()
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    if st.st_ctime_ns < began - RACY_NS and stat_identity(os.stat(path)) == ident:
        write_signed("files", ident, {"sha256": h.hexdigest()})
    return h.hexdigest()


def weights_key(spec, base_dir: str | None = None) -> str | None:
    """The key the fingerprint of ``spec``'s model is remembered under (``None``: no key, load to know)."""
    fields = {f: str(getattr(getattr(spec, f, None), "value", getattr(spec, f, None))) for f in _SPEC_FIELDS}
    if get_kind(kind_of(spec)).other_checkpoints:  # checkpoints (reference, members) beside model.source's:
        return None                                # load to know
    signal = kind_settings(spec)                  # a judge and a classifier of one checkpoint differ
    if signal:
        fields["signal"] = json.dumps(signal, sort_keys=True, default=str)
        fields["kind_code"] = get_kind(kind_of(spec)).code_digest()    # its loader's code shapes the weights
    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "hub":
        return None
    if kind == "builtin":
        files = {"package": package_digest()}
    else:
        root = Path(loc)
        files = {str(p.relative_to(root)): file_sha256(p) for p in sorted(root.rglob("*"))
                 if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}
    doc = {"v": __version__, "kind": kind, "spec": fields, "files": files}
    if getattr(spec, "interventions", None):       # a head artifact changes the weights: its bytes are in the key
        doc["interventions"] = [[e.kind, e.site, float(e.alpha), file_sha256(p) if p.is_file() else None]
                                for e in spec.interventions for p in [resolve(e.path, base_dir)]]
    blob = json.dumps(doc, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def remembered(key: str | None) -> str | None:
    """The fingerprint a load remembered under ``key``, or ``None``."""
    if key is None:
        return None
    doc = read_signed("fingerprints", key)
    fp = doc.get("model_fingerprint") if doc is not None else None
    return fp if isinstance(fp, str) and len(fp) == 64 else None


def remember(key: str | None, fingerprint: str) -> None:
    if key is not None:
        write_signed("fingerprints", key, {"model_fingerprint": fingerprint})


def load_tokenizer_only(spec, base_dir: str | None = None):
    """The tokenizer ``models.loading.load_model`` would give ``spec``'s model, without its weights."""
    from .armorm import is_armorm_folder
    from .loading import gguf_for, resolve_source
    from .tiny_tokenizer import build_tiny_tokenizer

    padding_side = str(getattr(spec.padding_side, "value", spec.padding_side))
    trust, _ = permissions(spec)                    # every spec's flags through the model door, any source
    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "builtin":
        return build_tiny_tokenizer(padding_side=padding_side)
    gguf = None if (kind == "folder" and is_armorm_folder(loc)) else gguf_for(spec, kind, loc)
    tok = load_tokenizer(loc, trust_remote_code=trust, source=spec.source, gguf_file=gguf,
                         revision=spec.revision or None)
    tok.padding_side = padding_side
    return tok
