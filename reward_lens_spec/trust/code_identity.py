"""The code a scorecard applies to: ``code_hash()`` of the operator and capture modules' source, the criteria,
identities and organisms that grade a card, and the package version (a function of theirs replaced at run time changes it too, ``code_changes``).

A card records the hash of the code that graded it; ``trust.evidence.card_verdict`` passes a card only
when it equals the hash of the code reading it.
"""
from __future__ import annotations
from pathlib import Path
import ast
import hashlib as _h
import inspect
import os
import sys
import sysconfig
from .. import __version__

# Operator modules (every ops/*.py) and the capture / intervention modules the operators run through.
CODE_MODULES = ("ops/*.py", "engine/capture.py", "engine/patching.py", "engine/interventions.py",
                "models/readout.py", "models/head.py", "models/gated_head.py", "engine/attn_heads.py",
                "engine/per_token.py", "engine/prefix.py", "engine/steering.py", "models/padding.py",
                "engine/copy_skip.py", "engine/reparam.py", "models/formatting.py", "run/executor.py", "run/stream.py",
                # what grades a card: its criteria, floors and identities, and the organisms it plants (a card
                # graded by older criteria does not calibrate runs read by newer ones)
                "trust/*criteria.py", "trust/cell_truth/*.py", "trust/identities.py", "trust/certificate.py",
                "models/*organism*.py", "organisms/*.py", "kinds/*/organism.py")
_CODE_CACHE: dict = {}


def _code_files():
    root = Path(__file__).resolve().parent.parent
    files = []
    for pat in CODE_MODULES:
        files += sorted(root.glob(pat))
    return root, files


def _defs(path):
    """Top-level ``def``/``class`` names of a source file: [(name, decorated, [(method, decorated)])]."""
    tree = ast.parse(path.read_bytes())
    out = []
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((n.name, bool(n.decorator_list), None))
        elif isinstance(n, ast.ClassDef):
            out.append((n.name, bool(n.decorator_list),
                        [(m.name, bool(m.decorator_list)) for m in n.body
                         if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]))
    return out


def _code_of(obj, decorated: bool):
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    if decorated:
        try:
            obj = inspect.unwrap(obj)
        except ValueError:
            return None
    return getattr(obj, "__code__", None)


def _library(filename: str) -> bool:
    """Generated (``<string>``) or from Python's own or installed libraries (dataclass methods, …)."""
    if filename.startswith("<"):
        return True
    if "libs" not in _CODE_CACHE:
        p = sysconfig.get_paths()
        _CODE_CACHE["libs"] = tuple({p[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if p.get(k)})
    return filename.startswith(_CODE_CACHE["libs"])


def code_changes() -> list[str]:
    """Functions and methods of the ``CODE_MODULES`` loaded in this process that are not the ones their
    source file defines (monkeypatched or replaced at run time); empty when the code is as written."""
    root, files = _code_files()
    bad = []
    for f in files:
        modname = "reward_lens_spec." + ".".join(f.relative_to(root).with_suffix("").parts)
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        key = ("defs", str(f))
        st = f.stat()
        if _CODE_CACHE.get(key, (None,))[0] != (st.st_mtime_ns, st.st_size):
            _CODE_CACHE[key] = ((st.st_mtime_ns, st.st_size), _defs(f))
        want = os.path.realpath(f)
        same = lambda code: code is not None and os.path.realpath(code.co_filename) == want  # noqa: E731
        for name, decorated, methods in _CODE_CACHE[key][1]:
            obj = mod.__dict__.get(name)
            if methods is None:
                if not same(_code_of(obj, decorated)):
                    bad.append(f"{modname}.{name}")
                continue
            if not isinstance(obj, type) or obj.__module__ != modname:
                bad.append(f"{modname}.{name}")
                continue
            listed = dict(methods)
            for m, v in obj.__dict__.items():        # methods as written, and none added from elsewhere
                code = _code_of(v, listed.get(m, False))
                if m in listed and not same(code):
                    bad.append(f"{modname}.{name}.{m}")
                elif m not in listed and code is not None and not same(code) and not _library(code.co_filename):
                    bad.append(f"{modname}.{name}.{m}")
    return bad


def code_hash() -> str:
    """sha256 of the package version and the source of every ``CODE_MODULES`` file; when a function of
    a loaded one was replaced at run time (``code_changes``), a different hash naming that."""
    root, files = _code_files()
    stats = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    if _CODE_CACHE.get("files", (None,))[0] != stats:
        h = _h.sha256(f"reward_lens_spec {__version__}\n".encode())
        for f in files:
            h.update(f"{f.relative_to(root).as_posix()}\0".encode() + _h.sha256(f.read_bytes()).digest())
        _CODE_CACHE["files"] = (stats, h.hexdigest())
    base = _CODE_CACHE["files"][1]
    changed = code_changes()
    if changed:
        return _h.sha256((base + "|modified:" + ",".join(changed)).encode()).hexdigest()
    return base
