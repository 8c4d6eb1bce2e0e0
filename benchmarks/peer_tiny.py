"""Section 2's tiny-model comparison alone (reward-lens 2.0.1's toy model, 64 pairs), printed as markdown:
``python benchmarks/peer_tiny.py [--repeats 5] [--rounds 1] [--only score,dla] [--work /tmp/rl_bench]``.

The same functions ``benchmarks/run.py`` calls (``peer_compare.run_peer`` / ``compare``, ``report.fmt_row`` /
``cpu_table``), one thread on both sides, wall and process CPU time per instrument; for checking the per-run fixed
cost (issue 39 item 6) in a minute or two without the rest of the benchmarks.

``--rounds K`` (K > 1) interleaves the two sides K times — the peer's process (its warm-up, then ``--repeats``
timed runs), then ours in this process (a warm-up, then ``--repeats`` runs) — so a drift of the machine's speed
lands on both sides alike, and prints per instrument both sides' medians over every pooled run, the ratio of
those medians, each round's ratio and the number of rounds ours was under the peer (one run of five repeats
cannot resolve a few per cent: both sides' medians move by up to half between runs, results.md §35).
Prints only: the dated figures go into ``benchmarks/results.md`` by hand. Raises ``SystemExit`` with the peer's
error when its venv or run fails.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_venv  # noqa: E402
from common import diagnostic_pairs, load_folder, make_obs, med, run_obs, timed_cpu, write_jsonl  # noqa: E402
from peer_compare import PEER_JOBS, compare, run_peer  # noqa: E402
from report import cpu_table, fmt_row  # noqa: E402


def _peer(args, pp, tok, skip):
    peer = run_peer(args, "tiny", pp, args.work / "peer_tiny.json", args.work / "rl_tiny", tok, skip=skip)
    if "error" in peer:
        raise SystemExit(f"peer: {peer['error']}")
    return peer


def interleaved(args, pp, tok, pairs) -> list[str]:
    """``--rounds`` alternations of the peer's timed runs and ours; the markdown lines of the pooled table."""
    jobs = [j for j in PEER_JOBS if j[1] in args.only]
    skip = ",".join(j[1] for j in PEER_JOBS if j[1] not in args.only)
    ours, theirs = {j[1]: [] for j in jobs}, {j[1]: [] for j in jobs}
    per_round, lm = {j[1]: [] for j in jobs}, None
    for k in range(args.rounds):
        peer = _peer(args, pp, tok, skip)
        lm = lm or load_folder("rl_tiny", args.work / "rl_tiny", "cpu", attn="eager")
        for label, key, inc, comps in jobs:
            _, _, c = timed_cpu(lambda: run_obs(lm, pairs, make_obs(inc, comps), args.batch_size, "plain"),
                                args.repeats, lm)
            p = peer["cpu"][key]
            ours[key] += c
            theirs[key] += p
            per_round[key].append(med(c) / med(p))
        print(f"round {k + 1}/{args.rounds}: " + ", ".join(f"{key} {per_round[key][-1]:.2f}×" for key in ours),
              flush=True)
    lines = [f"{args.rounds} rounds × {args.repeats} timed runs a side (process CPU s, every thread; medians of "
             "the pooled runs):", "",
             "| instrument | ours | reward-lens | ours / its | rounds ours < its | each round's ratio |",
             "|---|---:|---:|---:|---:|---|"]
    for label, key, _, _ in jobs:
        r = per_round[key]
        lines.append(f"| {label} | {med(ours[key]):.4f} | {med(theirs[key]):.4f} | "
                     f"**{med(ours[key]) / med(theirs[key]):.2f}×** | {sum(x < 1 for x in r)} / {len(r)} | "
                     + ", ".join(f"{x:.2f}" for x in r) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="> 1: interleave the two sides this many times")
    ap.add_argument("--only", default=",".join(j[1] for j in PEER_JOBS),
                    help="with --rounds: comma list of " + ", ".join(j[1] for j in PEER_JOBS))
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--work", type=Path, default=Path("/tmp/rl_bench"))
    ap.add_argument("--peer-venv", type=Path, default=peer_venv.DEFAULT_VENV)
    args = ap.parse_args(argv)
    args.only = set(filter(None, args.only.split(",")))
    if not args.only <= {j[1] for j in PEER_JOBS}:
        raise SystemExit(f"--only: unknown {sorted(args.only - {j[1] for j in PEER_JOBS})}; "
                         f"use {', '.join(j[1] for j in PEER_JOBS)}")
    import torch
    torch.set_num_threads(1)
    args.threads, args.slow_repeats, args.batch_size = 1, 1, 16
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    peer_venv.ensure(args.peer_venv, smollm2=False)
    tok = peer_venv.tokenizer_folder(args.peer_venv, args.work / "gpt2_tok")
    pairs = diagnostic_pairs(args.pairs)
    pp = write_jsonl(pairs, args.work / f"pairs_{args.pairs}.jsonl")
    if args.rounds > 1:
        lines = interleaved(args, pp, tok, pairs)
    else:
        peer = _peer(args, pp, tok, "")
        lm = load_folder("rl_tiny", args.work / "rl_tiny", "cpu", attn="eager")
        c = compare(args, lm, pairs, peer, f"reward-lens tiny, {args.pairs} pairs", "plain")
        lines = ["Token check: " + "; ".join(f"{k}: {v}" for k, v in c["tokens"].items()), "",
                 "| observable | ours | our fwd | reward-lens | its fwd | speed-up | note |",
                 "|---|---|---|---|---|---|---|"]
        lines += [fmt_row(*r) for r in c["rows"]] + cpu_table(c["cpu"])
        lines += ["", "| check | value | expected |", "|---|---|---|"] + [f"| {k} | {v} | {e} |"
                                                                        for k, v, e in c["check"]]
    print("\n".join(lines) + f"\n\nwall of this run: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
