"""``reward-lens-spec store verify url=URL [run=ID] [recompute=K]`` and the signer commands
``store keygen out=PATH`` / ``store keys url=URL [add=PATH.pub] [name=LABEL] [require=true|false]``.

verify: first the reader's signer policy and where it came from (``signer-policy  ...``: the trust
file named by ``REWARD_LENS_SPEC_TRUST_FILE`` / ``trust_file=``, ``store.trust_root``), then each run's
arrays are read once and checked against the digests in its sealed run document (``store.digest``;
chunks also fail their ``crc32c`` checksum at decode), the document's seal is re-checked, and the store's
evidence log (``store.log``) must verify and order every sealed document (where the reader's policy
requires signers, by a signature of a key its trust file pins). One line per run: ``<run_id>  verified|no-digests|FAILED
<detail>``; a broken log adds an ``evidence-log  FAILED`` line. ``recompute=K`` (``--recompute K``) adds a
``recompute`` line per run: K sampled pairs re-executed through the one executor, and every scorecard's
organism check graded again (``trust.recompute``). Exit code 1 when anything fails (the CLI's 2 stays for
usage and store errors).
"""
from __future__ import annotations

import os

from reward_lens_spec.errors import StoreError
from reward_lens_spec.trust.evidence import NOT_RESULTS
from reward_lens_spec.store.signing import ENV_KEY, generate, read_public
from reward_lens_spec.store._backend import store_handle
from reward_lens_spec.store.keys import add_key, set_require_signers, trusted_keys
from reward_lens_spec.store.trust_root import ENV_TRUST, policy


# observables computed from other stored runs (compare/runs.py, compare/drift.py): no model to re-execute
DERIVED = ("compare", "drift")


def verify_lines(store, run_id: str | None = None, *, recompute: int = 0,
                 base_dir: str | None = None) -> tuple[list[str], bool]:
    """``(lines, all ok)`` for every complete run of ``store`` (or just ``run_id``)."""
    ev = store.evidence()
    ids = [run_id] if run_id else sorted(ev.docs, key=ev.order_key)
    lines, ok = [], True
    if ev.log is not None and ev.log.policy is not None:
        lines.append(f"signer-policy  {ev.log.policy.source}")
    if ev.log is not None and ev.log.error:
        lines.append(f"evidence-log  FAILED  {ev.log.error}: every document from there on is unordered")
        ok = False
    if not ids:
        lines.append(f"no complete runs in {store.url}")
    for rid in ids:
        r = store.verify(rid)
        doc = ev.docs.get(rid) or store.document(rid)
        if r["ok"] and rid in ev.unlogged and (doc.get("content_hash") or "seq" in doc):
            r = {**r, "ok": False, "status": "FAILED", "detail": f"evidence log: {ev.unlogged[rid]}"}
        elif r["ok"] and rid in ev.seq:
            r = {**r, "detail": f"{r['detail']}; log entry {ev.seq[rid]}"}
        ok &= r["ok"]
        lines.append(f"{rid}  {r['status']}  {r['detail']}")
        kind = doc.get("kind")
        if recompute and r["ok"] and (kind == "scorecard" or kind not in NOT_RESULTS
                                      and doc.get("observable") not in DERIVED):
            from reward_lens_spec.trust.recompute import recompute_card, recompute_run

            good, detail = recompute_card(store, rid) if kind == "scorecard" else \
                recompute_run(store, rid, recompute, base_dir=base_dir or os.getcwd())
            ok &= good is not False
            lines.append(f"{rid}  recompute  {'skipped' if good is None else 'ok' if good else 'FAILED'}  {detail}")
    return lines, ok


def run_verify(store, kv: dict) -> int:
    try:
        k = int(kv.get("recompute") or 0)
    except ValueError:
        raise StoreError(f"store verify: recompute={kv['recompute']!r} is not a number of pairs.") from None
    lines, ok = verify_lines(store, kv.get("run") or None, recompute=k)
    print("\n".join(lines))
    return 0 if ok else 1


def run_keys(cmd: str, kv: dict, storage_options=None) -> int:
    """``keygen`` and ``keys`` (see the module doc and ``store.signing``)."""
    from reward_lens_spec.store.layout import check_layout
    if cmd == "keygen":
        if not kv.get("out"):
            raise StoreError("store keygen: missing out=PATH (where to write the private key).")
        kid, pub = generate(kv["out"])
        print(f"key {kid}: private {kv['out']} (keep it secret), public {kv['out']}.pub\n"
              f"trust it: add the line `NAME STORE-PATTERN ed25519:{pub}` to the readers' lab trust file "
              f"({ENV_TRUST}); sign with it: export {ENV_KEY}={kv['out']}")
        return 0
    b = store_handle(kv["url"], storage_options)
    check_layout(b)
    if kv.get("add"):
        pub = read_public(kv["add"])
        print(f"key {add_key(b, pub, kv.get('name', ''))} listed in {b.url} (a list, not trust: readers trust it "
              f"once their trust file pins it, e.g. the line `{kv.get('name') or 'NAME'} {b.url} ed25519:{pub}`)")
    if kv.get("require") is not None:
        value = str(kv["require"]).lower()
        if value not in ("true", "false"):
            raise StoreError(f"store keys: require={kv['require']!r}; expected true or false.")
        set_require_signers(b, value == "true")
    keys, pol = trusted_keys(b), policy(b)
    for kid, k in sorted(keys.items()):
        print(f"{kid}  {k['name'] or '-'}  {k['public_key']}  {'pinned' if kid in pol.keys else 'not pinned'}")
    print(f"{len(keys)} listed key(s), {len(pol.keys)} trusted; signers "
          f"{'required' if pol.required else 'not required'} ({pol.source})")
    return 0
