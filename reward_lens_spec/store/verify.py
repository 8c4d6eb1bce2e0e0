"""``reward-lens-spec store verify url=URL [run=ID]``: check every complete run's stored data.

Each run's arrays are read once and checked against the digests in its sealed run document
(``store.digest``; chunks also fail their ``crc32c`` checksum at decode), and the document's seal is
re-checked. One line per run: ``<run_id>  verified|no-digests|FAILED  <detail>``. Exit code 1 when
any run fails (the CLI's 2 stays for usage and store errors).
"""
from __future__ import annotations


def verify_lines(store, run_id: str | None = None) -> tuple[list[str], bool]:
    """``(one line per run, all ok)`` for every complete run of ``store`` (or just ``run_id``)."""
    ids = [run_id] if run_id else list(store.documents())
    lines, ok = [], True
    for rid in sorted(ids):
        r = store.verify(rid)
        ok &= r["ok"]
        lines.append(f"{rid}  {r['status']}  {r['detail']}")
    return lines, ok


def run_verify(store, kv: dict) -> int:
    lines, ok = verify_lines(store, kv.get("run") or None)
    print("\n".join(lines) if lines else f"no complete runs in {store.url}")
    return 0 if ok else 1
