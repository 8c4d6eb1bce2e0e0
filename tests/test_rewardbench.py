"""RewardBench / RewardBench 2 files (JSON-Lines, JSON, Parquet) through dataset= and observable= alone.

Accuracies, section averages and the leaderboard score are checked against a naive recomputation
from the stored margins with RewardBench's published weights written out here by hand.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from reward_lens_spec.data import load_pairs
from reward_lens_spec.errors import SpecError

SUBSETS = ["alpacaeval-easy", "mt-bench-med", "llmbar-natural", "refusals-dangerous", "hep-go", "math-prm",
           "anthropic_helpful", "shp", "my-own-set"]


def v1_rows(n_per=4):
    rows = []
    for s_i, s in enumerate(SUBSETS):
        for k in range(n_per):
            rows.append({"prompt": f"Q{s_i}.{k % 3}: say something about {s}?", "chosen": f"Answer {k} " * (1 + k),
                         "rejected": f"No {s_i}", "subset": s, "id": 100 * s_i + k,
                         "chosen_model": "gpt-4", "rejected_model": "llama-2"})
    return rows


def v2_rows(official_ties=False):
    """Six items, two in Ties; ``official_ties``: those two shaped as RewardBench 2's (ids ``ref:7`` with one
    correct answer and ``tied:7`` with two), as the official Ties score reads them."""
    rows = []
    for i in range(6):
        subset = "Ties" if i >= 4 else ("Math" if i % 2 else "Focus")
        chosen = [f"right {i}", f"also right {i} !"] if subset == "Ties" else [f"right answer {i}"]
        item = f"it{i}"
        if official_ties and subset == "Ties":
            item, chosen = ("ref:7", chosen[:1]) if i == 4 else ("tied:7", chosen)
        rows.append({"id": item, "prompt": f"Problem {i}", "chosen": chosen,
                     "rejected": [f"wrong {i} {j}" * (j + 1) for j in range(3)], "subset": subset,
                     "num_correct": len(chosen), "num_rejected": 3, "models": ["a", "b"]})
    return rows


def write(path, rows, fmt):
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    else:
        pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_v1_schema_reads_the_same_from_every_format(tmp_path, fmt):
    p = write(tmp_path / f"rb.{fmt}", v1_rows(), fmt)
    ps = load_pairs("rewardbench", path=str(p))
    assert len(ps) == 4 * len(SUBSETS)
    first = ps[0]
    assert first.id == "0" and first.dimension == "alpacaeval-easy"
    assert first.meta_dict()["chosen_model"] == "gpt-4" and first.meta_dict()["rejected_model"] == "llama-2"
    ref = load_pairs("rewardbench", path=str(write(tmp_path / "ref.jsonl", v1_rows(), "jsonl")))
    assert ps.checksum == ref.checksum and ps.ids == ref.ids


def test_v1_aliases_defaults_and_errors(tmp_path):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b", "subset": "LLMBar/Adversarial/Neighbor", "id": "x"},
            {"prompt": "p2", "chosen": "a", "rejected": "b", "id": "y"}]
    p = write(tmp_path / "mix.jsonl", rows, "jsonl")
    ps = load_pairs("rewardbench", path=str(p), subset="anthropic_helpful")
    assert [q.dimension for q in ps] == ["llmbar-adver-neighbor", "anthropic_helpful"]
    assert ps[0].meta_dict()["source_subset"] == "LLMBar/Adversarial/Neighbor"
    assert load_pairs("rewardbench", path=str(p))[1].dimension == "mix"          # the file stem
    bad = write(tmp_path / "v2.jsonl", v2_rows(), "jsonl")
    with pytest.raises(SpecError, match="dataset=rewardbench2"):
        load_pairs("rewardbench", path=str(bad))
    with pytest.raises(SpecError, match="dataset.fields.prompt"):
        load_pairs("rewardbench", path=str(write(tmp_path / "np.jsonl", [{"chosen": "a", "rejected": "b"}], "jsonl")))
    with pytest.raises(SpecError, match="dataset.path"):
        load_pairs("rewardbench", path=str(tmp_path / "missing.parquet"))
    with pytest.raises(SpecError, match="dataset.subset"):
        load_pairs("jsonl", path=str(p), subset="x")
    with pytest.raises(SpecError, match="duplicate id"):
        load_pairs("rewardbench", path=str(write(tmp_path / "dup.jsonl", [rows[0], rows[0]], "jsonl")))


def test_v2_items_expand_to_pairs_covering_every_candidate(tmp_path):
    ps = load_pairs("rewardbench2", path=str(write(tmp_path / "rb2.json", v2_rows(), "json")), limit=5)
    items = {q.meta_dict()["item"] for q in ps}
    assert items == {f"it{i}" for i in range(5)}                       # limit counts items
    assert len(ps) == 4 * 3 + (3 + 1)                                  # 3 pairs per item, 4 for a 2-chosen Ties item
    tie = [q for q in ps if q.meta_dict()["item"] == "it4"]
    assert {q.chosen for q in tie} == {"right 4", "also right 4 !"}
    assert {q.rejected for q in tie} == {f"wrong 4 {j}" * (j + 1) for j in range(3)}
    with pytest.raises(SpecError, match="list of strings"):
        load_pairs("rewardbench2", path=str(write(tmp_path / "v1.jsonl", v1_rows(1), "jsonl")))


def run_cfg(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from reward_lens_spec.paths import conf_dir
    from reward_lens_spec.run import execute
    from reward_lens_spec.spec import register_configs, validate
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return execute(validate(cfg), resolved_yaml=OmegaConf.to_yaml(cfg), base_dir=str(tmp_path),
                   store_url=str(tmp_path / "s.zarr"), progress=False)


WEIGHTS = {"alpacaeval-easy": 100, "mt-bench-med": 40, "llmbar-natural": 100, "refusals-dangerous": 100,
           "hep-go": 164, "math-prm": 984}
SECTION = {"alpacaeval-easy": "Chat", "mt-bench-med": "Chat", "llmbar-natural": "Chat Hard",
           "refusals-dangerous": "Safety", "hep-go": "Reasoning", "math-prm": "Reasoning",
           "anthropic_helpful": "Prior Sets", "shp": "Prior Sets"}


def test_rewardbench_observable_matches_a_naive_recomputation(tmp_path):
    p = write(tmp_path / "rb.parquet" if _has_pyarrow() else tmp_path / "rb.jsonl", v1_rows(), "parquet"
              if _has_pyarrow() else "jsonl")
    out = run_cfg(tmp_path, "dataset=rewardbench", f"dataset.path={p}", "observable=rewardbench")
    res = out.result
    margin = res["margin"].to_series()
    subset = dict(zip(res["pair"].values, res["dimension"].values))
    acc = {}
    for s in SUBSETS:
        m = np.array([margin[i] for i in margin.index if subset[i] == s])
        acc[s] = np.mean(np.where(m > 0, 1.0, np.where(m == 0, 0.5, 0.0)))
    sub = res["subset_accuracy"]
    for s in SUBSETS:
        assert sub.sel(subset=s, bound="estimate").item() == pytest.approx(acc[s], abs=1e-12)
        assert int(sub["n_subset"].sel(subset=s)) == 4 and int(sub["n_eff_subset"].sel(subset=s)) == 3   # k % 3 prompts
        lo, hi = sub.sel(subset=s, bound="ci_low").item(), sub.sel(subset=s, bound="ci_high").item()
        assert lo <= acc[s] <= hi
    assert sub["subset_section"].sel(subset="my-own-set").item() == ""
    sec = res["section_accuracy"]
    naive = {}
    for name in ["Chat", "Chat Hard", "Safety", "Reasoning"]:
        mem = [s for s in WEIGHTS if SECTION[s] == name]
        naive[name] = sum(acc[s] * WEIGHTS[s] for s in mem) / sum(WEIGHTS[s] for s in mem)
    naive["Prior Sets"] = (acc["anthropic_helpful"] + acc["shp"]) / 2
    assert list(sec["section"].values) == ["Chat", "Chat Hard", "Safety", "Reasoning", "Prior Sets"]
    for name, v in naive.items():
        assert sec.sel(section=name, bound="estimate").item() == pytest.approx(v, abs=1e-12)
    score = (2 * (naive["Chat"] + naive["Chat Hard"] + naive["Safety"] + naive["Reasoning"])
             + naive["Prior Sets"]) / 9
    got = res["rewardbench_score"]
    assert got.sel(bound="estimate").item() == pytest.approx(score, abs=1e-12)
    assert got.attrs["n"] == 4 * 8 and got.attrs["n_eff"] == 3 * 8
    assert got.sel(bound="ci_low").item() <= score <= got.sel(bound="ci_high").item()


def test_rewardbench2_best_of_n_matches_the_candidates_rewards(tmp_path):
    p = write(tmp_path / "rb2.jsonl", v2_rows(official_ties=True), "jsonl")
    res = run_cfg(tmp_path, "dataset=rewardbench2", f"dataset.path={p}", "observable=rewardbench2").result
    grid = res["candidate_reward"]
    assert grid.dims == ("item", "candidate")
    assert list(grid["candidate"].values) == ["chosen_0", "chosen_1", "rejected_0", "rejected_1", "rejected_2"]
    assert np.isnan(grid.sel(item="it0", candidate="chosen_1").item())          # one correct answer only
    reward = res["reward"]
    for pid in reward["pair"].values:                                          # every pair's rewards in the grid
        item, combo = str(pid).rsplit(":", 1)
        i, j = (int(x[1:]) for x in combo.split("-"))
        assert grid.sel(item=item, candidate=f"chosen_{i}").item() == reward.sel(pair=pid, side="chosen").item()
        assert grid.sel(item=item, candidate=f"rejected_{j}").item() == reward.sel(pair=pid, side="rejected").item()
    ok = res["best_of_n_correct"]
    for item in grid["item"].values:
        g = grid.sel(item=item).values
        ch, rj = g[:2][np.isfinite(g[:2])], g[2:]
        assert ok.sel(item=item).item() == (1.0 if ch.min() > rj.max() else 0.0)
    acc = res["best_of_n_accuracy"]
    for s in ("Focus", "Math", "Ties"):
        items = [str(i) for i in grid["item"].values if grid["item_subset"].sel(item=i).item() == s]
        assert acc.sel(subset=s, bound="estimate").item() == pytest.approx(np.mean([ok.sel(item=i).item() for i in items]))
        assert int(acc["n_items"].sel(subset=s)) == 2
    # the official Ties score (reward-bench process_single_model), written out from the grid: one prompt, 7
    ref, tied = grid.sel(item="ref:7").values, grid.sel(item="tied:7").values
    gap_ref, gap_tied = ref[0] - ref[2:].max(), tied[:2].min() - tied[2:].max()
    spread = tied[:2].max() - tied[:2].min()
    naive = (0.3 * (gap_tied > 0) + 0.3 * (gap_ref > 0) + 0.2 * (gap_tied > spread)
             + 0.2 * (min(gap_ref, gap_tied) > spread) + 0.01 * np.tanh(min(gap_ref, gap_tied) / spread - 1))
    ties = res["ties_score"]
    assert ties.dims == ("term", "bound") and ties.attrs["n_ref"] == 1 and ties.attrs["n_tied"] == 1
    assert ties.sel(term="ties_score", bound="estimate").item() == pytest.approx(naive, abs=1e-12)


def _has_pyarrow():
    try:
        import pyarrow.parquet  # noqa: F401
        return True
    except ImportError:
        return False
