"""The wheel carries the config tree: build it, install it in a fresh venv, run it from elsewhere."""
from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_runs_from_another_directory(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    wheel = next(dist.glob("reward_lens_spec-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)     # reuse torch & co from the host
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True, timeout=600)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(py), "-c", "from reward_lens_spec.paths import conf_dir; print(conf_dir())"],
                           cwd=work, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(env_dir)), where               # the wheel's own copy, not the checkout's
    res = subprocess.run([str(env_dir / "bin" / "reward-lens-spec"), "dataset.limit=3"], cwd=work,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "run id: score-" in res.stdout
    assert (work / "outputs" / "store.zarr").is_dir()
