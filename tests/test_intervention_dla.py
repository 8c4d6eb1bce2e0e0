"""DLA on an intervened reward model (issue 40 item 4): an intervention at ``resid_post.<l>`` (``model.interventions``)
adds to the residual stream what no block wrote, so without its own component DLA's cells do not sum to the margin.
The capture records that write as the component ``intervention`` (``models.capture``, ``ops.capture``); an
``attn_out``/``mlp_out`` intervention is part of what its block wrote.

Checked against a naive float64 recomputation that shares nothing with the capture or the operators: the plain
built-in tiny model, our own forward hooks applying the same erasure and shifts (written out by hand), one unpadded
sequence at a time, every cell ``w · (g ⊙ c / rms(x_L))`` with the final RMSNorm frozen at the last residual x_L,
chosen minus rejected. The whole grid (NaN pattern included) must match, and the cells sum to the margin exactly.
"""
from __future__ import annotations

import numpy as np
import pytest

import reward_lens_spec as rls
from reward_lens_spec.models.artifacts import resid_layers, write

D = 64          # the built-in tiny's d_model (checked below against the model)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An eraser (oblique rank-2 projection E, mean μ) and two steering vectors (the eraser removes mostly the direction the
    head reads, so the interventions' write is a large share of the margin), written as artifacts."""
    d = tmp_path_factory.mktemp("iv")
    from reward_lens_spec.models.tiny import build_tiny
    model, _ = build_tiny("tiny")
    read = (model.score.weight[0] * model.model.norm.weight).detach().double().numpy()   # what the head reads of x_L
    read /= np.linalg.norm(read)
    rng = np.random.default_rng(7)
    U = np.linalg.qr(np.column_stack([read, rng.normal(size=D)]))[0]          # erases mostly what the head reads
    E = (U @ (U.T + 0.3 * rng.normal(size=(2, D)))).astype(np.float32)        # any d × d map is applied as given
    src = {"note": "written by tests/test_intervention_dla.py"}
    write(d / "eraser.safetensors", "erase", {"mean": rng.normal(size=D).astype(np.float32), "projection": E}, src)
    write(d / "v0.safetensors", "steer", {"vector": (rng.normal(0, 0.5, D)).astype(np.float32)}, src)
    write(d / "v1.safetensors", "steer", {"vector": rng.normal(0, 0.5, D).astype(np.float32)}, src)
    return d


def entries(d):
    """Two writes at layer 0's output (erase, then a shift), one at layer 2's, one inside layer 1's MLP."""
    return [{"kind": "erase", "path": d / "eraser.safetensors", "site": "resid_post.0"},
            {"kind": "steer", "path": d / "v0.safetensors", "site": "resid_post.0", "alpha": 2.0},
            {"kind": "steer", "path": d / "v1.safetensors", "site": "mlp_out.1", "alpha": -1.5},
            {"kind": "steer", "path": d / "v1.safetensors", "site": "resid_post.2", "alpha": 3.0}]


def override(items) -> str:
    return "model.interventions=[" + ",".join("{" + ", ".join(f"{k}: {v}" for k, v in e.items()) + "}"
                                              for e in items) + "]"


def naive_dla(d, items, limit: int):
    """``(pair_ids, grid, margin, magnitude)`` in float64: grid pair × layer (−1..L−1) × component (embed, attn, mlp,
    intervention); magnitude the largest Σᵢ |wᵢ gᵢ cᵢ| / rms of any cell (the size of the terms float32 rounds)."""
    import torch
    from safetensors.numpy import load_file

    from reward_lens_spec.data import load_pairs
    from reward_lens_spec.models.formatting import encode_pairs
    from reward_lens_spec.models.tiny import build_tiny

    model, tok = build_tiny("tiny")
    layers, norm, W = model.model.layers, model.model.norm, model.score.weight.detach().double().numpy()[0]
    assert model.config.hidden_size == D
    L = len(layers)
    enc = encode_pairs(tok, list(load_pairs("diagnostic", limit=limit)), model_name="tiny", fmt="plain",
                       template="User: {prompt}\nAssistant: {response}", max_length=512)
    maps = {}                                                   # module -> [float64 map], in order
    for e in items:
        t = {k: v.astype(np.float64) for k, v in load_file(str(e["path"])).items()}
        site, layer = e["site"].split(".")
        mod = layers[int(layer)] if site == "resid_post" else layers[int(layer)].mlp
        if e["kind"] == "erase":
            f = (lambda mu, E: lambda x: x - (x - mu) @ E.T)(t["mean"], t["projection"])
        else:
            f = (lambda v, a: lambda x: x + a * v)(t["vector"], float(e["alpha"]))
        maps.setdefault(mod, []).append(f)
    seen = {}

    def tap(name, edit=None):
        def hook(mod, args, out):
            x = out[0] if isinstance(out, tuple) else out
            seen[name + ":in"] = x[0, -1].double().numpy().copy()
            if edit is not None:
                y = x.detach().double().numpy()
                for f in edit:
                    y = f(y)
                x = torch.as_tensor(y, dtype=x.dtype)
            seen[name] = x[0, -1].double().numpy().copy()
            return ((x,) + tuple(out[1:]) if isinstance(out, tuple) else x) if edit is not None else None
        return hook
    hooks = [layers[0].register_forward_pre_hook(lambda m, a: seen.__setitem__("embed", a[0][0, -1].double().numpy()))]
    for i, layer in enumerate(layers):
        hooks += [layer.self_attn.register_forward_hook(tap(f"attn{i}", maps.get(layer.self_attn))),
                  layer.mlp.register_forward_hook(tap(f"mlp{i}", maps.get(layer.mlp))),
                  layer.register_forward_hook(tap(f"out{i}", maps.get(layer)))]
    g, eps = norm.weight.detach().double().numpy(), float(norm.variance_epsilon)
    grid = np.full((len(enc.pair_ids), L + 1, 4), np.nan)
    margin, mags = np.zeros(len(enc.pair_ids)), []
    try:
        with torch.no_grad():
            for p in range(len(enc.pair_ids)):
                cells = []
                for seq in (enc.chosen[p], enc.rejected[p]):
                    seen.clear()
                    margin[p] += (1 if not cells else -1) * float(model(input_ids=torch.tensor([list(seq)])).logits[0, 0])
                    rms = np.sqrt(np.mean(seen[f"out{L - 1}"] ** 2) + eps)
                    def r(c):
                        mags.append(float(np.abs(W * g * c).sum() / rms))
                        return float(W @ (g * c / rms))
                    side = np.full((L + 1, 4), np.nan)
                    side[0, 0] = r(seen["embed"])
                    for i in range(L):
                        side[i + 1, 1], side[i + 1, 2] = r(seen[f"attn{i}"]), r(seen[f"mlp{i}"])
                        if maps.get(layers[i]):
                            side[i + 1, 3] = r(seen[f"out{i}"] - seen[f"out{i}:in"])
                    cells.append(side)
                grid[p] = cells[0] - cells[1]
    finally:
        for h in hooks:
            h.remove()
    return list(enc.pair_ids), grid, margin, max(mags)


def test_an_intervened_models_dla_has_the_interventions_write_and_sums_to_the_margin(files, tmp_path):
    items = entries(files)
    got = rls.run(["observable=dla", "dataset.limit=3", f"store.url={tmp_path / 's.zarr'}", override(items)],
                  progress=False)
    ids, want, margin, mag = naive_dla(files, items, 3)
    dla = got["dla"].sel(pair=ids).transpose("pair", "layer", "component")
    assert list(dla.component.values) == ["embed", "attn", "mlp", "intervention"]
    assert [str(u) for u in dla.unit.sel(component="intervention").values] == \
        ["", "intervention_L0", "", "intervention_L2", ""]
    cells = dla.values.astype(np.float64)
    assert np.array_equal(np.isnan(cells), np.isnan(want))
    # float32 (the run, batched and padded) against float64: rounding of terms of size ``mag`` before they cancel
    assert np.nanmax(np.abs(cells - want)) <= 1e-6 * mag, (np.nanmax(np.abs(cells - want)), mag)
    # Σ cells = margin (the model's own logits), to the float32 rounding of its forward, in both
    assert np.abs(np.nansum(want, (1, 2)) - margin).max() <= 1e-6 * mag
    assert np.abs(np.nansum(cells, (1, 2)) - margin).max() <= 1e-6 * mag
    # what fails without the component: the blocks' cells alone miss the margin by far more than rounding
    assert np.abs(np.nansum(cells[:, :, :3], (1, 2)) - margin).min() > 0.1 * np.abs(margin).max()
    rec = [r for r in got.provenance["identities"] if r["identity"] == "sum of dla = margin"]
    assert len(rec) == 1 and rec[0]["max_abs_err"] <= 1e-5 * max(1.0, rec[0]["scale"]), rec


def test_without_resid_interventions_the_components_are_unchanged(files, tmp_path):
    plain = rls.run(["observable=dla", "dataset.limit=2", f"store.url={tmp_path / 'p.zarr'}"], progress=False)
    assert list(plain["dla"].component.values) == ["embed", "attn", "mlp"]
    inside = rls.run(["observable=dla", "dataset.limit=2", f"store.url={tmp_path / 'm.zarr'}",
                      override([entries(files)[2]])], progress=False)        # mlp_out only: part of the mlp cell
    assert list(inside["dla"].component.values) == ["embed", "attn", "mlp"]
    s = inside["dla"].sum(("layer", "component"), skipna=True).values
    rec = [r for r in inside.provenance["identities"] if r["identity"] == "sum of dla = margin"][0]
    assert rec["max_abs_err"] <= 1e-5 * max(1.0, rec["scale"]) and np.isfinite(s).all()


def test_resid_layers_reads_the_records():
    recs = [{"kind": "steer", "site": "resid_post.3"}, {"kind": "erase", "site": "resid_post.0"},
            {"kind": "erase", "site": "attn_out.1"}, {"kind": "head", "site": "readout"},
            {"kind": "steer", "site": "resid_post.3"}]
    assert resid_layers(recs) == (0, 3) and resid_layers(None) == () and resid_layers([]) == ()
