"""A store URL a run could not write to is refused before any model loads or any pair is read
(``store.layout.check_writable``, where every run crosses: ``run.executor.execute``, and the ``validate``
command): each kind of bad target, by both routes, in one line, nothing there changed."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from reward_lens_spec.cli import main
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.layout import check_layout


def _plain_file(p: Path):
    p.write_text("not a store\n")


def _folder_of_other_files(p: Path):
    p.mkdir()
    (p / "notes.txt").write_text("mine\n")


def _foreign_zarr_group(p: Path):
    p.mkdir()
    (p / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"x": 1}}))


def _garbage_root(p: Path):
    p.mkdir()
    (p / "zarr.json").write_text("{ not json")


def _layout(version):
    def make(p: Path):
        check_layout(Backend(str(p)), create=True)
        doc = json.loads((p / "zarr.json").read_text())
        doc["attributes"]["reward_lens_spec_layout"] = version
        (p / "zarr.json").write_text(json.dumps(doc))
    return make


TARGETS = {"plain file": (_plain_file, "plain file"), "folder of other files": (_folder_of_other_files, "other files"),
           "foreign Zarr group": (_foreign_zarr_group, "did not write"), "garbage root": (_garbage_root, "not valid JSON"),
           "older layout": (_layout(3), "store migrate"), "newer layout": (_layout(99), "upgrade")}


def _digest(p: Path) -> str:
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return hashlib.sha256(b"".join(f.relative_to(p.parent).as_posix().encode() + f.read_bytes() for f in files)).hexdigest()


@pytest.mark.parametrize("route", [[], ["validate"]])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_store_a_run_cannot_write_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys, target, route):
    make, says = TARGETS[target]
    monkeypatch.chdir(tmp_path)
    url = tmp_path / "target.zarr"
    make(url)
    before = _digest(url)

    def loaded(*a, **k):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr("reward_lens_spec.run.executor.load_inputs", loaded)
    monkeypatch.setattr("reward_lens_spec.planning.plan_for", loaded)
    with pytest.raises(SystemExit) as exc:
        main([*route, "observable=score", "dataset.limit=2", f"store.url={url}"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: store") and says in err[0], err
    assert _digest(url) == before


def test_a_new_or_empty_target_passes_and_is_not_created(tmp_path):
    from reward_lens_spec.store.layout import check_writable

    (tmp_path / "empty.zarr").mkdir()
    for name in ("new.zarr", "empty.zarr"):
        check_writable(Backend(str(tmp_path / name)))
    assert not (tmp_path / "new.zarr").exists() and not any((tmp_path / "empty.zarr").iterdir())
