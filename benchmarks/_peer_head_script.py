"""Runs inside reward-lens 2.0.1's venv: its head patch grid, timed, with its token ids.

``PatchGrid(granularity="head")`` (its documented head grid; cells named ``head_L<l>_H<h>``), on
the model and pairs given as for ``_peer_script.py`` (whose ``_load`` and ``_timed`` it reuses).
Forwards are counted by a pre-hook on decoder layer 0. Its quantity is not ours: it patches the
chosen side with the rejected side's head outputs over positions ``[0, min(Tc, Tr))``; ours swaps
one head's o_proj input at the readout token only. The comparison is of cost on the same model,
pairs and token ids. Output JSON: ``tokens``, ``timings`` {"patch_head": [s...]}, ``forwards``,
``n_cells``, ``loadavg``, ``versions``. Exit 2 on its byte-tokenizer fallback.
"""
from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tok-folder")
    ap.add_argument("--export")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    import torch
    import reward_lens
    from reward_lens.measure.base import Context, run
    from reward_lens.measure.battery.patch import PatchGrid

    from _peer_script import _load, _timed
    if args.threads:
        torch.set_num_threads(args.threads)
    pairs = [json.loads(line) for line in open(args.pairs) if line.strip()]
    sig = _load(args)
    tok = sig.tokenizer
    chosen = [(p["prompt"], p["chosen"]) for p in pairs]
    rejected = [(p["prompt"], p["rejected"]) for p in pairs]
    out = {"versions": {"reward_lens": getattr(reward_lens, "__version__", "?"), "torch": torch.__version__},
           "tokens": [[sig.tokenize(c).input_ids, sig.tokenize(r).input_ids] for c, r in zip(chosen, rejected)],
           "loadavg": [round(os.getloadavg()[0], 1)], "timings": {}, "forwards": {}}
    if type(tok).__name__ == "_MinimalByteTokenizer":
        json.dump(out, open(args.out, "w"))
        return 2
    counter = [0]
    model = sig.runtime.model
    getattr(model, "model", model).layers[0].register_forward_pre_hook(lambda *a: counter.__setitem__(0, counter[0] + 1))
    view = [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs]
    res, times, fwd = _timed(lambda: run(PatchGrid(granularity="head"), Context(signal=sig, view=view)).value,
                             counter, args.repeats, warmup=False)
    out["timings"]["patch_head"], out["forwards"]["patch_head"] = times, fwd
    out["n_cells"] = len(res["component_names"])
    out["loadavg"].append(round(os.getloadavg()[0], 1))
    json.dump(out, open(args.out, "w"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
