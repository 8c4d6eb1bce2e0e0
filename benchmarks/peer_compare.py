"""Sections 2-3: our observables against reward-lens 2.0.1 on the same model, pairs and token ids,
and the numeric cross-check of the same run's numbers."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import peer_venv
from common import _time, encode, forwards, make_obs, med, run_obs, timed_cpu

HERE = Path(__file__).resolve().parent


PEER_JOBS = [("score both sides", "score", ["score"], None),
             ("lens + crystallization", "lens_crystallization", ["crystallization"], None),
             ("DLA", "dla", ["dla"], None),
             ("component patch grid", "patch_component", ["patch"], ["attn", "mlp"])]


def peer_rows(lm, pairs, fmt, repeats, batch_size, peer):
    """Time our observables on the same model and pairs; rows ``(name, ours s, fwd, peer s, fwd, note)``,
    plus the Dataset and context of the combined run (score + crystallization + DLA + patch), and the CPU
    rows ``(name, our CPU s, its CPU s)`` (process time per run)."""
    rows, cpu = [], []
    for label, key, inc, comps in PEER_JOBS:
        (ds, ctx), t, c = timed_cpu(lambda: run_obs(lm, pairs, make_obs(inc, comps), batch_size, fmt), repeats, lm)
        cpu.append((label, c, (peer.get("cpu") or {}).get(key, [])))
        pt = peer["timings"].get(key, [])
        rows.append((label, t, forwards(ctx), pt, (peer["forwards"].get(key) or ["–"])[0],
                     f"peer: {len(pt)} run(s)" if len(pt) < repeats else ""))
    (ds4, ctx4), t = _time(lambda: run_obs(lm, pairs, make_obs([j[2][0] for j in PEER_JOBS], ["attn", "mlp"]),
                                           batch_size, fmt), repeats, lm)
    pt = sum(med(peer["timings"].get(j[1], [])) for j in PEER_JOBS)
    pf = sum((peer["forwards"].get(j[1]) or [0])[0] for j in PEER_JOBS)
    rows.append(("**all four** (ours: one plan, one capture pass; its: sum of the four medians)", t, forwards(ctx4),
                 pt, pf, "target ≥ 3×"))
    return rows, ds4, ctx4, cpu


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


def run_peer(args, model: str, pairs_path: Path, out: Path, export: Path | None, tok: Path | None, slow=False,
             skip: str = ""):
    """Run ``_peer_script.py`` in the peer venv (``skip``: its comma list of instruments not to run); return its
    JSON or ``{"error": ...}``."""
    cmd = [str(peer_venv.vpython(args.peer_venv)), str(HERE / "_peer_script.py"), "--pairs", str(pairs_path),
           "--model", model, "--out", str(out), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    cmd += ["--tok-folder", str(tok)] if tok else []
    cmd += ["--export", str(export)] if export else []
    cmd += ["--slow", "--slow-repeats", str(args.slow_repeats)] if slow else []
    cmd += ["--skip", skip] if skip else []
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
    rows, ds4, ctx4, cpu = peer_rows(lm, pairs, fmt, args.repeats, args.batch_size, peer)
    tok["1-min load average (ours: start/end; reward-lens: start/end)"] = (
        f"{load0:.1f}/{os.getloadavg()[0]:.1f}; " + "/".join(str(x) for x in peer.get("loadavg", ["?", "?"])))
    if label.startswith("SmolLM2"):
        rows[3] = rows[3][:5] + ("; ".join(filter(None, [rows[3][5], "target ≥ 20×"])),)
    return {"label": label, "tokens": tok, "rows": rows, "cpu": cpu, "peer": peer,
            "check": cross_check(lm, ds4, ctx4, peer)}
