"""Trust derived on read from a verified evidence chain: run → scorecards → frozen study.

Every trust-bearing store document (result run, scorecard, frozen study,
adjudication) is *sealed* when written: ``content_hash`` = sha256 of the
canonical JSON of its attrs, leaving out the store's own keys (``STORE_KEYS``)
and the cache keys (``CACHE_KEYS``: the stored ``trust`` label and per-variable
labels). A reader never believes a stored label. ``derive`` recomputes, from
the documents the store holds now:

* a **scorecard** is valid when its seal verifies AND its verdict, recomputed
  from its stored readings with this package's thresholds (``card_verdict``),
  equals its ``passed`` field; the verdict passes only when the card's
  ``code_hash`` equals ``code_hash()`` of the reading code (the operator and
  capture modules' source and the package version; a function of theirs
  replaced at run time changes it too), so a card applies only to the code
  that wrote it;
* a **frozen study** is valid when its seal verifies AND ``study_hash`` is the
  hash of the stored study (an edited threshold breaks both);
* a **result run** is ``calibrated`` for each output variable a valid, passing,
  *latest* card (per organism kind and base, same observable content hash and
  model family) graded, provided every latest card is valid and passing and the
  run's own exactness identities hold (``identities_ok``); ``registered`` when
  additionally it executed a valid frozen study, frozen before the run, whose
  pins (observable content hash, model fingerprint, dataset checksum) equal the
  run's. Ungraded variables stay ``exploratory``; the run's level is the lowest
  over its outputs. A run whose seal fails is ``exploratory``;
* an **adjudication** is ``adjudicated`` when its seal and its study verify, its
  outcomes follow from its stored values under the study's thresholds, and in
  every run it scored each variable the predictions read derives ``registered`` now;
* a **compare** record gets the lower derived level of its two runs.

Because the cards are looked up at read time, a later failing card downgrades
every run that relied on an earlier passing one. A stored label that differs
from the derived one is reported as ``trust_verified: false`` with
``trust_reason``. Reading changes nothing in the store.

Limits: a seal is an integrity check, not a signature — someone who rewrites a
document AND recomputes its hash is caught only where the verdict is re-derived
from the stored numbers (cards, adjudications), not where the numbers
themselves were replaced.

No torch import: the store reader calls this.
"""
from __future__ import annotations

import hashlib
import json

LEVELS = ("exploratory", "calibrated", "registered", "adjudicated")
CACHE_KEYS = ("trust", "trust_by_variable", "content_hash")
STORE_KEYS = ("run_id", "observables", "created", "complete", "store_write_s", "writer", "attempt")
DERIVED_KEYS = ("trust_stored", "trust_verified", "trust_reason", "trust_by_variable", "trust_scope")
NOT_RESULTS = ("scorecard", "study", "adjudication")

MIN_SPEARMAN = 0.9
FLOORS = {"dla_share": 0.5, "patch_share": 0.5, "attribution_share": 0.5, "lens_jump": 0.5,
          "crystallization": 0.8, "score": 0.8,
          # interventions (no planted reward-unit magnitude: ratios, shares of effects, 1 − p)
          "ablation_share": 0.5, "steer_alignment": 0.5, "null_excess": 0.95, "group_stats": 0.5,
          "path_separation": 0.5,
          # preference structure (graded only on their own organism kinds)
          "label_cycles": 0.0, "cyclic_gain": 1e-9, "contested_direction": 0.8, "contested_margin": 1e-9,
          "effective_objectives": 0.99, "scalar_cost": 0.5}
# |reading − planted truth| ≤ MAG_RTOL · |planted truth| (reward units, at full strength)
MAG_RTOL = {"dla_share": 0.1, "patch_share": 0.1, "attribution_share": 0.25, "lens_jump": 0.15,
            "crystallization": 0.15, "score": 0.1}
# exact instruments (DLA, exact patching, the lens, the margin) are compared with the same cells from a
# plain HF forward (magnitude "truth_from": "cells"): float error only. Attribution patching (first order)
# and a truth that is only the planted margin change keep the MAG_RTOL band.
MAG_RTOL_EXACT = 1e-3
EXACT_CRITERIA = ("dla_share", "patch_share", "lens_jump", "crystallization", "score")
# exactness identities: max |err| ≤ IDENTITY_RTOL[dtype] · margin scale (see trust.identities)
IDENTITY_RTOL = {"float64": 1e-3, "float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}


def _rank(level) -> int:
    return LEVELS.index(level) if level in LEVELS else 0


def content_hash(attrs: dict) -> str:
    """sha256 hex of the canonical JSON of ``attrs`` minus ``STORE_KEYS`` and ``CACHE_KEYS``."""
    body = {k: v for k, v in attrs.items() if k not in STORE_KEYS + CACHE_KEYS + DERIVED_KEYS}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
                          .encode()).hexdigest()


def seal(attrs: dict) -> dict:
    """``attrs`` with its ``content_hash`` added (call last, after every other key is set)."""
    return {**attrs, "content_hash": content_hash(attrs)}


def seal_error(attrs: dict) -> str | None:
    """None when the document's seal verifies, else what failed."""
    got = attrs.get("content_hash")
    if not got:
        return "no content hash (not sealed when written)"
    if got != content_hash(attrs):
        return "content hash mismatch: the document was edited after it was written"
    return None


def identities_ok(records) -> tuple[bool, str]:
    """Re-check stored identity residuals against this package's tolerances."""
    for r in records or ():
        rtol = IDENTITY_RTOL.get(str(r.get("dtype")), IDENTITY_RTOL["float32"])
        err, scale = r.get("max_abs_err"), r.get("scale")
        if err is None or scale is None or not err <= rtol * scale:
            return False, (f"identity {r.get('identity')!r} broken: max |err| {err} > {rtol:g} × margin scale "
                           f"{scale}")
    return True, ""


# -- the code a card applies to ------------------------------------------------------------------------
# Operator modules (every ops/*.py) and the capture / intervention modules the operators run through.
CODE_MODULES = ("ops/*.py", "models/capture.py", "models/patching.py", "models/interventions.py",
                "models/readout.py", "models/head.py", "models/gated_head.py", "models/attn_heads.py",
                "models/per_token.py", "models/prefix.py", "models/steering.py", "models/padding.py",
                "models/copy_skip.py", "models/reparam.py", "models/formatting.py", "run/executor.py", "run/stream.py")
_CODE_CACHE: dict = {}


def _code_files():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    files = []
    for pat in CODE_MODULES:
        files += sorted(root.glob(pat))
    return root, files


def _defs(path):
    """Top-level ``def``/``class`` names of a source file: [(name, decorated, [(method, decorated)])]."""
    import ast
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
    import inspect
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
    import sysconfig
    if filename.startswith("<"):
        return True
    if "libs" not in _CODE_CACHE:
        p = sysconfig.get_paths()
        _CODE_CACHE["libs"] = tuple({p[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if p.get(k)})
    return filename.startswith(_CODE_CACHE["libs"])


def code_changes() -> list[str]:
    """Functions and methods of the ``CODE_MODULES`` loaded in this process that are not the ones their
    source file defines (monkeypatched or replaced at run time); empty when the code is as written."""
    import os
    import sys
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
    import hashlib as _h
    from .. import __version__
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


def card_verdict(card: dict, *, check_code: bool = True) -> tuple[bool, str]:
    """``(passes, why not)`` recomputed from a card's stored numbers and this package's thresholds.

    ``check_code``: the card must record the ``code_hash`` of the code reading it (a card applies only
    to the operator and capture code that wrote it).
    """
    crits = list(card.get("readings") or {})
    if not crits:
        return False, "grades no criterion"
    if check_code:
        here = code_hash()
        if card.get("code_hash") != here:
            changed = code_changes()
            return False, (f"written by other code: card code hash {str(card.get('code_hash'))[:12]}, this code "
                           f"{here[:12]}" + (f" (replaced at run time: {', '.join(changed[:5])})" if changed else ""))
    planted = "layer" in (card.get("truth") or {})
    for c in crits:
        if c not in FLOORS:
            return False, f"unknown criterion {c!r}"
        rho = (card.get("spearman") or {}).get(c)
        if rho is None or not rho >= MIN_SPEARMAN:
            return False, f"{c}: Spearman {rho} < {MIN_SPEARMAN}"
        fv = ((card.get("floors") or {}).get(c) or {}).get("value")
        if fv is None or not fv >= FLOORS[c]:
            return False, f"{c}: floor value {fv} < {FLOORS[c]}"
        if planted and c in MAG_RTOL:          # criteria with a planted reward-unit magnitude
            m = (card.get("magnitude") or {}).get(c) or {}
            got, want = m.get("reading"), m.get("truth")
            rtol = MAG_RTOL_EXACT if c in EXACT_CRITERIA and m.get("truth_from") == "cells" else MAG_RTOL[c]
            if got is None or want is None or not abs(got - want) <= rtol * abs(want) or want == 0:
                return False, (f"{c}: magnitude {got} reward units vs planted {want} "
                               f"(needs within {rtol:.3g} relative, truth from {m.get('truth_from', 'margin')})")
    for per_strength in card.get("identities") or ():
        ok, why = identities_ok(per_strength)
        if not ok:
            return False, why
    return True, ""


class Evidence:
    """Every complete document of one store, indexed for derivation (built once per read)."""

    def __init__(self, docs: dict[str, dict]):
        self.docs = docs
        self.cards: dict[tuple, list[tuple[str, dict]]] = {}
        self.studies: dict[str, list[tuple[str, dict]]] = {}
        for rid, a in sorted(docs.items(), key=lambda kv: (str(kv[1].get("created")), kv[0])):
            if a.get("kind") == "scorecard":
                self.cards.setdefault((a.get("observable_spec_hash"), a.get("model_family")), []).append((rid, a))
            elif a.get("kind") == "study":
                self.studies.setdefault(a.get("study_hash"), []).append((rid, a))
        self._memo: dict[str, dict] = {}

    def card_error(self, rid: str, a: dict) -> str | None:
        bad = seal_error(a)
        if bad:
            return f"scorecard {rid}: {bad}"
        ok, why = card_verdict(a)
        if ok != (a.get("passed") is True):
            return f"scorecard {rid}: stored passed={a.get('passed')} but its readings give {ok} ({why or 'pass'})"
        return None

    def study_error(self, rid: str, a: dict) -> str | None:
        from .study_doc import study_hash
        bad = seal_error(a)
        if bad:
            return f"study {rid}: {bad}"
        if not isinstance(a.get("study"), dict) or study_hash(a["study"]) != a.get("study_hash"):
            return f"study {rid}: stored study does not hash to its study_hash (edited after freezing)"
        return None

    def verified_study(self, shash: str | None) -> tuple[dict | None, str]:
        """The first frozen record of ``shash`` and '' — or None and why not."""
        recs = self.studies.get(shash) or []
        if not recs:
            return None, f"study {str(shash)[:12]} is not frozen in the store"
        for rid, a in recs:
            bad = self.study_error(rid, a)
            if bad:
                return None, bad
        return recs[0][1], ""

    # -- derivation ------------------------------------------------------------------
    def derive(self, run_id: str) -> dict:
        """``{trust, trust_by_variable, trust_verified, trust_reason, trust_stored, trust_scope}``."""
        if run_id not in self._memo:
            self._memo[run_id] = self._derive(run_id, self.docs[run_id])
        return self._memo[run_id]

    def _derive(self, rid: str, a: dict) -> dict:
        kind = a.get("kind")
        if kind == "scorecard":
            bad = self.card_error(rid, a)
            return _verdict(a, None, {}, bad is None, bad or "scorecard verifies")
        if kind == "study":
            bad = self.study_error(rid, a)
            return _verdict(a, None, {}, bad is None, bad or "frozen study verifies")
        if kind == "adjudication":
            return self._adjudication(rid, a)
        if a.get("observable") == "compare" and isinstance(a.get("runs"), list):
            levels = [self.derive(r)["trust"] if r in self.docs else "exploratory" for r in a["runs"]]
            level = min(levels, key=_rank) if levels else "exploratory"
            return _verdict(a, level, {}, True, f"lower derived trust of runs {a['runs']}")
        return self._result(rid, a)

    def calibration(self, a: dict) -> tuple[set, list, str]:
        """``(graded variables, scopes, reason)``; empty set when the calibration gate fails."""
        key = (a.get("observable_spec_hash"), a.get("model_family"))
        if key[0] is None:
            return set(), [], "the run records no observable content hash"
        latest: dict = {}
        for rid, c in self.cards.get(key, []):
            latest[(c.get("organism"), c.get("base"))] = (rid, c)
        if not latest:
            return set(), [], f"no scorecard for observable [{str(key[0])[:12]}] on family {key[1]!r}"
        for rid, c in latest.values():
            bad = self.card_error(rid, c)
            if bad:
                return set(), [], bad
            if c.get("passed") is not True:
                return set(), [], f"latest scorecard {rid} fails ({card_verdict(c)[1]})"
        graded = set().union(*[set(c.get("graded") or ()) for _, c in latest.values()])
        scopes = [dict(c.get("scope") or {}, card=rid) for rid, c in latest.values()]
        return graded, scopes, f"passing scorecard(s) {sorted(r for r, _ in latest.values())}"

    def registration(self, a: dict) -> tuple[bool, str]:
        if not a.get("study_hash"):
            return False, "the run executes no study"
        rec, why = self.verified_study(a["study_hash"])
        if rec is None:
            return False, why
        if not str(rec.get("frozen_at")) < str(a.get("created", "~")):
            return False, f"study {rec['study_id']} was frozen after the run"
        pins = rec.get("pins") or {}
        if not pins:
            return False, f"study {rec['study_id']} pins no observable, model or dataset"
        for k, v in pins.items():
            if a.get(k) != v:
                return False, f"run's {k} {str(a.get(k))[:12]} differs from the study's pin {str(v)[:12]}"
        return True, f"executes frozen study {rec['study_id']}"

    def _result(self, rid: str, a: dict) -> dict:
        outputs = [v for v in (a.get("gauge") or {})] or list(a.get("trust_by_variable") or {})
        bad = seal_error(a)
        if bad:                  # unsealed (older writer): fine if it claims nothing; edited: flagged
            verified = None if a.get("content_hash") is None else False
            return _verdict(a, "exploratory", {v: "exploratory" for v in outputs}, verified, f"run {rid}: {bad}")
        ok, why = identities_ok(a.get("identities"))
        if not ok:
            return _verdict(a, "exploratory", {v: "exploratory" for v in outputs}, None, f"run {rid}: {why}")
        graded, scopes, cal_why = self.calibration(a)
        reg_ok, reg_why = self.registration(a) if graded else (False, "")
        top = "registered" if reg_ok else "calibrated"
        by_var = {v: top if v in graded else "exploratory" for v in outputs}
        level = min(by_var.values(), key=_rank) if by_var else "exploratory"
        ungraded = sorted(v for v in outputs if v not in graded)
        reason = cal_why + (f"; {reg_why}" if reg_why else "") + \
            (f"; not graded by any card: {ungraded}" if graded and ungraded else "")
        return _verdict(a, level, by_var, None, reason, scopes)

    def _adjudication(self, rid: str, a: dict) -> dict:
        from .study_doc import COMPARATORS, predictions
        bad = seal_error(a)
        rec, why = self.verified_study(a.get("study_hash"))
        if bad or rec is None:
            return _verdict(a, "exploratory", {}, None, f"adjudication {rid}: {bad or why}")
        for p in predictions(rec["study"]):
            vals = (a.get("values") or {}).get(p["id"])
            if vals is None:
                return _verdict(a, "exploratory", {}, None, f"adjudication {rid}: no values for {p['id']}")
            holds = [v is not None and bool(COMPARATORS[p["comparator"]](v, p["threshold"])) for v in vals]
            want = "undetermined" if any(v is None for v in vals) else "confirmed" if all(holds) else "refuted"
            if (a.get("outcome") or {}).get(p["id"]) != want:
                return _verdict(a, "exploratory", {}, False, f"adjudication {rid}: stored outcome of {p['id']} "
                                f"is {(a.get('outcome') or {}).get(p['id'])!r}, its values give {want!r}")
        variables = sorted({p["metric"]["variable"] for p in predictions(rec["study"])})
        levels = [level_of(self.derive(r), variables) if r in self.docs else "exploratory"
                  for r in a.get("runs") or ()]
        low = min(levels, key=_rank) if levels else "exploratory"
        level = "adjudicated" if _rank(low) >= _rank("registered") else low
        return _verdict(a, level, {}, None, f"study {rec['study_id']} scored on runs {a.get('runs')} "
                        f"(lowest run trust {low})")


def level_of(verdict: dict, variables) -> str:
    """Lowest derived trust over ``variables`` of one run (its record level where it has no per-variable)."""
    by_var = verdict.get("trust_by_variable") or {}
    return min((by_var.get(v, verdict["trust"]) for v in variables), key=_rank, default=verdict["trust"])


def _verdict(a, level, by_var, verified, reason, scopes=()) -> dict:
    stored = a.get("trust")
    if verified is None:                       # result documents: the stored labels must match
        cached = a.get("trust_by_variable")
        stale = sorted(v for v in (cached or {}) if cached[v] != by_var.get(v, level)) if isinstance(cached, dict) \
            else []
        verified = (stored == level or (stored is None and level == "exploratory")) and not stale
        if not verified:
            reason = (f"stored trust {stored!r}" + (f" (variables {stale}: {[cached[v] for v in stale]})"
                                                    if stale else "")
                      + f" disagrees with the evidence ({level}" + (f"; {[by_var.get(v) for v in stale]}"
                                                                    if stale else "") + f"): {reason}")
    return {"trust": level, "trust_by_variable": by_var, "trust_verified": bool(verified),
            "trust_reason": reason, "trust_stored": stored, "trust_scope": list(scopes)}


def derive_all(docs: dict[str, dict]) -> dict[str, dict]:
    """Derived verdict of every document in ``docs`` (run id → attrs)."""
    ev = Evidence(docs)
    return {r: ev.derive(r) for r in docs}
