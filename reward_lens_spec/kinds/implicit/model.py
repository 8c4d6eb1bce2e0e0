"""DPO-implicit rewards (``model.kind=implicit``): the reward a policy's log-probabilities imply.

    r(x, y) = β · Σ_t [log π(y_t | x, y_<t) − log π_ref(y_t | x, y_<t)]       (Rafailov et al. 2023, DPO, eq. 5)

over the response tokens ``t`` (from the first response token, ``engine.per_token.response_starts``, to
the side's last token). ``model.implicit.reference: null`` drops the reference term (reference-free, as
RewardBench scores DPO models without one); ``length_normalize: true`` takes the mean over response tokens
instead of the sum (SimPO, Meng et al. 2024). β, the reference and the normalization are in the run id
(``run.identity.numerics``) and the model fingerprint.

Per-token reward ``β·(log π − log π_ref)`` (divided by the response length when normalized), float64, pair ×
side × position (position 0 = the first response token; NaN past a side's response): its sum over positions
is the reward, by construction and checked by ``tests/test_implicit.py`` against a plain forward.

``ImplicitModel`` stands where the executor expects a ``LoadedModel``: ``model`` is a module holding the policy
(and reference) so the fingerprint covers both, ``family``/``norm`` are the policy's, and ``head`` is a NaN
placeholder (the readout is not linear: instruments that need ``w_r`` are refused at plan time,
``kinds``). Its ``capture_pass`` replaces the readout capture: rewards go to ``logits`` (pair × side × 1,
the run's identities compare outputs named reward/margin with them); the per-token log-probabilities and,
when asked (site ``implicit_lens``), the lens per layer go to ``CaptureResult.sites``.

Lens (approximate: the readout is nonlinear): at layer ℓ the policy's log-probabilities are replaced by
``log_softmax(U · N(x_ℓ))`` (``N`` its final norm, ``U`` its unembedding, Gemma-2's logit soft-cap applied),
the reference term kept whole; the last layer gives the reward (up to float rounding: the final norm
is re-applied to the captured residual).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from ...errors import SpecError
from .settings import KindConfig, check_implicit
from ...engine.capture import CaptureResult
from ...models.door import nested
from ...models.formatting import EncodedPairs
from ...models.head import first_output, read_final_norm
from ...models.padding import batches_by_length, pad_batch
from ...models.readout import ReadoutHead
from ...models.causal import load_causal
from ...models.fingerprint import config_dict, tokenizer_dict
from ...engine.per_token import response_starts

LENS_SITE = "implicit_lens"


@dataclass(frozen=True)
class ResponseEncoded(EncodedPairs):
    """``EncodedPairs`` plus each side's first response token (``starts[i] = (chosen, rejected)``)."""

    starts: list = field(default_factory=list)
    pair_aligned = ("starts",)


@dataclass
class ImplicitModel:
    name: str
    policy: object                 # models.causal.CausalLM
    reference: object | None
    beta: float
    length_normalize: bool
    model: torch.nn.Module         # ModuleDict(policy[, reference]): what the fingerprint hashes
    tokenizer: object
    family: object
    norm: object
    head: ReadoutHead
    dtype: str
    device: str
    kind: str = "implicit"

    @property
    def n_layers(self) -> int:
        return self.policy.n_layers

    @property
    def d_model(self) -> int:
        return int(self.head.W.shape[1])

    @property
    def signal(self):
        return self                  # kinds reads ``lm.signal.kind``

    def capture_pass(self, encoded, sites=(), *, batch_size=16, max_tokens=None, padding_side="left", **_):
        return implicit_capture(self, encoded, sites, batch_size=batch_size, max_tokens=max_tokens,
                                padding_side=padding_side)


def with_response_starts(enc, lm, spec, pairs):
    """``enc`` with every side's first response token (``ResponseEncoded``; ``engine.per_token.response_starts``,
    from ``lm.tokenizer`` and the pairs' prompts). The kind's ``encode`` (``kinds``)."""
    starts = response_starts(lm.tokenizer, pairs, enc) if enc.pair_ids else np.zeros((0, 2), np.int64)
    return ResponseEncoded(**{f.name: getattr(enc, f.name) for f in fields(EncodedPairs)},
                           starts=[tuple(int(v) for v in row) for row in starts])


def load_implicit(spec, base_dir=None) -> ImplicitModel:
    """Policy (``model.source`` …) and reference (``model.implicit.reference``) as one ``ImplicitModel``.

    Raises ``SpecError``: ``model.implicit.reference`` when the two tokenizers differ (the log-ratio compares
    the same tokens), and the loaders' errors."""
    check_implicit(spec)
    policy = load_causal(spec, base_dir)
    ref = None
    if spec.implicit.reference is not None:
        rspec = nested(spec, spec.implicit.reference, "model.implicit.reference", base_dir)
        rspec.device, rspec.dtype, rspec.padding_side = spec.device, spec.dtype, spec.padding_side
        ref = load_causal(rspec, base_dir)
        if tokenizer_dict(ref.tokenizer) != tokenizer_dict(policy.tokenizer):
            raise SpecError("model.implicit.reference", f"the reference '{rspec.name}' has another tokenizer than "
                            f"the policy '{spec.name}'; the log-ratio compares log-probabilities of the same tokens.",
                            fix="use the policy's own reference (the model it was trained from).")
    return make_implicit(spec.name, policy, ref, beta=float(spec.implicit.beta),
                         length_normalize=bool(spec.implicit.length_normalize),
                         dtype=str(getattr(spec.dtype, "value", spec.dtype)))


def make_implicit(name: str, policy, reference=None, *, beta: float = 0.1, length_normalize: bool = False,
                  dtype: str = "float32") -> ImplicitModel:
    """Bundle in-memory causal LMs (``models.causal.CausalLM``: policy, reference or None) as an ``ImplicitModel``
    (``load_implicit``; tests and organisms build them in code)."""
    mods = {"policy": policy.model} | ({"reference": reference.model} if reference is not None else {})
    container = torch.nn.ModuleDict(mods)
    container.config = KindConfig({"kind": "implicit", "beta": float(beta), "length_normalize": bool(length_normalize),
                                    "reference_free": reference is None, "policy": config_dict(policy.model),
                                    "reference": None if reference is None else config_dict(reference.model)})
    d = int(policy.model.config.hidden_size)
    head = ReadoutHead(W=np.full((1, d), np.nan, np.float32), b=np.full(1, np.nan, np.float32),
                       objectives=("reward",))
    dev = str(next(policy.model.parameters()).device)
    return ImplicitModel(name=name, policy=policy, reference=reference, beta=float(beta),
                         length_normalize=bool(length_normalize), model=container, tokenizer=policy.tokenizer,
                         family=policy.family, norm=read_final_norm(policy.model, policy.family), head=head,
                         dtype=dtype, device=dev)


def token_logprobs(lm, ids, mask, pos, cols, toks) -> torch.Tensor:
    """``log π(toks | prefix)`` of causal LM ``lm`` (``models.causal.CausalLM``): run the batch, read the logits
    at ``cols - 1`` (the token before each scored one). ``cols``/``toks``: (rows, n) long, rows of the batch."""
    out = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None]
    logp = torch.log_softmax(out.logits[rows, cols - 1].double(), -1)
    return logp.gather(-1, toks[..., None])[..., 0]


def scored_positions(seqs, starts, rows, T, padding_side, dev):
    """Columns and tokens of every row's response (padded with its last column; ``valid`` marks real ones)."""
    P = max(len(seqs[r]) - starts[r] for r in rows)
    cols = np.zeros((len(rows), P), np.int64)
    valid = np.zeros((len(rows), P), bool)
    for j, r in enumerate(rows):
        first = T - len(seqs[r]) if padding_side == "left" else 0
        c = first + np.arange(starts[r], len(seqs[r]))
        cols[j, :len(c)], cols[j, len(c):], valid[j, :len(c)] = c, c[-1], True
    return torch.as_tensor(cols, device=dev), valid


@torch.no_grad()
def implicit_capture(lm: ImplicitModel, encoded, sites=(), *, batch_size=16, max_tokens=None, padding_side="left"):
    """Per-token log-probabilities of policy and reference, the implicit rewards, the readout ``h`` and (site
    ``implicit_lens``) the lens per layer; see the module doc. Returns a ``CaptureResult`` whose ``sites`` hold
    ``policy_logp``/``reference_logp`` (pair × side × position, nats) and ``implicit_lens`` (pair × side × layer ×
    position: β-scaled per-token rewards with the policy read at each layer, layer −1 = the embedding)."""
    seqs = [s for pair in zip(encoded.chosen, encoded.rejected) for s in pair]
    starts = [max(1, int(s)) for row in encoded.starts for s in row]      # the first token has no context
    n, L = len(encoded.pair_ids), lm.n_layers
    # width model.max_length: every chunk of a run has one shape, and Σ over it is the reward bit for bit
    P = max([int(encoded.max_length)] + [len(s) - st for s, st in zip(seqs, starts)])
    pol = np.full((2 * n, P), np.nan)
    ref = np.full((2 * n, P), np.nan) if lm.reference is not None else None
    lens = np.full((2 * n, L + 1, P), np.nan) if LENS_SITE in set(sites) else None
    h = np.zeros((2 * n, lm.d_model), np.float32)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    dev = next(lm.policy.model.parameters()).device
    layers = lm.policy.layers
    norm_copy = copy.deepcopy(lm.policy.final_norm)
    got: dict = {}

    def keep(key, pre=False):
        def hook(mod, args, *rest):
            got[key] = (args[0] if args else next(iter(rest[0].values()))) if pre else first_output(rest[0])
        return hook
    handles = [lm.policy.final_norm.register_forward_hook(keep("h"))]
    if lens is not None:
        handles.append(layers[0].register_forward_pre_hook(keep(-1, pre=True), with_kwargs=True))
        handles += [layer.register_forward_hook(keep(l)) for l, layer in enumerate(layers)]
    first: dict = {}
    owners: dict = {}
    for r, sq in enumerate(seqs):
        owners.setdefault(first.setdefault((tuple(sq), starts[r]), r), []).append(r)
    uniq = list(owners)
    counts = {"forward_passes": 0, "tokens": 0, "padded_tokens": 0}
    try:
        for b in batches_by_length([len(seqs[u]) for u in uniq], batch_size, max_tokens):
            rows = [uniq[i] for i in b]
            ids, mask, pos, _ = pad_batch([seqs[r] for r in rows], pad, padding_side)
            ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
            cols, valid = scored_positions(seqs, starts, rows, ids.shape[1], padding_side, dev)
            toks = ids.gather(1, cols)
            lp = token_logprobs(lm.policy, ids, mask, pos, cols, toks).cpu().numpy()
            hb = got["h"][:, -1] if padding_side == "left" else got["h"][torch.arange(len(rows)), mask.sum(1) - 1]
            lens_b = None
            if lens is not None:
                lens_b = np.stack([_lens_logp(lm.policy, norm_copy, got[l], cols, toks) for l in range(-1, L)], 1)
            got.clear()
            lr = token_logprobs(lm.reference, ids, mask, pos, cols, toks).cpu().numpy() if ref is not None else None
            got.clear()
            for j, r in enumerate(rows):
                k = int(valid[j].sum())
                for o in owners[r]:
                    pol[o, :k] = lp[j, :k]
                    h[o] = hb[j].float().cpu().numpy()
                    if lr is not None:
                        ref[o, :k] = lr[j, :k]
                    if lens_b is not None:
                        lens[o, :, :k] = lens_b[j, :, :k]
            counts["forward_passes"] += 1 + (ref is not None)
            counts["tokens"] += sum(len(seqs[r]) for r in rows)
            counts["padded_tokens"] += int(mask.numel())
    finally:
        for hd in handles:
            hd.remove()
    per_token = per_token_reward(pol, ref, lm.beta, lm.length_normalize)
    reward = np.nansum(per_token, -1)
    sites_out = {"policy_logp": pol.reshape(n, 2, P), "per_token": per_token.reshape(n, 2, P)}
    if ref is not None:
        sites_out["reference_logp"] = ref.reshape(n, 2, P)
    if lens is not None:
        base = ref[:, None, :] if ref is not None else 0.0
        scale = lm.beta / (np.sum(np.isfinite(pol), -1)[:, None, None] if lm.length_normalize else 1.0)
        sites_out[LENS_SITE] = (scale * (lens - base)).reshape(n, 2, L + 1, P)
    lengths = np.array([len(s) for s in seqs]).reshape(n, 2)
    return CaptureResult(pair_ids=list(encoded.pair_ids), h=h.reshape(n, 2, -1),
                         logits=reward.reshape(n, 2, 1).astype(np.float64), lengths=lengths, sites=sites_out,
                         counts=counts)


def per_token_reward(pol: np.ndarray, ref, beta: float, length_normalize: bool) -> np.ndarray:
    """``β·(log π − log π_ref)`` per token (rows, position), ``/ n`` when normalized; NaN past a response."""
    diff = pol - (ref if ref is not None else 0.0)
    n_tok = np.sum(np.isfinite(pol), -1, keepdims=True)
    return beta * diff / (n_tok if length_normalize else 1.0)


def _lens_logp(policy, norm_copy, x, cols, toks) -> np.ndarray:
    """``log_softmax(U · N(x))`` at ``cols − 1`` gathered at ``toks`` (rows, n), float64 numpy."""
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    z = policy.logits_of(norm_copy(x[rows, cols - 1]))
    return torch.log_softmax(z.double(), -1).gather(-1, toks[..., None])[..., 0].cpu().numpy()
