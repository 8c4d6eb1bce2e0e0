"""Trust derived on read from a verified evidence chain: run → scorecards → frozen study.

Every trust-bearing store document (result run, scorecard, frozen study,
adjudication) is *sealed* when written (``trust.evidence.seal``: sha256 of the
canonical JSON of its attrs, without the store's own keys and the cached trust
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
* order is the store's evidence log (``store.log``), never a wall clock: each document's ``seq`` (sealed,
  with its ``created``) must be the one of a verified log entry carrying its content hash; a document the
  log does not order (absent, edited, its entry edited/removed/reordered, or — where the reader's trust
  file requires signers (``store.trust_root``) — not signed by a key it pins) lifts nothing: a run reads exploratory and unverified, such a
  card or study fails the gate it would pass;
* a **result run** is ``calibrated`` for each output variable a valid, passing,
  *latest* card (per organism kind and base, same observable content hash,
  model family and numerics: the card's organisms were graded in the run's ``dtype``) graded, provided every
  latest card is valid and passing and the run's own exactness identities hold (``identities_ok``), and — for
  an SAE attribution output — its SAE reconstructs this model's activations above the floor
  (``trust.sae_gate``); ``registered`` when
  additionally it executed a valid frozen study, logged before the run, whose
  pins (observable content hash, model fingerprint, dataset checksum) equal the
  run's. Ungraded variables stay ``exploratory``; the run's level is the lowest
  over its outputs. A run whose seal fails is ``exploratory``;
* an **adjudication** is ``adjudicated`` when its seal and its study verify, its
  outcomes follow from its stored values under the study's thresholds, the data digests it pinned
  (``scored``) equal each scored run's sealed ones (``pin_error``; the store reader also re-reads those
  arrays), each run lies between the study and the record in the log, and in
  every run it scored each variable the predictions read derives ``registered`` now;
* a **compare** record gets the lower derived level of its two runs.

Because the cards are looked up at read time, a later failing card downgrades
every run that relied on an earlier passing one. A stored label that differs
from the derived one is reported as ``trust_verified: false`` with
``trust_reason``. Reading changes nothing in the store.

Limits: without signatures (``store.signing``) a seal and the log are integrity checks — someone who
rewrites a document, recomputes its hash AND rewrites the log's tail is caught only where the verdict is
re-derived from the stored numbers (cards, adjudications) or by recomputation (``trust.recompute``).

No torch import: the store reader calls this.
"""
from __future__ import annotations

from ..levels import LEVELS
from .evidence import card_verdict, content_hash, identities_ok, numerics_of, seal_error
from .sae_gate import sae_caps              # SAE attribution: exploratory below the reconstruction floor
from .study_doc import COMPARATORS, predictions, study_hash


def _rank(level) -> int:
    return LEVELS.index(level) if level in LEVELS else 0


class Evidence:
    """Every complete document of one store, indexed for derivation (built once per read).

    ``log``: the store's verified evidence log (``store.log.LogView``); documents are ordered by their
    log ``seq``, and a document the log does not order (``unlogged``: absent, edited, its entry broken or,
    where signers are required, unsigned) lifts nothing. ``pending``: the id of a document about to be
    completed (``gates.derive_pending``), ordered as the log's next entry.
    """

    def __init__(self, docs: dict[str, dict], log=None, pending: str | None = None):
        self.docs, self.log = docs, log
        self.seq: dict[str, int] = {}
        self.unlogged: dict[str, str] = {}
        for rid, a in docs.items():
            if rid == pending:
                self.seq[rid] = log.next_seq if log is not None else 0
                continue
            s, why = log.order(rid, content_hash(a), a.get("seq")) if log is not None else \
                (None, "the store's evidence log was not read")
            if s is None:
                self.unlogged[rid] = why
            else:
                self.seq[rid] = s
        self.cards: dict[tuple, list[tuple[str, dict]]] = {}
        self.studies: dict[str, list[tuple[str, dict]]] = {}
        for rid, a in sorted(docs.items(), key=lambda kv: self.order_key(kv[0])):
            if a.get("kind") == "scorecard":
                self.cards.setdefault((a.get("observable_spec_hash"), a.get("model_family")), []).append((rid, a))
            elif a.get("kind") == "study":
                self.studies.setdefault(a.get("study_hash"), []).append((rid, a))
        self._memo: dict[str, dict] = {}

    def order_key(self, rid: str) -> tuple:
        """Sort key: log order, documents the log does not order last."""
        return (rid not in self.seq, self.seq.get(rid, 0), rid)

    def ordered(self, docs=None) -> list[dict]:
        """The attrs of ``docs`` (default: all), in log order."""
        return [self.docs[r] for r in sorted(docs if docs is not None else self.docs, key=self.order_key)]

    def before(self, a: str, b: str) -> bool:
        """True when the log orders document ``a`` before document ``b`` (both must be in it)."""
        return a in self.seq and b in self.seq and self.seq[a] < self.seq[b]

    def card_error(self, rid: str, a: dict) -> str | None:
        bad = seal_error(a)
        if bad:
            return f"scorecard {rid}: {bad}"
        ok, why = card_verdict(a)
        if ok != (a.get("passed") is True):
            return f"scorecard {rid}: stored passed={a.get('passed')} but its readings give {ok} ({why or 'pass'})"
        if rid in self.unlogged:
            return f"scorecard {rid}: {self.unlogged[rid]}"
        return None

    def study_error(self, rid: str, a: dict) -> str | None:
        bad = seal_error(a)
        if bad:
            return f"study {rid}: {bad}"
        if not isinstance(a.get("study"), dict) or study_hash(a["study"]) != a.get("study_hash"):
            return f"study {rid}: stored study does not hash to its study_hash (edited after freezing)"
        if rid in self.unlogged:
            return f"study {rid}: {self.unlogged[rid]}"
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
        dtype = numerics_of(a)
        latest: dict = {}
        other = set()
        for rid, c in self.cards.get(key, []):
            if numerics_of(c) != dtype:          # precision is part of the evidence: same dtype only
                other.add(numerics_of(c))
                continue
            latest[(c.get("organism"), c.get("base"))] = (rid, c)
        if not latest:
            return set(), [], (f"no scorecard for observable [{str(key[0])[:12]}] on family {key[1]!r} in {dtype}"
                               + (f" (cards calibrated in {', '.join(sorted(other))} do not lift a {dtype} run)"
                                  if other else ""))
        for rid, c in latest.values():
            bad = self.card_error(rid, c)
            if bad:
                return set(), [], bad
            if c.get("passed") is not True:
                return set(), [], f"latest scorecard {rid} fails ({card_verdict(c)[1]})"
        graded = set().union(*[set(c.get("graded") or ()) for _, c in latest.values()])
        scopes = [dict(c.get("scope") or {}, card=rid) for rid, c in latest.values()]
        return graded, scopes, f"passing scorecard(s) {sorted(r for r, _ in latest.values())}"

    def registration(self, rid: str, a: dict) -> tuple[bool, str]:
        if not a.get("study_hash"):
            return False, "the run executes no study"
        rec, why = self.verified_study(a["study_hash"])
        if rec is None:
            return False, why
        if not self.before(rec["run_id"], rid):                 # log order, never a wall clock
            return False, f"study {rec['study_id']} was frozen after the run (evidence log order)"
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
        if rid in self.unlogged:
            return _verdict(a, "exploratory", {v: "exploratory" for v in outputs}, False,
                            f"run {rid}: {self.unlogged[rid]}")
        ok, why = identities_ok(a.get("identities"))
        if not ok:
            return _verdict(a, "exploratory", {v: "exploratory" for v in outputs}, None, f"run {rid}: {why}")
        graded, scopes, cal_why = self.calibration(a)
        reg_ok, reg_why = self.registration(rid, a) if graded else (False, "")
        top = "registered" if reg_ok else "calibrated"
        caps = sae_caps(a)                        # an SAE that does not reconstruct this model: exploratory
        by_var = {v: top if v in graded and v not in caps else "exploratory" for v in outputs}
        level = min(by_var.values(), key=_rank) if by_var else "exploratory"
        ungraded = sorted(v for v in outputs if v not in graded)
        reason = cal_why + (f"; {reg_why}" if reg_why else "") + \
            (f"; not graded by any card: {ungraded}" if graded and ungraded else "") + \
            "".join(f"; {v} exploratory: {why}" for v, why in sorted(caps.items()))
        return _verdict(a, level, by_var, None, reason, scopes)

    def _adjudication(self, rid: str, a: dict) -> dict:
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
        void = self.pin_error(rid, a, rec)
        if void:
            return _verdict(a, "exploratory", {}, False, f"adjudication {rid} is void: {void}")
        variables = sorted({p["metric"]["variable"] for p in predictions(rec["study"])})
        levels = [level_of(self.derive(r), variables) if r in self.docs else "exploratory"
                  for r in a.get("runs") or ()]
        low = min(levels, key=_rank) if levels else "exploratory"
        level = "adjudicated" if _rank(low) >= _rank("registered") else low
        return _verdict(a, level, {}, None, f"study {rec['study_id']} scored on runs {a.get('runs')} "
                        f"(lowest run trust {low})")

    def pin_error(self, rid: str, a: dict, rec: dict) -> str | None:
        """Why adjudication ``a`` no longer holds for what it scored (None when it does): it must be in the
        log, pin the sealed data digests of every run it scored (``scored``: run id → that run's
        ``data_digests`` when it was read), those must equal each run's digests now, and each run must lie
        between the study and the record in log order. (The arrays themselves are re-checked against the
        digests by the store reader, ``Store.trust``.)"""
        if rid in self.unlogged:
            return self.unlogged[rid]
        scored, runs = a.get("scored"), list(a.get("runs") or ())
        if not isinstance(scored, dict) or sorted(scored) != sorted(runs):
            return "it pins no digests of the arrays it scored (written before pins existed, or edited)"
        for r in runs:
            doc = self.docs.get(r)
            if doc is None:
                return f"run {r} it scored is no longer in the store"
            if doc.get("data_digests") != scored[r]:
                return f"the data of run {r} changed since it was scored (sealed digests differ from the pinned ones)"
            if not (self.before(rec["run_id"], r) and self.before(r, rid)):
                return (f"run {r} is not ordered between study {rec['study_id']} and this record in the evidence "
                        f"log" + (f" ({self.unlogged[r]})" if r in self.unlogged else ""))
        return None


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


def derive_all(docs: dict[str, dict], log=None) -> dict[str, dict]:
    """Derived verdict of every document in ``docs`` (run id → attrs), ordered by ``log``."""
    ev = Evidence(docs, log)
    return {r: ev.derive(r) for r in docs}
