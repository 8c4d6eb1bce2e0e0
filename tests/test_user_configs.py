"""A user's own study: their own config folder and files, help, restrictions, Fix lines that work.

Every check runs the console script in a subprocess from a temp directory, as a user would.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from reward_lens_spec import open_store

OBS = """\
# late DLA: direct linear attribution summed over the last two layers of the 4-layer tiny model
include: [dla]
steps:
  - {name: dla_late, op: select, input: dla, dim: layer, values: [2, 3]}
  - {name: dla_late_total, op: reduce, input: dla_late, dim: layer, how: sum}
outputs: [dla_late_total]
"""
ROWS = [{"question": f"What is {i} + {i}?", "good": f"It is {2 * i}.", "bad": f"Perhaps {i + 5}."} for i in range(3)]


def cli(cwd, *args, env=None, timeout=600):
    exe = Path(sys.executable).parent / "reward-lens-spec"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reward_lens_spec"]
    return subprocess.run(cmd + [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


@pytest.fixture()
def study(tmp_path):
    (tmp_path / "conf" / "observable").mkdir(parents=True)
    (tmp_path / "conf" / "observable" / "late_dla.yaml").write_text(OBS)          # no name: the stem names it
    (tmp_path / "my_obs.yaml").write_text(OBS)                       # no name: named after the file
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def test_own_observable_by_folder_and_by_path_runs_and_matches_direct_dla(study):
    fields = ["dataset=jsonl", "dataset.path=q.jsonl", "dataset.fields.prompt=question",
              "dataset.fields.chosen=good", "dataset.fields.rejected=bad"]
    a = cli(study, "--config-dir", "conf", "observable=late_dla", *fields)
    assert a.returncode == 0, a.stderr
    b = cli(study, "observable=./my_obs.yaml", *fields)
    assert b.returncode == 0, b.stderr
    c = cli(study, "observable=dla", *fields)
    assert c.returncode == 0, c.stderr
    assert sorted(p.name for p in study.iterdir()) == ["conf", "my_obs.yaml", "outputs", "q.jsonl"]
    assert sorted(p.name for p in (study / "outputs").iterdir()) == ["store.zarr"]   # no run folder, no log
    url = study / "outputs" / "store.zarr"
    st = open_store(str(url))
    rid = {r.split("-")[0]: r for r in st.runs()["run_id"]}
    assert set(rid) == {"late_dla", "my_obs", "dla"}
    dla = st.load(rid["dla"], "dla", lazy=False)["dla"]
    ids = list(dla["pair"].values)                 # the user's 3 rows, mapped; no id field: ids from content
    assert len(set(ids)) == 3 and all(i.startswith("pair-") and len(i) == 21 for i in ids)
    direct = dla.sel(layer=[2, 3]).sum("layer", min_count=1)          # embed has no layer 2, 3: NaN
    for name in ("late_dla", "my_obs"):
        got = st.load(rid[name], name, lazy=False)["dla_late_total"]
        np.testing.assert_allclose(got.transpose(*direct.dims).values, direct.values, rtol=0, atol=1e-7)
    with warnings.catch_warnings():                                            # plain xarray, as docs/results.md
        warnings.simplefilter("error")
        late = ds = xr.open_zarr(str(url), group=f"runs/{rid['my_obs']}/my_obs")
    assert ds.attrs["run_id"] == rid["my_obs"] and ds.attrs["trust"] == "exploratory"
    # outputs: decides what is stored: the included dla's outputs only where listed (issue 30)
    assert set(ds.attrs["gauge"]) == set(ds.data_vars) == {"dla_late_total"}
    np.testing.assert_allclose(late["dla_late_total"].transpose(*direct.dims).values, direct.values, atol=1e-7)
    assert ds.attrs["gauge"]["dla_late_total"] == "invariant" and ds.attrs["units"]["dla_late_total"] == "reward"
    assert ds.attrs["model_fingerprint"] == st.provenance(rid["my_obs"])["model_fingerprint"]
    again = cli(study, "observable=./my_obs.yaml", *fields)                   # reused: the summary still prints
    assert again.returncode == 0, again.stderr
    line = next(x for x in again.stdout.splitlines() if x.startswith(f"run {rid['my_obs']}:"))
    assert "reused" in line and "trust exploratory" in line and "flagged 0" in line and "excluded 0" in line
    assert f"store: {url}" in again.stdout


def test_own_files_get_the_built_in_checks(study):
    conf = study / "conf" / "observable"
    (conf / "typo.yaml").write_text("name: typo\nstepz: []\n")
    (study / "bad_op.yaml").write_text("steps:\n  - {name: x, op: selekt, input: reward}\noutputs: [x]\n")
    cases = [
        (["--config-dir", "conf", "observable=late_dl"], "Did you mean 'late_dla'"),
        (["--config-dir", "conf", "observable=typo"], "Did you mean 'steps'"),
        (["observable=./bad_op.yaml"], "Did you mean 'select'"),
        (["observable=./nope.yaml"], "no observable file './nope.yaml'"),
        (["--config-dir", "no_such_dir", "observable=score"], "is not a folder"),
    ]
    for args, needle in cases:
        res = cli(study, "validate", *args)
        assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
    ok = cli(study, "validate", f"hydra.searchpath=[file://{study / 'conf'}]", "observable=late_dla")
    assert ok.returncode == 0 and "dla_late_total" in ok.stdout, ok.stderr
    (study / "conf" / "model").mkdir()
    (study / "conf" / "model" / "tiny.yaml").write_text("name: mine\n")       # would be shadowed by the built-in
    res = cli(study, "validate", "--config-dir", "conf")
    assert res.returncode == 2 and "built-in option" in res.stderr and "Fix: rename" in res.stderr


def _fix(stderr: str) -> str:
    return stderr.split("Fix: ", 1)[1].strip()


def test_fix_lines_are_commands_that_work(study):
    """Follow each error's Fix as printed until the command runs."""
    (study / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    args = ["dataset=jsonl", "dataset.path=m.jsonl", "dataset.fields.prompt=question", "store.url=s.zarr"]
    for _ in range(3):                                 # chosen, then rejected, then it runs
        res = cli(study, *args)
        if res.returncode == 0:
            break
        m = re.search(r"set (dataset\.fields\.\w+)=<key>", _fix(res.stderr))
        assert m, res.stderr
        key = re.search(r"has no key '\w+' for field '(\w+)'", res.stderr).group(1)
        args.append(f"{m.group(1)}={ {'chosen': 'good', 'rejected': 'bad'}[key] }")
    assert res.returncode == 0 and len(args) == 6, res.stderr
    bad = cli(study, "validate", "observable=patch", "observable.layers=[7]")
    assert bad.returncode == 2 and "observable.layers" in bad.stderr
    fix = re.search(r"observable\.layers=\[\d+\]", _fix(bad.stderr)).group(0)
    assert cli(study, "validate", "observable=patch", fix).returncode == 0
    rep = cli(study, "report")
    assert rep.returncode == 2
    cmd = _fix(rep.stderr).split()
    assert cmd[0] == "reward-lens-spec"
    follow = cli(study, *[a.replace("outputs/store.zarr", "s.zarr") for a in cmd[1:]], "out=rep")
    assert follow.returncode == 0 and (study / "rep").is_dir(), follow.stderr


@pytest.mark.parametrize("args,key", [
    (["observable=dla", "observable.layers=[1]"], "observable.layers"),          # DLA reads every layer
    (["observable=lens", "observable.pairs=3"], "observable.pairs"),
    (["observable=score", "observable.components=[mlp]"], "observable.components"),
    (["observable=dla", "observable.layers=[7]"], "observable.layers"),           # out of range, any observable
    (["observable=patch", "observable.components=[embed]"], "observable.components"),
])
def test_restrictions_are_honoured_or_refused_naming_the_key(tmp_path, args, key):
    res = cli(tmp_path, "validate", *args)
    assert res.returncode == 2 and res.stderr.startswith(f"error: {key}:") and "Fix: " in res.stderr, res.stderr


def test_restriction_restricts_the_outputs_it_names(tmp_path):
    res = cli(tmp_path, "validate", "observable=battery", "observable.layers=[1]")
    assert res.returncode == 0, res.stderr
    assert "observable.layers=[1] restricts: patch_effect, patch_restored" in res.stdout


def test_help_lists_commands_groups_and_each_commands_arguments(tmp_path):
    from reward_lens_spec.cli import COMMANDS
    from reward_lens_spec.paths import group_options

    for flag in ("--help", "help", "-h"):
        res = cli(tmp_path, flag)
        assert res.returncode == 0, res.stderr
        out = res.stdout
        for cmd in COMMANDS:
            if cmd != "run":
                assert re.search(rf"^  {cmd} +\S", out, re.M), cmd
        for group in ("model", "dataset", "observable", "frame", "store", "experiment"):
            for opt in group_options(group):
                assert opt in out, opt
        assert "schema" not in out
        assert max(map(len, out.splitlines())) <= 100
    for cmd in COMMANDS:
        res = cli(tmp_path, cmd, "--help")
        assert res.returncode == 0 and res.stdout.startswith("reward-lens-spec"), (cmd, res.stderr)
    assert "url=" in cli(tmp_path, "store", "--help").stdout
    assert "fit.max_pairs" in cli(tmp_path, "fit", "--help").stdout


def test_ops_shows_params_defaults_dims_and_whole_docstring(tmp_path):
    from reward_lens_spec.registry import OPERATORS, _load_builtin_ops

    _load_builtin_ops()                 # every built-in, not only those earlier tests imported
    assert len(OPERATORS) >= 40
    res = cli(tmp_path, "ops")
    assert res.returncode == 0, res.stderr
    assert "dim: str (required); index: Optional[Any] = None; values: Optional[list] = None" in res.stdout
    assert "x (…, dim, …) → without dim (index) or same dims (values)" in res.stdout
    for name, cls in OPERATORS.items():
        assert re.search(rf"^{name} +{re.escape(cls.__doc__.strip().splitlines()[0])}$", res.stdout, re.M), name
        assert cls.dims, name
    one = cli(tmp_path, "ops", "patch")
    assert one.returncode == 0 and "``observable.layers``" in one.stdout        # the module docstring too
    typo = cli(tmp_path, "ops", "selct")
    assert typo.returncode == 2 and "Did you mean 'select'" in typo.stderr


def test_store_ls_fits_100_columns_and_diff_takes_compare_vocabulary(tmp_path):
    for limit in (2, 3):
        assert cli(tmp_path, f"dataset.limit={limit}", "store.url=s.zarr").returncode == 0
    ls = cli(tmp_path, "store", "ls", "url=s.zarr")
    assert ls.returncode == 0 and max(map(len, ls.stdout.splitlines())) <= 100, ls.stdout
    fp = open_store(str(tmp_path / "s.zarr")).runs()["model_fingerprint"][0]
    assert fp[:8] in ls.stdout and fp not in ls.stdout
    assert fp in cli(tmp_path, "store", "ls", "url=s.zarr", "--wide").stdout
    a, b = open_store(str(tmp_path / "s.zarr")).runs()["run_id"]
    new = cli(tmp_path, "store", "diff", "url=s.zarr", f"a={a}", f"b={b}")
    old = cli(tmp_path, "store", "diff", "url=s.zarr", f"run={a}", f"run_b={b}")
    assert new.returncode == 0 and new.stdout == old.stdout and "limit: 2" in new.stdout


def test_missing_optional_dependency_is_one_line_naming_the_extra(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from reward_lens_spec.cli import main; main(['report', 'url=x.zarr', 'format=png'])")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "reward_lens_spec[full]" in res.stderr
    from reward_lens_spec import overrides
    from reward_lens_spec.errors import SpecError
    overrides.LAUNCHER_PLUGINS["nope"] = ("hydra_plugins.no_such_launcher", "no-such-launcher")
    try:
        with pytest.raises(SpecError, match=r"reward_lens_spec\[full\]"):
            overrides.prepare_overrides(["-m", "hydra/launcher=nope"])
    finally:
        del overrides.LAUNCHER_PLUGINS["nope"]


@pytest.mark.parametrize("flag", ["-m", "--multirun"])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_the_multirun_flag_is_taken_wherever_it_is_typed(tmp_path, flag, where):
    """``-m`` after an override (``--config-dir conf dataset=x -m observable=a,b``): Hydra's own argument parser
    reads the prepared command line as a multirun of both overrides, not as unrecognized arguments."""
    from hydra._internal.utils import get_args_parser

    from reward_lens_spec import overrides

    conf = tmp_path / "conf"
    (conf / "observable").mkdir(parents=True)
    typed = ["dataset=diagnostic", "observable=score,dla"]
    argv = ["--config-dir", str(conf), *typed[:where], flag, *typed[where:]]
    args = get_args_parser().parse_args(overrides.prepare_overrides(argv))
    assert args.multirun and args.overrides[:2] == typed
    assert args.overrides[2].startswith("hydra.searchpath=[file://")
