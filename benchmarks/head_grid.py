"""Head patch grid: ours (``patch_heads``, exact, readout token) against reward-lens 2.0.1's
``PatchGrid(granularity="head")`` on the same model, pairs and token ids (issue 19's target:
SmolLM2-135M, 16 pairs, ≥ 20× faster; its time on this machine kind was 730 s, 4,368 forwards).

    python benchmarks/head_grid.py --model tiny               # built-in tiny, ours only (seconds)
    python benchmarks/head_grid.py --model smollm2 [--peer]   # SmolLM2-135M seed-0 head, 16 pairs

``--peer`` runs ``_peer_head_script.py`` in the venv ``peer_venv.py`` builds (``--peer-venv``),
one run, no warm-up (it takes minutes); ours is the median of ``--repeats`` runs after a warm-up.
Prints one markdown table: seconds, forward passes, head cells, the ratio and whether the token ids
are identical on both sides. The two grids compute different quantities (see the peer script).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import (_time, builtin_or_1b, diagnostic_pairs, encode, forwards, load_folder, med,  # noqa: E402
                    run_obs, smollm2_seed0, write_jsonl)


def ours(lm, pairs, fmt, repeats, batch_size):
    from reward_lens_spec.spec import ObservableSpec
    obs = ObservableSpec(name="head_grid", steps=[{"name": "patch_effect", "op": "patch_heads"}],
                         outputs=["patch_effect"])
    (ds, ctx), times = _time(lambda: run_obs(lm, pairs, obs, batch_size, fmt), repeats, lm)
    return times, forwards(ctx), int(ds["patch_effect"].sizes["layer"] * ds["patch_effect"].sizes["head"])


def peer(args, model: str, pairs_path: Path, tok):
    import peer_venv
    peer_venv.ensure(args.peer_venv, smollm2=False)
    out = args.work / "peer_head_grid.json"
    cmd = [str(peer_venv.vpython(args.peer_venv)), str(HERE / "_peer_head_script.py"), "--pairs", str(pairs_path),
           "--model", model, "--out", str(out), "--threads", str(args.threads)]
    cmd += ["--tok-folder", str(tok)] if tok else []
    r = subprocess.run(cmd, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
                       capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        return {"error": f"peer script exit {r.returncode}: {r.stderr.strip().splitlines()[-3:]}"}
    return json.loads(out.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--peer-venv", type=Path, default=Path("/tmp/rl_peer_venv"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/rl_bench"))
    args = ap.parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    args.work.mkdir(parents=True, exist_ok=True)
    pairs = diagnostic_pairs(args.pairs)
    if args.model == "smollm2":
        folder = smollm2_seed0(args.work / "smollm2_seed0")
        lm, fmt, peer_model = load_folder("smollm2_seed0", folder, "cpu"), "chat_template", str(folder)
    else:
        lm, fmt, peer_model = builtin_or_1b("tiny", "cpu"), "plain", None
    times, fwd, cells = ours(lm, pairs, fmt, args.repeats, args.batch_size)
    rows = [f"| ours `patch_heads` | {med(times):.2f} | {fwd} | {cells} |"]
    same = "–"
    if args.peer and peer_model is None:
        rows.append("| reward-lens | not run: `--peer` compares on `--model smollm2` (its tiny model is not ours) | | |")
    elif args.peer:
        p = peer(args, peer_model, write_jsonl(pairs, args.work / f"pairs_{args.pairs}.jsonl"), None)
        if "error" in p:
            rows.append(f"| reward-lens | {p['error']} | | |")
        else:
            enc = encode(lm, pairs, fmt)
            same = all(list(c) == t[0] and list(r) == t[1] for c, r, t in zip(enc.chosen, enc.rejected, p["tokens"]))
            pt = med(p["timings"]["patch_head"])
            rows.append(f"| reward-lens 2.0.1 `PatchGrid(granularity=\"head\")` | {pt:.1f} | "
                        f"{p['forwards']['patch_head'][0]} | {p['n_cells']} |")
            rows.append(f"| **ratio** (its / ours) | **{pt / med(times):.1f}×** (target ≥ 20×) | | |")
    print(f"head patch grid, {lm.name}, {len(pairs)} pairs, torch threads {args.threads}, "
          f"load {os.getloadavg()[0]:.1f}; identical token ids: {same}\n")
    print("| grid | wall s (median) | forward passes | head cells |\n|---|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
