"""One capture pass: both sides of every pair, batched by length, all sites at once.

Hooks slice the readout position inside the graph, so a capture keeps
``pair × side × layer × d_model`` floats per site, never the full sequences.
A self-check compares ``W·h + b`` (float32, from the captured final-norm output
``h``) with the model's own head output at the readout token and, where HF's
pad-id pooling picks the same token, with its pooled logits: on the first batch
at once (a wrong readout stops before the rest runs), then on all other rows in
one vectorized pass. A mismatch or a non-finite score stops the run
(``CaptureError``) naming the model and the pair ids; nothing is returned to be
stored.

Sites (TransformerLens vocabulary): ``resid_pre``/``resid_post`` (layer),
``attn_out``/``mlp_out`` (what each component adds to the residual stream),
``embed`` = ``resid_pre`` of layer 0 (stored with a layer axis of length 1); ``intervention`` = what the
model's ``resid_post`` interventions (``model.interventions``) add to each rewritten layer's output, one row per
such layer (``artifacts.resid_layers``; no row without them).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import CaptureError
from ..models.artifacts import resid_layers
from ..models.head import first_output, get_module
from ..models.padding import batches_by_length, pad_batch
from .prefix import run_prefix
from ..models.placement import input_device

LAYER_SITES = ("embed", "resid_pre", "resid_post", "attn_out", "mlp_out", "attn_z", "intervention")
SIDES = ("chosen", "rejected")
TOL = {"float32": 1e-4, "bfloat16": 6e-2, "float16": 1e-2}


@dataclass
class CaptureResult:
    """Activations at the readout token.

    ``h``: pair × side × d_model (final-norm output); ``logits``: pair × side ×
    objective (the model's own head output); ``sites[name]``: pair × side ×
    layer × d_model, float32. ``counts``: forward passes and tokens processed.
    """

    pair_ids: list[str]
    h: np.ndarray
    logits: np.ndarray
    lengths: np.ndarray
    sites: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    prefixes: dict = field(default_factory=dict)    # token ids (tuple) -> (index into prefix_batches, row)
    prefix_batches: list = field(default_factory=list)   # engine.prefix.PrefixBatch, for patching
    gate: np.ndarray | None = None     # context-gated heads (ArmoRM): gate weights, pair × side × objective


class _Recorder:
    """Hooks that copy ``out[row, readout[row]]`` of every site into one float32 buffer per site.

    ``start`` allocates ``buf[site]``: batch × layer × width on the model's device; each hook is
    one strided copy into its layer slot (a basic slice when every row reads out at the same
    column, as under left padding), so a batch costs one host transfer per site.
    """

    def __init__(self, lm, sites):
        self.handles, self.sel, self.active = [], None, True
        self.buf, self.slot, self._by_size = {}, {}, {}
        layers = get_module(lm.model, lm.family.layers)
        self.shape = {s: (_rows(lm, s), _width(lm, s)) for s in sites}
        self.shape.update(h=(1, lm.d_model), logits=(1, lm.head.n_outputs))
        if "embed" in sites:
            self._pre(layers[0], "embed", 0)
        for layer_idx, layer in enumerate(layers):
            if "resid_pre" in sites:
                self._pre(layer, "resid_pre", layer_idx)
            if "resid_post" in sites:
                self._post(layer, "resid_post", layer_idx)
            if "attn_out" in sites:
                self._post(get_module(layer, lm.family.attn), "attn_out", layer_idx)
            if "mlp_out" in sites:
                self._post(get_module(layer, lm.family.mlp), "mlp_out", layer_idx)
            if "attn_z" in sites:
                self._pre(get_module(layer, lm.family.o_proj), "attn_z", layer_idx)
        if "intervention" in sites:
            for k, layer_idx in enumerate(resid_layers(getattr(lm, "interventions", None))):
                self._write(layers[layer_idx], k)
        self._post(lm.norm.module, "h", 0)
        self._post(get_module(lm.model, lm.family.head), "logits", 0)
        if lm.head.context_gate:                     # ArmoRM: the gating MLP's output, one row per sequence
            self.shape["gate"] = (1, lm.head.n_objectives)
            def gate_hook(mod, args, out):
                if self.active:
                    self.slot[("gate", 0)].copy_(out)
            self.handles.append(lm.model.gating.register_forward_hook(gate_hook))

    def start(self, readout: torch.Tensor, T: int, device) -> None:
        """Begin a batch whose rows read out at ``readout`` (``LongTensor[B]``) of ``T`` columns.

        Buffers are reused across batches of the same size: ``finish`` hands out views of them,
        so a caller copies what it keeps before the next ``start``.
        """
        B = readout.shape[0]
        if bool((readout == T - 1).all()):
            self.sel = (slice(None), T - 1)
        else:
            self.sel = (torch.arange(B, device=device), readout.to(device))
        self._sel_at = {torch.device(device): self.sel}
        if B not in self._by_size:
            buf = {s: torch.empty((B, *shape), dtype=torch.float32, device=device) for s, shape in self.shape.items()}
            host = {s: b.numpy() for s, b in buf.items()} if buf["h"].device.type == "cpu" else None
            self._by_size[B] = buf, {(s, i): b[:, i] for s, b in buf.items() for i in range(b.shape[1])}, host
        self.buf, self.slot, self.host = self._by_size[B]

    def finish(self) -> dict[str, np.ndarray]:
        """The batch's buffers on the host: site -> batch × layer × width (on a CPU model, numpy views of
        the buffers made once per batch size: no per-batch conversion)."""
        return self.host if self.host is not None else {s: b.cpu().numpy() for s, b in self.buf.items()}

    def _at(self, x: torch.Tensor):
        """The batch's readout index on ``x``'s device (a model placed over devices, ``models.placement``: each
        module's output is sliced where it lives, then copied into the buffer)."""
        sel = self._sel_at.get(x.device)
        if sel is None:
            sel = self._sel_at[x.device] = tuple(s.to(x.device) if torch.is_tensor(s) else s for s in self.sel)
        return sel

    def _pre(self, module, site, layer):
        key = (site, layer)

        def hook(mod, args, kwargs):
            if self.active:
                x = args[0] if args else next(iter(kwargs.values()))
                self.slot[key].copy_(x[self._at(x)])
        self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def _post(self, module, site, layer):
        key = (site, layer)

        def hook(mod, args, out):
            if self.active:
                x = first_output(out)
                self.slot[key].copy_(x[self._at(x)])
        self.handles.append(module.register_forward_hook(hook))

    def _write(self, module, k):
        """Row ``k`` of ``intervention``: ``module``'s output after the interventions' hooks minus before them."""
        key = ("intervention", k)

        def before(mod, args, out):
            if self.active:
                x = first_output(out)
                self.slot[key].copy_(x[self._at(x)])

        def after(mod, args, out):
            if self.active:
                y, into = first_output(out), self.slot[key]
                into.copy_(y[self._at(y)].to(into) - into)
        self.handles.append(module.register_forward_hook(before, prepend=True))
        self.handles.append(module.register_forward_hook(after))

    def close(self):
        for h in self.handles:
            h.remove()


def _rows(lm, site: str) -> int:
    """The layer rows ``site`` keeps: 1 (``embed``), one per rewritten layer (``intervention``), else n_layers."""
    if site == "embed":
        return 1
    return len(resid_layers(getattr(lm, "interventions", None))) if site == "intervention" else lm.n_layers


def _width(lm, site: str) -> int:
    if site != "attn_z":
        return lm.d_model
    o = get_module(get_module(lm.model, lm.family.layers)[0], lm.family.o_proj)
    return int(o.weight.shape[0] if lm.family.o_proj_conv1d else o.weight.shape[1])


def hf_pooled_index(input_ids: torch.Tensor, pad_id: int | None) -> np.ndarray:
    """The token HF's sequence classifiers pool (rightmost token not equal to the pad id), per row."""
    ids = input_ids.cpu().numpy()
    if pad_id is None:
        return np.full(ids.shape[0], ids.shape[1] - 1)
    return (np.arange(ids.shape[1]) * (ids != pad_id)).argmax(-1)


@torch.inference_mode()
def capture(lm, encoded, sites=("resid_post",), *, batch_size: int = 16, max_tokens: int | None = None,
            padding_side: str = "left", readout_fn=None, progress: bool = False, keep_prefix=()) -> CaptureResult:
    """Run every distinct side of ``encoded`` (an ``EncodedPairs``) once; return a ``CaptureResult``.

    Identical token sequences (e.g. a pair whose chosen equals its rejected) run once and
    share their activations, so such a pair's margin is exactly 0 whatever the batching.

    ``sites``: subset of ``LAYER_SITES``. ``readout_fn(attention_mask) -> LongTensor[B]``
    overrides the readout (tests use it to prove the self-check fires).
    ``keep_prefix``: rows (2·pair + side) that activation patching will re-run. They run in their
    own length-sorted, left-padded batches as prefix (all tokens but the last, KV-cached, hooks
    off) then last token; each batch's prefix cache is kept (``prefix_batches``, located by
    ``prefixes``) so ``engine.patching.patch_readout`` need not recompute it (memory: one KV cache
    per kept row, so callers keep this list short).
    Raises ``CaptureError`` on a self-check mismatch or a non-finite score.
    """
    own = getattr(lm, "capture_pass", None)      # a kind with its own readout (kinds.implicit, kinds.ensemble)
    if own is not None:
        return own(encoded, sites, batch_size=batch_size, max_tokens=max_tokens, padding_side=padding_side)
    sites = tuple(s for s in LAYER_SITES if s in set(sites))
    seqs = [s for pair in zip(encoded.chosen, encoded.rejected) for s in pair]   # row 2i chosen, 2i+1 rejected
    n_pairs, d, K = len(encoded.pair_ids), lm.d_model, lm.head.n_outputs
    out = CaptureResult(pair_ids=list(encoded.pair_ids), h=np.zeros((n_pairs, 2, d), np.float32),
                        logits=np.zeros((n_pairs, 2, K), np.float32),
                        lengths=np.array([len(s) for s in seqs]).reshape(n_pairs, 2),
                        sites={s: np.zeros((n_pairs, 2, _rows(lm, s), _width(lm, s)), np.float32)
                               for s in sites},
                        counts={"forward_passes": 0, "tokens": 0, "padded_tokens": 0})
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.model.config.pad_token_id
    device = input_device(lm.model)
    rec = _Recorder(lm, sites)
    flat_h, flat_logits = out.h.reshape(2 * n_pairs, d), out.logits.reshape(2 * n_pairs, K)   # views
    flat = {s: a.reshape(2 * n_pairs, *a.shape[2:]) for s, a in out.sites.items()}
    hf_pad = lm.model.config.pad_token_id
    checked_rows, pooled, agree = [], [], []             # self-check inputs, per batch
    first: dict[tuple, int] = {}
    owners: dict[int, list[int]] = {}
    for r, sq in enumerate(seqs):                        # row -> first row with the same token ids
        owners.setdefault(first.setdefault(tuple(sq), r), []).append(r)
    keep = set() if readout_fn is not None or lm.head.context_gate else \
        {first[tuple(seqs[r])] for r in keep_prefix if len(seqs[r]) > 1}      # a context gate needs whole sequences
    if lm.head.context_gate:
        out.gate = np.zeros((n_pairs, 2, lm.head.n_objectives), np.float32)
    flat_gate = None if out.gate is None else out.gate.reshape(2 * n_pairs, -1)
    kept = [u for u in owners if u in keep]              # owners' keys are in ascending row order
    uniq = [u for u in owners if u not in keep]
    batches = [[rs[i] for i in b] for rs in (uniq, kept)
               for b in batches_by_length([len(seqs[u]) for u in rs], batch_size, max_tokens)]
    try:
        it = [(rows[0] in keep, rows) for rows in batches]
        if progress:             # imported here: tqdm.auto warns in a notebook without ipywidgets
            from tqdm.auto import tqdm
            it = tqdm(it, desc=f"capture {lm.name}", unit="batch")
        for kept_batch, rows in it:
            if kept_batch:
                ids, mask, res = _prefix_then_last(lm, rec, [seqs[r] for r in rows], device, out)
                last_attended = torch.zeros(len(rows), dtype=torch.long)   # one token: it is the readout
            else:
                ids, mask, pos, readout = pad_batch([seqs[r] for r in rows], pad_id, padding_side)
                last_attended = readout                      # from the mask (padding.pad_batch)
                if readout_fn is not None:
                    readout = readout_fn(mask)
                rec.start(readout, ids.shape[1], device)
                res = lm.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                               position_ids=pos.to(device), use_cache=False)
            got = rec.finish()
            h, head_out = got["h"][:, 0], got["logits"][:, 0]
            gate = got["gate"][:, 0] if "gate" in got else None
            checked_rows.extend(rows)
            pooled.append(res.logits.detach().float().cpu().numpy())
            agree.append(hf_pooled_index(ids, hf_pad) == last_attended.numpy())
            if len(pooled) == 1:                         # the first batch at once: a wrong readout stops early
                _self_check(lm, rows, out.pair_ids, h, head_out, pooled[0], agree[0], gate)
            dst = [o for r in rows for o in owners[r]]      # row = 2·pair + side; duplicates share a run
            src = None if len(dst) == len(rows) else np.array([j for j, r in enumerate(rows) for _ in owners[r]])
            dst = np.array(dst)                             # one index array for every site
            flat_h[dst] = h if src is None else h[src]
            flat_logits[dst] = head_out if src is None else head_out[src]
            if gate is not None:
                flat_gate[dst] = gate if src is None else gate[src]
            for site in sites:
                flat[site][dst] = got[site] if src is None else got[site][src]
            out.counts["forward_passes"] += 1
            out.counts["tokens"] += len(rows) if kept_batch else sum(len(seqs[r]) for r in rows)   # prefixes count themselves
            out.counts["padded_tokens"] += mask.numel()
        rest = np.array(checked_rows[len(agree[0]):], dtype=np.int64) if pooled else np.zeros(0, np.int64)
        if rest.size:                                    # every other batch, in one vectorized pass
            _self_check(lm, rest.tolist(), out.pair_ids, flat_h[rest], flat_logits[rest],
                        np.concatenate(pooled[1:]), np.concatenate(agree[1:]),
                        None if flat_gate is None else flat_gate[rest])
    finally:
        rec.close()
    return out


def _prefix_then_last(lm, rec, rows, device, out):
    """Run ``rows`` (token lists) as a kept prefix batch (hooks off), then their last tokens (hooks on)."""
    rec.active = False
    try:
        pb = run_prefix(lm, rows, device)
    finally:
        rec.active = True
    for j, ids in enumerate(rows):
        out.prefixes[tuple(ids)] = (len(out.prefix_batches), j)
    out.prefix_batches.append(pb)
    B = len(rows)
    rec.start(torch.zeros(B, dtype=torch.long), 1, device)
    last = torch.tensor([[ids[-1]] for ids in rows])
    mask = torch.cat([pb.mask, torch.ones((B, 1), dtype=pb.mask.dtype, device=pb.mask.device)], 1)
    res = lm.model(input_ids=last.to(device), attention_mask=mask, position_ids=torch.as_tensor(
        pb.lengths[:, None] - 1, device=device), cache=copy.deepcopy(pb.cache), use_cache=True)
    out.counts["forward_passes"] += 1                    # the prefix; the caller counts the last tokens
    out.counts["tokens"] += int(pb.lengths.sum()) - B
    out.counts["padded_tokens"] += int(pb.mask.numel())
    return last, torch.ones((B, 1), dtype=torch.long), res


def _self_check(lm, rows, pair_ids, h, head_out, pooled, agree, gate=None):
    """``rows``' captured ``h`` (rows × d_model) through the read-off head vs the model's own head
    output there and, where ``agree`` (HF pools the same token), its pooled logits. ``gate``: a
    context-gated head's captured gate weights (rows × objective)."""
    ours = lm.head.rewards(h, gate)
    finite = np.isfinite(ours).all(-1) & np.isfinite(head_out).all(-1)
    if not finite.all():
        raise CaptureError(f"{lm.name}: non-finite reward for {_names(pair_ids, rows, ~finite)} "
                           f"(dtype {lm.dtype}); nothing was stored. Fix: use model.dtype=float32 or bfloat16.")
    tol = TOL.get(lm.dtype, 1e-4)
    scale = 1.0 + np.abs(head_out)
    # Where HF's pad-id pooling lands on the last attended token (computed from the mask,
    # independently of the capture's readout), its pooled logits are a second reference.
    for what, ref, use in (("head output at the readout token", head_out, True),
                           ("the model's pooled logits", pooled, agree)):
        err = (np.abs(ours - ref) / scale).max(-1)
        wrong = use & (err > tol)
        if wrong.any():
            raise CaptureError(
                f"{lm.name}: self-check failed: W·h + b from captured h differs from {what} "
                f"(max rel. error {err[wrong].max():.3g} > {tol}) for {_names(pair_ids, rows, wrong)}. "
                "The readout position or the head read-off is wrong; nothing was stored.")


def _names(pair_ids, rows, which) -> list[str]:
    return [f"{pair_ids[r // 2]}/{SIDES[r % 2]}" for r, w in zip(rows, which) if w]
