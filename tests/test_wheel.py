"""From a wheel in a fresh venv, as a new user: build it, install it into a new venv without system
site packages, with its dependencies installed from the package index, then run every subcommand and
a user's own study from another directory.

The dependencies (``reward_lens_spec[full]`` and torch at the host's version, so pip's own
configuration decides where torch comes from: a CPU build on local disk here) are installed once per
dependency set into a cached venv (``~/.cache/reward_lens_spec/wheel_deps/<key>``; the key hashes the
Python version, torch's version and the wheel's requirements; built under a file lock, marked only
after every install succeeded, without reward_lens_spec itself). Each run makes a new venv, links
that cache's site-packages in with a ``.pth`` file and installs the freshly built wheel into it.
``REWARD_LENS_SPEC_FRESH_VENV=1`` installs the dependencies into the new venv itself instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OBS = """\
# the margin, re-assembled from direct linear attribution: embed + every attn_out + every mlp_out
include: [dla]
steps:
  - {name: by_component, op: reduce, input: dla, dim: layer, how: sum}
  - {name: dla_total, op: reduce, input: by_component, dim: component, how: sum}
outputs: [dla_total]
"""
ROWS = [{"question": f"What is {i} + {i}?", "good": f"It is {2 * i}.", "bad": f"Perhaps {i + 5}."} for i in range(3)]
DIRECT = """\
import json, sys, torch
from reward_lens_spec.models.tiny import build_tiny
model, tok = build_tiny("tiny")
out = []
for row in map(json.loads, open(sys.argv[1])):
    r = [model(**tok(f"User: {row['question']}\\nAssistant: {row[k]}", return_tensors="pt")).logits[0, 0].item()
         for k in ("good", "bad")]
    out.append(r[0] - r[1])
print(json.dumps(out))
"""
READ = """\
import json, sys, warnings
warnings.simplefilter("error")
import xarray as xr
run, obs = sys.argv[2], sys.argv[3]                 # each observable is one Dataset in its run's group
tree = xr.open_datatree(sys.argv[1], engine="zarr")[f"runs/{run}/{obs}"]
ds = xr.open_zarr(sys.argv[1], group=f"runs/{run}/{obs}")
print(json.dumps({"total": ds["dla_total"].values.tolist(), "pair": ds["pair"].values.tolist(),
                  "trust": tree.attrs["trust"], "run_id": tree.attrs["run_id"]}))
"""


def _run(cmd, cwd=None, timeout=900):
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert res.returncode == 0, f"{cmd}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def _source_copy(dest: Path) -> Path:
    """The project's files (tracked, or new and not ignored) copied to ``dest``: each wheel test builds from its
    own copy, since two builds of one tree at once (xdist workers) race on its ``build/`` folder."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _wheel(tmp_path) -> Path:
    dist = tmp_path / "dist"
    src = _source_copy(tmp_path / "src")
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", dist, src], timeout=600)
    wheel = next(dist.glob("reward_lens_spec-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for init in (ROOT / "reward_lens_spec").rglob("__init__.py"):     # every package, derived not listed
        assert str(init.relative_to(ROOT)) in names, init
    for yaml in (ROOT / "conf").rglob("*.yaml"):
        assert f"reward_lens_spec/conf/{yaml.relative_to(ROOT / 'conf')}" in names, yaml
    return wheel


def _install_deps(py: Path, wheel: Path, torch_v: str) -> None:
    _run([py, "-m", "pip", "install", "--quiet", f"torch=={torch_v}"], timeout=1800)
    _run([py, "-m", "pip", "install", "--quiet", f"{wheel}[full]"], timeout=1800)


def _site(env_dir: Path) -> Path:
    return next((env_dir / "lib").glob("python3*/site-packages"))


def _venv(tmp_path: Path, wheel: Path) -> Path:
    import fcntl

    import torch

    zf = zipfile.ZipFile(wheel)
    meta = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
    reqs = sorted(line for line in meta.splitlines() if line.startswith("Requires-Dist:"))
    torch_v = torch.__version__.split("+")[0]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=True)
    py = env_dir / "bin" / "python"
    if os.environ.get("REWARD_LENS_SPEC_FRESH_VENV") == "1":
        _install_deps(py, wheel, torch_v)
    else:
        key = hashlib.sha256(json.dumps([sys.version, torch_v, reqs]).encode()).hexdigest()[:16]
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reward_lens_spec" / "wheel_deps"
        root.mkdir(parents=True, exist_ok=True)
        deps = root / key
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)                  # one builder; others wait, then read
            if not (deps / "installed").is_file():
                shutil.rmtree(deps, ignore_errors=True)
                venv.create(deps, system_site_packages=False, with_pip=True)
                _install_deps(deps / "bin" / "python", wheel, torch_v)
                _run([deps / "bin" / "python", "-m", "pip", "uninstall", "--quiet", "-y", "reward_lens_spec"])
                (deps / "installed").write_text("\n".join([torch_v] + reqs))
        (_site(env_dir) / "_reward_lens_spec_deps.pth").write_text(f"import site; site.addsitedir({str(_site(deps))!r})\n")
    _run([py, "-m", "pip", "install", "--quiet", "--no-deps", wheel], timeout=600)
    return env_dir


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_every_command_and_a_users_own_study(tmp_path):
    wheel = _wheel(tmp_path)
    env_dir = _venv(tmp_path, wheel)
    py, exe = env_dir / "bin" / "python", env_dir / "bin" / "reward-lens-spec"
    out = _run([py, "-c", "import sys, reward_lens_spec as r; print(sys.base_prefix, sys.path, r.__file__)"],
               cwd=tmp_path).stdout
    base = out.split()[0]
    assert f"{base}/lib/python3.{sys.version_info.minor}/site-packages" not in out         # no system site packages
    assert out.split()[-1].startswith(str(env_dir))                                      # the wheel, not the checkout
    work = tmp_path / "my_study"                           # the user's folder: their YAML, their data
    (work / "conf" / "observable").mkdir(parents=True)
    (work / "conf" / "observable" / "dla_total.yaml").write_text(OBS)
    (work / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    where = _run([py, "-c", "from reward_lens_spec.paths import conf_dir; print(conf_dir())"], cwd=work)
    assert where.stdout.strip().startswith(str(env_dir))      # the wheel's own config tree

    helps = _run([exe, "--help"], cwd=work).stdout
    from reward_lens_spec.cli import COMMANDS
    for cmd in COMMANDS:                                       # each command's module imports from the wheel
        assert _run([exe, cmd, "--help"], cwd=work).stdout.startswith("reward-lens-spec"), cmd
        assert cmd in helps
    _run([exe, "ops"], cwd=work)
    _run([exe, "ops", "select"], cwd=work)
    _run([exe, "validate", "--config-dir", "conf", "observable=dla_total"], cwd=work)

    fields = ["dataset=jsonl", "dataset.path=q.jsonl", "dataset.fields.prompt=question",
              "dataset.fields.chosen=good", "dataset.fields.rejected=bad"]
    res = _run([exe, "--config-dir", "conf", "observable=dla_total", *fields], cwd=work)
    assert "trust exploratory" in res.stdout and f"store: {work / 'outputs' / 'store.zarr'}" in res.stdout
    assert sorted(p.name for p in work.iterdir()) == ["conf", "outputs", "q.jsonl"]       # no run folder
    run_id = res.stdout.split("run id: ")[1].split()[0]
    direct = json.loads(_run([py, "-c", DIRECT, work / "q.jsonl"], cwd=work).stdout)
    got = json.loads(_run([py, "-c", READ, work / "outputs" / "store.zarr", run_id, "dla_total"],
                          cwd=work).stdout)
    assert len(set(got["pair"])) == 3 and all(p.startswith("pair-") for p in got["pair"])   # ids from content
    assert got["run_id"] == run_id
    for a, b in zip(got["total"], direct):                    # Σ dla = margin of the model's own logits
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (got["total"], direct)

    url = "outputs/store.zarr"
    _run([exe, "model=tiny_llama", *fields], cwd=work)
    _run([exe, "model=tiny", *fields], cwd=work)
    ids = _run([py, "-c", f"import reward_lens_spec as r; print(' '.join(r.open_store('{url}').runs().run_id))"],
               cwd=work).stdout.split()
    score = [i for i in ids if i.startswith("score-")]
    assert len(score) == 2
    _run([exe, "store", "ls", f"url={url}"], cwd=work)
    _run([exe, "store", "show", f"url={url}", f"run={run_id}"], cwd=work)
    _run([exe, "store", "diff", f"url={url}", f"a={score[0]}", f"b={score[1]}"], cwd=work)
    _run([exe, "compare", f"url={url}", f"a={score[0]}", f"b={score[1]}", "vars=margin", "n_boot=50",
          "n_perm=50"], cwd=work)
    _run([exe, "report", f"url={url}", f"run={run_id}", "out=report"], cwd=work)
    assert any((work / "report").iterdir())
    _run([exe, "freeze", "experiment=example_dla_mlp", "store.url=studies.zarr"], cwd=work)
    _run([py, "-c", "import hydra_plugins.hydra_joblib_launcher, hydra_plugins.hydra_submitit_launcher"])
