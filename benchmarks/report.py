"""The markdown report: machine facts, the tables of every section and the notes."""
from __future__ import annotations

import os
import platform
import sys

import numpy as np
from common import med


NOTES = [
    "Patch grids differ in what they compute: ours (`patch`, restricted here to attn + mlp × every layer, the "
    "same cells as its component grid) denoises at the readout token — the rejected sides' prefixes run once, "
    "batched, with a KV cache, and every site of every pair in a batch is patched in one forward of "
    "readout-token copies (layers below each copy's patch skipped); reward-lens "
    "noises the chosen side's forward on positions [0, min(Tc, Tr)), one single-item forward per component "
    "plus two scoring forwards and a capture per pair. The ratio compares each tool's cost for its grid, not "
    "identical numbers, so the patch effects are not cross-checked.",
    "Our DLA rows include `dla_heads` (per-head capture and projection), which its DLA does not compute.",
    "Forward passes: ours from `ctx.counts` (capture batches, a kept prefix batch counting two, + patched "
    "re-runs, one per batch of pairs); "
    "reward-lens' from a pre-hook on decoder layer 0 (one per batched forward).",
    "Capture overhead: bare forwards are pre-padded tensors (no padding or batching cost) fed the same ids, "
    "mask and position ids with `use_cache=False`; the capture pass includes batching, padding, hooks, host "
    "copies and the self-check.",
    "Scaling uses the model named in section 3 and the full `battery` observable (score, lens, "
    "crystallization, DLA + heads, patch, attribution patch, faithfulness). 'Peak RSS while computing' is "
    "VmHWM reset (`/proc/self/clear_refs`) after loading and an 8-pair warm-up, read after the timed runs; "
    "'process peak' is `getrusage` in the child (interpreter, torch, model and loading included).",
]


def machine_facts(args) -> dict:
    import torch
    import transformers
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"cpu": cpu, "cores (os.cpu_count)": os.cpu_count(), "usable cores": len(os.sched_getaffinity(0)),
            "torch threads": torch.get_num_threads(), "load average at start": os.getloadavg(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": args.device}


def _span(ts) -> str:
    """``median s (min–max)`` of a list of seconds; a bare number is printed as it is."""
    if not isinstance(ts, list):
        return f"{ts:.4g} s"
    return f"{med(ts):.4g} s" + (f" ({min(ts):.3g}–{max(ts):.3g})" if len(ts) > 1 else "")


def fmt_row(name, o_t, o_f, p_t, p_f, note=""):
    """One comparison row; ``o_t``/``p_t`` are lists of seconds (or a number: a sum of medians)."""
    m = lambda t: med(t) if isinstance(t, list) else t  # noqa: E731
    ratio = m(p_t) / m(o_t) if m(o_t) and m(p_t) == m(p_t) else float("nan")
    return f"| {name} | {_span(o_t)} | {o_f} | {_span(p_t)} | {p_f} | **{ratio:.1f}×** | {note} |"


def cpu_table(rows) -> list[str]:
    """Process CPU seconds per run (``time.process_time``: all threads; what a loaded machine does not inflate)
    of each single instrument, ours and the peer's, from the same runs as the wall-time table."""
    rows = [r for r in rows if r[1] and r[2]]
    if not rows:
        return []
    L = ["", "CPU time per run (process time, all threads; median of the same timed runs):", "",
         "| observable | ours (CPU s) | reward-lens (CPU s) | ours / its |", "|---|---|---|---|"]
    for name, o, p in rows:
        L.append(f"| {name} | {_span(o)} | {_span(p)} | **{med(o) / med(p):.2f}×** |")
    return L


def store_section(store_rows) -> list[str]:
    """§4: ``write_run`` / ``load`` (a group per variable) against one Dataset in one group, same run."""
    L = ["", "## 4. Store throughput (`write_run` / `open_store(...).load(..., lazy=False)`)", "",
         "The store's write (layout 4: one group per variable in the writer's attempt, published as one "
         "Dataset, root metadata consolidated) against the same Dataset in one group with "
         "plain xarray (layout 2's data write; no run document, lease or trust seal), timed side by side.", "",
         "| result | variables | size | write | read | one-group write | one-group read | write ratio | read ratio |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in store_rows:
        L.append(f"| {r['what']} | {r['variables']} | {r['mb']:.1f} MB | {r['write_mbs']:.0f} MB/s ({r['write_s']:.2f} s) | "
                 f"{r['read_mbs']:.0f} MB/s ({r['read_s']:.2f} s) | {r['one_write_s']:.2f} s | {r['one_read_s']:.2f} s | "
                 f"{r['write_s'] / r['one_write_s']:.2f}× | {r['read_s'] / r['one_read_s']:.2f}× |")
    return L


def render(args, facts, cap_rows, comps, scaling, store_rows, frames, notes, wall) -> str:
    cmd = "python benchmarks/run.py " + " ".join(sys.argv[1:])
    L = ["# reward_lens_spec benchmarks", "", f"Reproduce: `{cmd.strip()}` (from the repository root; "
         f"the peer venv is created on first use). Total wall time of this run: {wall:.0f} s.", "",
         "Machine: " + "; ".join(f"{k}: {v}" for k, v in facts.items()) + ".", "",
         f"Every time is the median of {args.repeats} timed runs after one warm-up, unless a row says otherwise; "
         "ratios are between numbers measured in this same run on this (shared, noisy) machine.", "",
         "## 1. Capture overhead (battery capture pass vs bare forward, same batches)", "",
         "| model | pairs | batches | bare forward | battery capture | ratio (target ≤ 1.15×) | extra per batch "
         "| sites |",
         "|---|---|---|---|---|---|---|---|"]
    for r in cap_rows:
        L.append(f"| {r['model']} | {r['pairs']} | {r['batches']} | {r['bare']:.4g} s | {r['capture']:.4g} s | "
                 f"**{r['ratio']:.3f}×** (median of {r['rounds']} per-round ratios: {r['ratio_med']:.3f}×) | "
                 f"{1e3 * (r['capture'] - r['bare']) / r['batches']:.2g} ms | {', '.join(r['sites'])} |")
    L += ["", "## 2. Against reward-lens 2.0.1 (same model, same pairs, same token ids)", ""]
    for c in comps:
        if "error" in c:
            L += [f"**{c['label']}: not measured** — {c['error']}", ""]
            continue
        p = c["peer"]
        L += [f"### {c['label']}", "", "Token check: " + "; ".join(f"{k}: {v}" for k, v in c["tokens"].items())
              + f". Peer: reward-lens {p['versions']['reward_lens']}, torch {p['versions']['torch']}, "
              f"transformers {p['versions']['transformers']}, tokenizer {p['tokenizer']['class']}, "
              f"{p['threads']} threads.", "",
              "| observable | ours | our fwd | reward-lens | its fwd | speed-up | note |",
              "|---|---|---|---|---|---|---|"]
        for r in c["rows"]:
            L.append(fmt_row(*r))
        L += cpu_table(c.get("cpu") or [])
        L += ["", "Numeric cross-check (same run):", "", "| check | value | expected |", "|---|---|---|"]
        for k, v, e in c["check"]:
            L.append(f"| {k} | {v} | {e} |")
        L.append("")
    model = next((s["model"] for s in scaling if "model" in s), "?")
    L += ["## 3. Scaling with the number of pairs (battery, fresh subprocess per size)", "",
          f"Model: `{model}` (" + ("a folder: the reward-lens tiny model saved above" if os.sep in str(model)
                                   else "built in") + ").", "",
          "| pairs | batch size | wall (median) | per pair | peak RSS while computing | RSS before compute "
          "| process peak RSS (getrusage) | forwards |",
          "|---|---|---|---|---|---|---|---|"]
    for s in scaling:
        if "error" in s:
            L.append(f"| {s['n']} | – | failed: {s['error']} | | | | | |")
            continue
        L.append(f"| {s['n']} | {s['batch_size']} | {s['wall']:.3g} s | {1e3 * s['wall'] / s['n']:.3g} ms | "
                 f"{s['compute_peak_mb']:.0f} MB | {s['rss_before_mb']:.0f} MB | {s['maxrss_mb']:.0f} MB | "
                 f"{s['forwards']} |")
    L += store_section(store_rows)
    f = frames
    L += ["", f"## 5. Whitened frame fit (`fit_whitened`, Ledoit–Wolf, d = {f['d']}, n = {f['n']} planted activations)",
          "", "| wall (median) | runs | process CPU (median) | stages, first run | target |", "|---|---|---|---|---|",
          f"| {f['wall']:.3g} s | {', '.join(f'{t:.3g}' for t in f['times'])} s | {f['cpu']:.3g} s | "
          + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in f["stages"][0].items())
          + f" | < 5 s: **{'met' if f['wall'] < 5 else 'missed'}** |", "",
          f"Fit check: variance along the 16 planted spike directions, fitted / planted: median "
          f"{float(np.median(f['spike_ratio'])):.3f} (min {float(f['spike_ratio'].min()):.3f}); shrinkage intensity "
          f"{f['rho']:.4f}; 1-min load average after the fit {f['load']:.2f}. Also: `python benchmarks/bench_frames.py`."]
    L += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(L) + "\n"
