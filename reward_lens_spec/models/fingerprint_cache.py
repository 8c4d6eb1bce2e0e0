"""A model's fingerprint without loading its weights: remembered per checkpoint content.

``model_fingerprint`` hashes every tensor, so it needs the weights in memory. To decide whether a run
is already in the store (``run.executor``) without loading them, the fingerprint a load computed is
remembered under a *weights key*: sha256 of the ``ModelSpec`` fields that shape the loaded model
(source, GGUF file, revision, dtype, labels, head kind and init, seed, attention, objectives), the
package version and, for a checkpoint folder, the sha256 of every file in it (each file's digest is
itself cached by absolute path, size and modification time, so an unchanged GGUF is not read again);
for a built-in tiny model, the source of the code that builds it. A hub id has no key (its files are
not ours to stat): such runs load the weights to decide. The cache is a folder of small JSON files
(``$REWARD_LENS_SPEC_CACHE``, default ``~/.cache/reward_lens_spec``); a corrupt or unwritable cache is
ignored, never trusted: a reused run's fingerprint always comes from a load on this machine of the
same bytes, and a full load that finds a different fingerprint replaces the entry.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .. import __version__

_SPEC_FIELDS = ("source", "gguf_file", "revision", "dtype", "num_labels", "head", "head_init", "seed",
                "attn_implementation", "objectives", "allow_pickle", "trust_remote_code")
_BUILDERS = ("tiny.py", "tiny_tokenizer.py", "gated_head.py", "loading.py", "head_init.py", "fingerprint.py",
             "kinds.py", "judge.py", "prm.py")


def cache_dir() -> Path:
    return Path(os.environ.get("REWARD_LENS_SPEC_CACHE") or Path.home() / ".cache" / "reward_lens_spec")


def read_entry(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_entry(path: Path, doc) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass                                             # a cache that cannot be written is only slower


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, cached by (absolute path, size, mtime_ns)."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    entry = cache_dir() / "files" / f"{key}.json"
    doc = read_entry(entry)
    if isinstance(doc, dict) and isinstance(doc.get("sha256"), str):
        return doc["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    write_entry(entry, {"sha256": h.hexdigest(), "path": str(path)})
    return h.hexdigest()


def weights_key(spec, base_dir: str | None = None) -> str | None:
    """The key the fingerprint of ``spec``'s model is remembered under (``None``: no key, load to know)."""
    from .sources import resolve_source

    fields = {f: str(getattr(getattr(spec, f, None), "value", getattr(spec, f, None))) for f in _SPEC_FIELDS}
    from .kinds import kind_of, kind_settings
    if kind_of(spec) in ("implicit", "ensemble"):  # other checkpoints (reference, members) than model.source's:
        return None                                # load to know
    signal = kind_settings(spec)                  # a judge and a classifier of one checkpoint differ
    if signal:
        fields["signal"] = json.dumps(signal, sort_keys=True, default=str)
    kind, loc = resolve_source(spec.source, base_dir)
    if kind == "hub":
        return None
    if kind == "builtin":
        here = Path(__file__).parent
        files = {n: hashlib.sha256((here / n).read_bytes()).hexdigest() for n in _BUILDERS if (here / n).is_file()}
    else:
        root = Path(loc)
        files = {str(p.relative_to(root)): file_sha256(p) for p in sorted(root.rglob("*"))
                 if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}
    blob = json.dumps({"v": __version__, "kind": kind, "spec": fields, "files": files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def remembered(key: str | None) -> str | None:
    """The fingerprint a load remembered under ``key``, or ``None``."""
    if key is None:
        return None
    doc = read_entry(cache_dir() / "fingerprints" / f"{key}.json")
    fp = doc.get("model_fingerprint") if isinstance(doc, dict) else None
    return fp if isinstance(fp, str) and len(fp) == 64 else None


def remember(key: str | None, fingerprint: str) -> None:
    if key is not None:
        write_entry(cache_dir() / "fingerprints" / f"{key}.json", {"model_fingerprint": fingerprint})


def load_tokenizer_only(spec, base_dir: str | None = None):
    """The tokenizer ``models.loading.load_model`` would give ``spec``'s model, without its weights."""
    from .armorm import is_armorm_folder
    from .admission import permissions
    from .hub import load_tokenizer
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
