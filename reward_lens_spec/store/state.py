"""The state of one run id in a store, read from its run document: the one reading that the writer,
the attempts (``store.attempts``), the reader and ``gc`` all use, kept apart so that ``store.attempts``
and ``store.writer`` need not import each other.
"""
from __future__ import annotations

from reward_lens_spec.store._backend import DOC, INTERNAL, RUNS, Backend


def run_state(b: Backend, run_id: str) -> tuple[str, dict | None]:
    """``("complete"|"incomplete"|"corrupt"|"absent", run attrs or None)`` of one run.

    A run document with no attrs is the placeholder attempts create; with no attempt
    of it (``_internal/attempts/<run_id>/``) and nothing under it (a writer that failed and removed its own) the run is ``absent``.
    """
    state, doc, attrs = _document(b, run_id)
    if state is not None:
        return state, attrs
    if doc is None:
        return ("incomplete" if b.run_exists(run_id) else "absent"), None
    if not attrs and not b.list_dirs(f"{RUNS}/{run_id}") and not b.list_dirs(f"{INTERNAL}/attempts/{run_id}"):
        return "absent", None
    return "incomplete", attrs


def complete_attrs(b: Backend, run_id: str) -> dict | None:
    """The run's attrs when ``run_state`` says ``complete``, else None: decided by the run document alone, so
    nothing is listed (the listings only tell ``absent`` from ``incomplete``)."""
    state, _, attrs = _document(b, run_id)
    return attrs if state == "complete" else None


def _document(b: Backend, run_id: str) -> tuple[str | None, dict | None, dict | None]:
    """``(state when the run document decides it, else None; the document or None when absent; its attrs)``."""
    try:
        doc = b.read_json(f"{RUNS}/{run_id}/{DOC}")
    except ValueError:
        return "corrupt", None, None
    if doc is None:
        return None, None, None
    attrs = doc.get("attributes")
    if doc.get("node_type") != "group" or not isinstance(attrs, dict):
        return "corrupt", doc, None
    return ("complete" if attrs.get("complete") is True else None), doc, attrs
