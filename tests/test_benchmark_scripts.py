"""The benchmark scripts still run against the package's current API (tiny shapes; no timing asserted)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_gpu_benchmark_smoke_runs_and_says_it_is_not_a_gpu_run(tmp_path):
    out = tmp_path / "gpu.md"
    res = _run(tmp_path, str(BENCH / "gpu.py"), "--smoke", "--pairs", "6", "--side-tokens", "12", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    text = out.read_text()
    assert "NOT a GPU run" in text and "| battery, streamed |" in text and "failed" not in text
    # the at-scale run went through the user's route with device_map=auto and batch_size=auto
    assert "### battery at scale: smoke, 8 pairs, model.device_map=auto, model.batch_size=auto" in text
    row = text.split("### battery at scale")[1].splitlines()[4].split("|")
    assert float(row[2]) > 0 and int(row[5]) >= 1 and "cpu" in row[6], row


def test_memory_benchmark_runs_both_modes(tmp_path):
    out = tmp_path / "mem.md"
    res = _run(tmp_path, str(BENCH / "memory.py"), "--pairs", "4", "8", "--d-model", "64", "--layers", "2",
               "--chunk-pairs", "4", "--patch-pairs", "2", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    text = out.read_text()
    assert text.count("| streamed |") == 2 and text.count("| in_memory |") == 2 and "failed" not in text


def test_memory_benchmark_measures_the_command_line(tmp_path):
    out = tmp_path / "mem.md"
    res = _run(tmp_path, str(BENCH / "memory.py"), "--modes", "cli", "--obs", "score", "--pairs", "4", "8",
               "--d-model", "64", "--layers", "2", "--chunk-pairs", "4", "--work", str(tmp_path / "w"), "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    text = out.read_text()
    assert text.count("| cli |") == 2 and "(whole process)" in text and "failed" not in text
    assert "cli: peak " in text and "KB per added pair" in text


def test_the_peer_comparisons_helpers_load_a_folder_and_run_an_instrument(tmp_path):
    """``benchmarks/common.py`` (``peer_tiny.py``, ``run.py``): a saved folder loads through the package's loader and
    ``run_obs`` computes an instrument on it (``Device`` went from the spec and ``load_folder`` still imported it)."""
    from reward_lens_spec.models.tiny import build_tiny

    model, tok = build_tiny("tiny_llama")
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    sys.path.insert(0, str(BENCH))
    try:
        import common
        lm = common.load_folder("m", tmp_path / "m", "cpu", attn="eager")
        ds, ctx = common.run_obs(lm, common.diagnostic_pairs(4), common.make_obs(["score"]), 4)
    finally:
        sys.path.remove(str(BENCH))
    assert ds["margin"].sizes["pair"] == 4 and common.forwards(ctx) >= 1
