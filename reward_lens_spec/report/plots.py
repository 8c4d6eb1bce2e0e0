"""Plots and a short markdown summary of one stored run; reads the store only, needs no model.

``plot_run(url, run_id, out_dir) -> list[Path]`` draws what the run holds (matplotlib, Agg):

- ``lens``: normed reward lens (margin read at each depth, layer −1 = embedding) — mean and a
  95% interval (mean ± 1.96·s.e. over pairs), one line per ``dimension``;
- ``dla``: mean direct linear attribution per unit (embed, attn_L*, mlp_L*), the top 20 by
  |mean|, with ±1.96·s.e. error bars;
- ``patch_effect``: mean exact patching effect, layer × component heatmap (diverging, centred);
- ``crystallization_fraction``: histogram over pairs (every finite value counted: bins beyond [0, 1]
  are added for values outside it, drawn in red);
- ``fit_report``: calibration (reliability) curve of σ(Δ) with bin counts and the ECE.

A ``summary.md`` lists each figure with the numbers it shows (means, top units, ECE). Variables
with an ``objective`` dim are drawn for the first objective (named in the title). Units come
from the variables' ``units`` attrs. Errors: ``StoreError`` (unknown run or store).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..store import open_store
from .arrays import crystallization_bins, first_objective, mean_ci, strs
from ..data.accounting import pairs_limit, pairs_phrase, restricted_outputs


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_lens(ds, path: Path, title: str) -> str:
    plt = _plt()
    da, tag = first_objective(ds["lens"])
    da = da.transpose("pair", "layer")
    layers = da["layer"].values
    dims = strs(da["dimension"].values) if "dimension" in da.coords else np.array([""] * da.sizes["pair"])
    fig, ax = plt.subplots(figsize=(7, 4))
    lines = []
    for d in sorted(set(dims.tolist())):
        vals = np.asarray(da.values, float)[dims == d]
        m, lo, hi = mean_ci(vals)
        ax.plot(layers, m, marker=".", label=f"{d or 'all'} (n={len(vals)})")
        ax.fill_between(layers, lo, hi, alpha=0.2)
        lines.append(f"- {d or 'all'}: n={len(vals)}, final margin mean {m[-1]:.4g}")
    ax.axhline(0, color="k", lw=0.5)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer (−1 = embedding)")
    ax.set_ylabel(f"margin read at depth ({da.attrs.get('units', 'reward')})")
    ax.set_title(f"{title}: reward lens{tag}, mean ± 95% CI")
    if len(lines) <= 14:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "\n".join(lines)


def plot_dla(ds, path: Path, title: str, top: int = 20) -> str:
    plt = _plt()
    da, tag = first_objective(ds["dla"])
    da = da.transpose("pair", "layer", "component")
    vals = np.asarray(da.values, float).reshape(da.sizes["pair"], -1)
    if "unit" in da.coords:
        units = strs(da["unit"].values)
    else:
        units = np.array([f"{c}_L{l}" for l in da["layer"].values for c in da["component"].values])
    ok = np.isfinite(vals).any(0) & (units != "")
    vals, units = vals[:, ok], units[ok]
    m, lo, hi = mean_ci(vals)
    order = np.argsort(-np.abs(m))[:top]
    fig, ax = plt.subplots(figsize=(7, 0.25 * len(order) + 1.5))
    y = np.arange(len(order))[::-1]
    ax.barh(y, m[order], xerr=np.vstack([m[order] - lo[order], hi[order] - m[order]]),
            color=["tab:blue" if v > 0 else "tab:red" for v in m[order]], capsize=2)
    ax.set_yticks(y, units[order], fontsize=7)
    ax.axvline(0, color="k", lw=0.5)
    ax.set_xlabel(f"mean DLA ({da.attrs.get('units', 'reward')}), ± 95% CI over {vals.shape[0]} pairs")
    ax.set_title(f"{title}: top {len(order)} units by |mean DLA|{tag}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    total = float(np.nanmean(np.nansum(vals, 1)))
    return "\n".join([f"- mean sum over units (= mean margin): {total:.4g}"] +
                     [f"- {units[i]}: {m[i]:+.4g} [{lo[i]:+.4g}, {hi[i]:+.4g}]" for i in order[:8]])


def plot_patch(ds, path: Path, title: str) -> str:
    plt = _plt()
    da, tag = first_objective(ds["patch_effect"])
    da = da.transpose("pair", "layer", "component").dropna("layer", how="all").dropna("component", how="all")
    m = np.nanmean(np.asarray(da.values, float), 0)
    lim = float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
    fig, ax = plt.subplots(figsize=(1.2 * da.sizes["component"] + 2.5, 0.18 * da.sizes["layer"] + 1.8))
    im = ax.imshow(m, aspect="auto", cmap="RdBu_r", vmin=-lim or -1, vmax=lim or 1, origin="lower")
    ax.set_xticks(range(da.sizes["component"]), [str(c) for c in da["component"].values])
    step = max(1, da.sizes["layer"] // 15)
    ax.set_yticks(range(0, da.sizes["layer"], step), [str(l) for l in da["layer"].values[::step]])
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, label=f"mean patch effect ({da.attrs.get('units', 'reward')})")
    ax.set_title(f"{title}: patching{tag}, {da.sizes['pair']} pairs", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    i, j = np.unravel_index(np.nanargmax(np.abs(m)), m.shape)
    return f"- largest mean effect: layer {da['layer'].values[i]} {da['component'].values[j]} = {m[i, j]:+.4g}"


def plot_crystallization(ds, path: Path, title: str) -> str:
    plt = _plt()
    da, tag = first_objective(ds["crystallization_fraction"])
    v = np.asarray(da.values, float).ravel()
    edges, counts = crystallization_bins(v)
    v = v[np.isfinite(v)]
    out = int(((v < 0) | (v > 1)).sum())
    fig, ax = plt.subplots(figsize=(6, 3.5))
    inside = (edges[:-1] >= -1e-12) & (edges[1:] <= 1 + 1e-12)
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", edgecolor="white",
           color=np.where(inside, "tab:purple", "tab:red"))
    ax.set_xlabel("crystallization fraction (0 = embedding, 1 = last layer)" + (f"; red: {out} outside [0, 1]" if out else ""))
    ax.set_ylabel("pairs")
    ax.set_title(f"{title}: crystallization{tag}, n={v.size}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"- mean {v.mean():.3f}, median {np.median(v):.3f} (n={v.size})" if v.size else "- no finite values"


def plot_calibration(ds, path: Path, title: str) -> str:
    plt = _plt()
    mp, fq, n = (np.asarray(ds[k].values, float) for k in ("reliability_mean_p", "reliability_freq", "reliability_n"))
    ok = n > 0
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="perfect")
    ax.plot(mp[ok], fq[ok], "o-", label="σ(Δ), both orders")
    for x, y, k in zip(mp[ok], fq[ok], n[ok]):
        ax.annotate(str(int(k)), (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
    ece = float(ds["ece"].values)
    acc = np.asarray(ds["accuracy"].values, float)
    ax.set_xlabel("predicted P(first wins)")
    ax.set_ylabel("observed frequency")
    ax.set_title(f"{title}: calibration, ECE {ece:.3f}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return (f"- held-out accuracy {acc[0]:.3f} [{acc[1]:.3f}, {acc[2]:.3f}]; ECE {ece:.3f}; "
            f"mean BT loss {float(ds['bt_loss'].values[0]):.4f} nats")


def _stat_tables(ds) -> list[str]:
    """Markdown tables of every ``*statistic × bound`` variable (confounders), first objective."""
    lines = []
    for name, var in ds.data_vars.items():
        rest = [d for d in var.dims if d not in ("objective", "bound")]
        if "bound" not in var.dims or len(rest) != 1 or not rest[0].endswith("statistic"):
            continue
        da, tag = first_objective(var)
        da = da.transpose(rest[0], "bound")
        lines += [f"## {name}{tag}", "", "| statistic | estimate | 95% CI |", "| --- | ---: | --- |"]
        for st, row in zip(strs(da[rest[0]].values), np.asarray(da.values, float)):
            ci = "" if st.startswith("n_") else f"[{row[1]:.3f}, {row[2]:.3f}]"
            lines.append(f"| {st} | {row[0]:.4g} | {ci} |")
        lines.append("")
    return lines


PLOTS = (("lens", "lens", plot_lens), ("dla", "dla", plot_dla), ("patch_effect", "patch", plot_patch),
         ("crystallization_fraction", "crystallization", plot_crystallization),
         ("reliability_mean_p", "calibration", plot_calibration))


def plot_run(url: str, run_id: str, out_dir, *, storage_options: dict | None = None) -> list[Path]:
    """Draw every plot the run's data supports into ``out_dir``; write ``summary.md``; return paths."""
    store = open_store(url, storage_options=storage_options)
    prov = store.provenance(run_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    datasets = store.load(run_id, lazy=False)
    eff = prov.get("effective_n") if isinstance(prov.get("effective_n"), dict) else {}
    restricted = next((r for r in (restricted_outputs(d, pairs_limit(prov)) for d in datasets.values()) if r), None)
    written, lines = [], [f"# {run_id}", "", f"model `{prov.get('model')}`, dataset `{prov.get('dataset')}`, "
                          f"trust `{prov.get('trust')}`, effective n `{prov.get('effective_n')}`", ""]
    if prov.get("excluded") is not None or prov.get("pair_flags") is not None:
        lines += [f"pairs: {pairs_phrase(prov.get('excluded'), prov.get('pair_flags'), eff.get('n_scored'), restricted)}",
                  ""]
    n_head = len(lines)
    for obs, ds in datasets.items():
        for var, stem, fn in PLOTS:
            if var in ds:
                path = out / f"{run_id}_{obs}_{stem}.png"
                text = fn(ds, path, f"{prov.get('model')} / {prov.get('dataset')}")
                written.append(path)
                lines += [f"## {stem} ({obs})", "", f"![{stem}]({path.name})", "", text, ""]
        lines += _stat_tables(ds)
    md = out / f"{run_id}_summary.md"
    md.write_text("\n".join(lines) + ("" if len(lines) > n_head else "Nothing plottable in this run.\n"), encoding="utf-8")
    return written + [md]
