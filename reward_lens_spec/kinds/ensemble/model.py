"""Ensembles of reward models (``model.kind=ensemble``): one signal from several members.

``model.members``: a list of ``conf/model`` option names, model YAML paths or inline model mappings; each is
loaded by the guarded classifier loader (``models.loading.load_model``) and scored by the ordinary capture
pass (with its self-check against the member's own head). The ensemble reward of a side is the member
rewards reduced by ``model.ensemble.reduce``:
  mean       (1/M) Σ_m r_m
  min        min_m r_m                                   (conservative, as in Coste et al. 2023)
  quantile   the ``q`` quantile of r_1..r_M (numpy's linear interpolation)
and the margin is chosen minus rejected of that reward. The member rewards are kept (``CaptureResult.sites
["member_rewards"]``, pair × side × member) for ``ops.ensemble``'s per-member margins and agreement.

Restrictions (a ``SpecError`` naming the member): members are sequence classifiers with one output
(``model.kind=classifier``, ``num_labels=1`` or a gated head), and share one tokenizer — the pairs are
formatted and tokenized once, under the ensemble's own ``format``/``template``/``max_length``.

Instruments that read one residual stream or one head (lens, DLA, patching, steering, frames) are refused for
the ensemble (``refused_ops``): the members have separate streams and a min or quantile is not linear in any
of them; run such an instrument per member (``model=<member option>``).

Identity: each member's fingerprint (``models.fingerprint``) is in the ensemble's fingerprint (the module
holding every member is hashed with a config naming them and their fingerprints) and, through
``member_fingerprints``, in the run identity (``run.identity``) and the member outputs' ``member_fingerprints``
attr; the members' specs, ``reduce`` and ``q`` are in ``run.identity.numerics``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...errors import SpecError
from ...engine.capture import CaptureResult
from ...models.door import nested
from ..implicit.settings import KindConfig
from .settings import check_ensemble, reduce_members
from ...models.readout import ReadoutHead
from ...engine.capture import capture
from ...models.fingerprint import model_fingerprint, tokenizer_dict
from ...models.loading import load_model


@dataclass
class EnsembleModel:
    name: str
    members: list                  # LoadedModel each
    member_names: list
    member_fingerprints: list
    reduce: str
    q: float
    model: torch.nn.Module
    tokenizer: object
    family: object
    norm: object
    head: ReadoutHead
    dtype: str
    device: str
    kind: str = "ensemble"

    @property
    def signal(self):
        return self                  # kinds reads ``lm.signal.kind``

    @property
    def n_layers(self) -> int:
        return self.members[0].n_layers

    @property
    def d_model(self) -> int:
        return int(self.head.W.shape[1])

    def capture_pass(self, encoded, sites=(), *, batch_size=16, max_tokens=None, padding_side="left", **_):
        n = len(encoded.pair_ids)
        per, counts = [], {}
        for m in self.members:
            cap = capture(m, encoded, (), batch_size=batch_size, max_tokens=max_tokens, padding_side=padding_side)
            per.append(np.asarray(cap.logits, np.float64)[..., 0])
            for k, v in cap.counts.items():
                counts[k] = counts.get(k, 0) + int(v)
        member_rewards = np.stack(per, -1)                     # pair × side × member
        reward = reduce_members(member_rewards, self.reduce, self.q)
        return CaptureResult(pair_ids=list(encoded.pair_ids), h=np.full((n, 2, self.d_model), np.nan, np.float32),
                             logits=reward[..., None], lengths=encoded.lengths(),
                             sites={"member_rewards": member_rewards}, counts=counts)


def load_ensemble(spec, base_dir=None) -> EnsembleModel:
    """Every member (``models.loading.load_model``) as one ``EnsembleModel``; ``SpecError`` naming the member
    for a member with several outputs or another tokenizer."""
    check_ensemble(spec)
    members, names, fps = [], [], []
    for i, ref in enumerate(spec.members):
        ms = nested(spec, ref, f"model.members.{i}", base_dir)
        ms.device, ms.dtype, ms.padding_side = spec.device, spec.dtype, spec.padding_side
        lm = load_model(ms, base_dir)
        if lm.head.n_outputs != 1:
            raise SpecError(f"model.members.{i}", f"member '{ms.name}' has {lm.head.n_outputs} outputs; an ensemble "
                            "reduces one reward per member.", fix="use single-output members (num_labels=1).")
        if members and tokenizer_dict(lm.tokenizer) != tokenizer_dict(members[0].tokenizer):
            raise SpecError(f"model.members.{i}", f"member '{ms.name}' has another tokenizer than "
                            f"'{names[0]}'; the pairs are tokenized once for every member.",
                            fix="ensemble members that share a tokenizer.")
        if ms.name in names:
            raise SpecError(f"model.members.{i}", f"two members are named '{ms.name}'.",
                            fix="give inline members distinct name: keys.")
        members.append(lm)
        names.append(ms.name)
        fps.append(model_fingerprint(lm.model, lm.tokenizer))
    container = torch.nn.ModuleDict({f"member_{i}": m.model for i, m in enumerate(members)})
    container.config = KindConfig({"kind": "ensemble", "members": names, "member_fingerprints": fps,
                                    "reduce": spec.ensemble.reduce, "q": float(spec.ensemble.q)})
    d = members[0].d_model
    head = ReadoutHead(W=np.full((1, d), np.nan, np.float32), b=np.full(1, np.nan, np.float32), objectives=("reward",))
    first = members[0]
    return EnsembleModel(name=spec.name, members=members, member_names=names, member_fingerprints=fps,
                         reduce=spec.ensemble.reduce, q=float(spec.ensemble.q), model=container,
                         tokenizer=first.tokenizer, family=first.family, norm=first.norm, head=head,
                         dtype=first.dtype, device=first.device)
