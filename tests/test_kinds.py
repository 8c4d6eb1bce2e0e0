"""Kinds of reward signal as self-describing objects (``kinds``): every reference resolves, every kind's files are
its folder's and key the fingerprint cache, and a new kind is one folder plus one registration line (followed here on
a scratch copy of the package, through the real executor)."""
from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reward_lens_spec import kinds
from reward_lens_spec.errors import SpecError
from reward_lens_spec.kinds.base import Kind, Lazy
from reward_lens_spec.models import fingerprint_cache
from reward_lens_spec.spec import ModelSpec
from reward_lens_spec.trust.criteria import CRITERIA

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "reward_lens_spec"


def test_the_table_holds_each_kind_once_under_its_own_name():
    assert list(kinds.KINDS) == ["classifier", "judge", "prm", "implicit", "ensemble"]
    assert all(isinstance(k, Kind) and k.name == name for name, k in kinds.KINDS.items())
    with pytest.raises(SpecError, match=r"model.kind: unknown kind of reward signal 'jugde'.*judge"):
        kinds.get_kind("jugde")


@pytest.mark.parametrize("name", list(kinds.KINDS))
def test_every_reference_of_every_kind_resolves_to_a_function_in_its_own_folder(name):
    k = kinds.KINDS[name]
    assert "load" in k.callables()
    for field, ref in k.callables().items():
        fn = ref.resolve() if isinstance(ref, Lazy) else ref
        assert callable(fn) and not isinstance(fn, Lazy), (name, field)
        home = "reward_lens_spec.models.loading" if name == "classifier" and field == "load" else k.package
        assert fn.__module__ == home or fn.__module__.startswith(home + "."), (name, field, fn.__module__)


@pytest.mark.parametrize("name", list(kinds.KINDS))
def test_every_kind_names_criteria_that_grade_its_own_organisms(name):
    k = kinds.KINDS[name]
    by_name = {c.name: c for c in CRITERIA}
    for c in k.criteria:
        assert c in by_name, (name, c)
        assert set(by_name[c].kinds) <= set(k.organisms), (name, c, by_name[c].kinds)
    graded = {c.name for c in CRITERIA if set(c.kinds) & set(k.organisms)}
    assert graded == set(k.criteria)


def test_a_kinds_files_are_its_whole_folder_and_inside_the_package_digest():
    for name, k in kinds.KINDS.items():
        folder = PACKAGE / "kinds" / name
        assert k.files() == tuple(sorted(folder.rglob("*.py"))), name
        assert all(PACKAGE in p.parents for p in k.files())        # so signed_cache.package_digest covers them


def test_a_kinds_code_digest_reads_every_file_of_its_folder(tmp_path, monkeypatch):
    pkg = tmp_path / "scratch_kind_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "loader.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    k = Kind("scratch", "a scratch kind", "scratch_kind_pkg", load=Lazy("json", "loads"))
    assert [p.name for p in k.files()] == ["__init__.py", "loader.py"]
    before = k.code_digest()
    (pkg / "sub" / "loader.py").write_text("x = 2\n")                  # a file one folder down
    assert k.code_digest() != before
    (pkg / "sub" / "loader.py").write_text("x = 1\n")
    assert k.code_digest() == before


def test_the_fingerprint_cache_key_of_a_kind_carries_its_code(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    judge, classifier = ModelSpec(source=str(ckpt), kind="judge"), ModelSpec(source=str(ckpt))
    before, plain = fingerprint_cache.weights_key(judge), fingerprint_cache.weights_key(classifier)
    assert before is not None and before != plain
    monkeypatch.setattr(Kind, "code_digest", lambda self: "0" * 64)    # as if a file of kinds/judge/ changed
    assert fingerprint_cache.weights_key(judge) != before
    assert fingerprint_cache.weights_key(classifier) == plain           # a classifier's key keeps its old form
    assert fingerprint_cache.weights_key(ModelSpec(source=str(ckpt), kind="implicit")) is None   # a reference


def test_the_recipe_in_the_table_docstring_names_what_the_scratch_test_does():
    doc = inspect.getdoc(kinds)
    assert "kinds/<name>/__init__.py" in doc and "from .<name> import KIND as <NAME>" in doc


SCRATCH_KIND = '''"""``model.kind=negated``: a scratch kind, the classifier's reward negated (tests/test_kinds.py)."""
from ..base import Kind, Lazy

KIND = Kind("negated", "the classifier's reward, negated", __name__, load=Lazy(__name__ + ".loader", "load_negated"))
'''
SCRATCH_LOADER = '''import torch

from ...models.head import get_module
from ...models.loading import load_model, wrap_model


def load_negated(spec, base_dir=None):
    lm = load_model(spec, base_dir)
    head = get_module(lm.model, lm.family.head)
    with torch.no_grad():
        head.weight.neg_()
        if head.bias is not None:
            head.bias.neg_()
    return wrap_model(lm.name, lm.model, lm.tokenizer)
'''
SCRATCH_RUN = '''import json, sys
import reward_lens_spec
from reward_lens_spec.run import compose_run, execute
assert reward_lens_spec.__file__.startswith(sys.argv[1]), reward_lens_spec.__file__
out = {}
for kind in ("classifier", "negated"):
    run, y = compose_run(["model=tiny", "observable=score", "dataset.limit=4", f"model.kind={kind}"])
    got = execute(run, resolved_yaml=y, base_dir=sys.argv[1], store_url=sys.argv[1] + "/s.zarr", progress=False)
    out[kind] = {"status": got.status, "run_id": got.run_id, "margin": got.result["margin"].values.tolist()}
print(json.dumps(out))
'''


def test_a_new_kind_is_one_folder_and_one_registration_line_run_by_the_executor(tmp_path):
    """The recipe of ``kinds/__init__.py`` on a scratch copy: the classifier with its head negated gives exactly the
    classifier's margins negated, under its own run id."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(PACKAGE, tmp_path / "reward_lens_spec", ignore=ignore)
    shutil.copytree(ROOT / "conf", tmp_path / "conf", ignore=ignore)
    folder = tmp_path / "reward_lens_spec" / "kinds" / "negated"
    folder.mkdir()
    (folder / "__init__.py").write_text(SCRATCH_KIND)
    (folder / "loader.py").write_text(SCRATCH_LOADER)
    table = tmp_path / "reward_lens_spec" / "kinds" / "__init__.py"
    anchor = "from .ensemble import KIND as ENSEMBLE\n"
    src = table.read_text()
    assert src.count(anchor) == 1
    table.write_text(src.replace(anchor, anchor + "from .negated import KIND as NEGATED\n"))
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "REWARD_LENS_SPEC_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", SCRATCH_RUN, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    plain, negated = out["classifier"], out["negated"]
    assert plain["status"] == negated["status"] == "complete"
    assert len(plain["margin"]) == 4 and negated["margin"] == [-m for m in plain["margin"]]
    assert negated["run_id"] != plain["run_id"]
