"""Section 2's tiny-model comparison alone (reward-lens 2.0.1's toy model, 64 pairs), printed as markdown:
``python benchmarks/peer_tiny.py [--repeats 5] [--work /tmp/rl_bench]``.

The same functions ``benchmarks/run.py`` calls (``peer_compare.run_peer`` / ``compare``, ``report.fmt_row`` /
``cpu_table``), one thread on both sides, wall and process CPU time per instrument; for checking the per-run fixed
cost (issue 39 item 6) in a minute or two without the rest of the benchmarks. Prints only: the dated figures go
into ``benchmarks/results.md`` by hand. Raises ``SystemExit`` with the peer's error when its venv or run fails.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_venv  # noqa: E402
from common import diagnostic_pairs, load_folder, write_jsonl  # noqa: E402
from peer_compare import compare, run_peer  # noqa: E402
from report import cpu_table, fmt_row  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rl_bench"))
    ap.add_argument("--peer-venv", type=Path, default=peer_venv.DEFAULT_VENV)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    args.threads, args.slow_repeats, args.batch_size = 1, 1, 16
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    peer_venv.ensure(args.peer_venv, smollm2=False)
    tok = peer_venv.tokenizer_folder(args.peer_venv, args.work / "gpt2_tok")
    pairs = diagnostic_pairs(args.pairs)
    pp = write_jsonl(pairs, args.work / f"pairs_{args.pairs}.jsonl")
    peer = run_peer(args, "tiny", pp, args.work / "peer_tiny.json", args.work / "rl_tiny", tok)
    if "error" in peer:
        raise SystemExit(f"peer: {peer['error']}")
    lm = load_folder("rl_tiny", args.work / "rl_tiny", "cpu", attn="eager")
    c = compare(args, lm, pairs, peer, f"reward-lens tiny, {args.pairs} pairs", "plain")
    lines = ["Token check: " + "; ".join(f"{k}: {v}" for k, v in c["tokens"].items()), "",
             "| observable | ours | our fwd | reward-lens | its fwd | speed-up | note |", "|---|---|---|---|---|---|---|"]
    lines += [fmt_row(*r) for r in c["rows"]] + cpu_table(c["cpu"])
    lines += ["", "| check | value | expected |", "|---|---|---|"] + [f"| {k} | {v} | {e} |" for k, v, e in c["check"]]
    print("\n".join(lines) + f"\n\nwall of this run: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
