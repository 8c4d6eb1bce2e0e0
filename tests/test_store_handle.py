"""Issue 38 item 2: one store handle. A store URL (and its storage options) is opened once, by
``store.store_handle``, and the handle is handed to every reader and writer; a run opens its store once, in
``run.executor``; operators read stored inputs through their run context and never open a store.

The guard is at the boundary: every call site that opens a store (builds a filesystem, a zarr store or a
``Backend`` from a URL) is enumerated from the package's source (AST) and must be one of the listed doors.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from reward_lens_spec.errors import SpecError, StoreError
from reward_lens_spec.store import Backend, store_handle

PACKAGE = Path(__file__).resolve().parents[1] / "reward_lens_spec"

# what builds a filesystem or a zarr store from a URL: only the handle itself does
RAW_OPENERS = {"Backend", "url_to_fs", "filesystem", "LocalStore", "FsspecStore", "from_url"}
# functions that open a store when handed a URL (they also take a handle, and then open nothing)
DOORS = {"store_handle", "open_store", "is_complete", "write_run", "complete_provenance", "load_frame",
         "save_frame", "check_run", "frozen_studies"}
# where a URL may be turned into a handle: the handle's own module, the store's public doors, the one run
# path, and the commands / Python face a user hands a URL to
URL_OPENERS = {
    "store/_backend.py": {"store_handle"},
    "store/reader.py": {"open_store"},
    "store/writer.py": {"write_run", "is_complete"},
    "store/run_doc.py": {"complete_provenance"},
    "store/migration.py": {"migrate"},
    "store/layout.py": {"check_writable"},
    "store/verify.py": {"run_keys"},
    "store/stored_inputs.py": {"StoredInputs.handle"},
    "run/executor.py": {"execute", "compute"},
}
# modules of the run path and below it that must never turn a URL into a store (they are handed one)
HANDED = ("run/", "ops/", "frames/", "models/", "engine/", "kinds/", "data/", "context.py", "inputs.py",
          "planning.py", "registry.py", "identity.py", "organisms/")


def _calls():
    """``(module path, enclosing function (Class.method), called name, first argument's source)`` of every
    call in the package."""
    out = []
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(PACKAGE).as_posix()
        src = f.read_text(encoding="utf-8")

        def walk(node, where):
            for child in ast.iter_child_nodes(node):
                here = where
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    here = f"{where}.{child.name}" if where else child.name
                if isinstance(child, ast.Call):
                    fn = child.func
                    name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                    first = ast.get_source_segment(src, child.args[0]) if child.args else ""
                    out.append((rel, where, name, first or ""))
                walk(child, here)
        walk(ast.parse(src), "")
    return out


CALLS = _calls()


def test_only_the_handle_builds_a_filesystem_or_a_zarr_store_from_a_url():
    raw = {(m, w, n) for m, w, n, _ in CALLS
           if n in RAW_OPENERS and (n != "filesystem" or m.startswith("store/"))}
    assert raw == {
        ("store/_backend.py", "Backend.__init__", "filesystem"),
        ("store/_backend.py", "Backend.__init__", "url_to_fs"),
        ("store/_backend.py", "Backend.zarr_store", "LocalStore"),
        ("store/_backend.py", "Backend.zarr_store", "from_url"),
        ("store/_backend.py", "Backend.zarr_store", "FsspecStore"),     # a synchronous filesystem's, wrapped once
        ("store/_backend.py", "store_handle", "Backend")}, (
        "a store is opened outside store.store_handle; take the handle from your caller instead: " + repr(sorted(raw)))


def test_urls_become_store_handles_only_at_the_doors():
    """``store_handle(url)`` is called only by the store's public doors and the one run path."""
    sites = {(m, w) for m, w, n, _ in CALLS if n == "store_handle"}
    allowed = {(m, w) for m, ws in URL_OPENERS.items() for w in ws}
    assert sites - allowed == set(), f"store_handle called outside the doors: {sorted(sites - allowed)}"
    assert ("run/executor.py", "execute") in sites and ("run/executor.py", "compute") in sites


def test_the_run_path_is_handed_its_store_and_operators_never_open_one():
    """Below the run's entry, a door is called with a handle, never with a URL; ``ops/`` calls no door at all."""
    url_calls = sorted((m, w, n, a) for m, w, n, a in CALLS
                       if n in DOORS and m.startswith(HANDED) and "url" in a.lower()
                       and (m, w) not in {("run/executor.py", "execute"), ("run/executor.py", "compute")})
    assert url_calls == [], f"a store opened from a URL on the run path (hand the run's store down): {url_calls}"
    in_ops = sorted((m, w, n) for m, w, n, _ in CALLS if n in DOORS | RAW_OPENERS and m.startswith("ops/"))
    assert in_ops == [], f"operators open stores (read them through ctx.stored): {in_ops}"


def test_the_enumeration_sees_a_forbidden_open(tmp_path):
    """The AST walk is not vacuous: it finds the executor's one open and the reader's door."""
    assert ("run/executor.py", "execute", "store_handle", "store_url") in [
        (m, w, n, a.split(",")[0]) for m, w, n, a in CALLS]
    assert any(m == "store/reader.py" and w == "open_store" and n == "store_handle" for m, w, n, _ in CALLS)


def test_a_handle_is_handed_back_as_it_is(tmp_path):
    b = store_handle(str(tmp_path / "s.zarr"))
    assert isinstance(b, Backend) and store_handle(b) is b and store_handle(b, {}) is b
    with pytest.raises(StoreError, match="storage options given beside an open store handle"):
        store_handle(b, {"anon": True})
    with pytest.raises(StoreError, match="non-empty string"):
        store_handle("")


def test_a_run_opens_its_store_once_and_a_rerun_once(tmp_path, monkeypatch):
    import reward_lens_spec as rls
    from reward_lens_spec.store import _backend

    monkeypatch.chdir(tmp_path)
    made = []
    real = _backend.Backend.__init__

    def counting(self, url, storage_options=None):
        made.append(url)
        real(self, url, storage_options)

    monkeypatch.setattr(_backend.Backend, "__init__", counting)
    args = ["model=tiny", "observable=score", "dataset.limit=4", f"store.url={tmp_path / 'r.zarr'}"]
    first = rls.run(args)
    assert made == [str(tmp_path / "r.zarr")], made
    first.results                                   # read through the run's own handle
    assert len(made) == 1
    made.clear()
    again = rls.run(args)
    assert again.reused and again.run_id == first.run_id and made == [str(tmp_path / "r.zarr")]


def test_an_operator_context_without_stores_says_so():
    from reward_lens_spec.context import RunContext

    ctx = RunContext(lm=None, pairs=None, encoded=None, capture=None, info=None)
    with pytest.raises(SpecError) as e:
        ctx.stored("store:x.zarr#r/o/v", lazy=False, where="observable.steps.direction")
    assert str(e.value).startswith("observable.steps.direction") and "\n" not in str(e.value)


def test_a_malformed_stored_reference_names_the_field():
    from reward_lens_spec.store.stored_inputs import StoredInputs

    with pytest.raises(SpecError, match="observable.steps.train_on"):
        StoredInputs().variable("store:x.zarr#only/two", lazy=True, where="observable.steps.train_on")
