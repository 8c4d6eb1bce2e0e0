"""A resumed writer adopts a marked chunk only when its marker is its user's own, as written (issue 36,
finding 3 and Deliver 4): a writer with store access who alters a chunk's data and rewrites the chunk's
progress marker to the new data's digests before a resume gets the chunk recomputed, never adopted into
the listed run; so does a marker from another chunk or with its tag removed."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from reward_lens_spec import open_store
from reward_lens_spec.store import catalog_cli
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.digest import values_digest
from reward_lens_spec.store.groups import open_variable

from test_data_seal import _chunks, _mark_dir, _stream, assert_same_dla, pristine, setup  # noqa: F401


def forge_marker(url, d, k, how) -> None:
    """Rewrite marker ``chunk.<k>`` after chunk ``k``'s data were altered: its digests re-derived from the
    stored regions now (what the resuming writer compares them with), its tag kept, dropped or copied."""
    path = os.path.join(d, "_ctl", f"chunk.{k}.json")
    m = json.load(open(path))
    rel = os.path.relpath(d, url)
    zs = Backend(url).zarr_store(rel)                   # the attempt's own store: marker keys are its groups
    for key in m["digests"]:
        var, _, coord = key.partition(":")
        group, _, name = var.rpartition("/")
        v = open_variable(zs, group, name).isel(pair=slice(2 * k, 2 * k + 2))
        m["digests"][key] = values_digest((v.coords[coord] if coord else v).values)
    assert all(key.split("/")[0] in ("dla", "_stage") for key in m["digests"]), m["digests"]
    if how == "no_tag":
        m.pop("tag")
    elif how == "other_chunks_tag":
        m["tag"] = json.load(open(os.path.join(d, "_ctl", "chunk.2.json")))["tag"]
    json.dump(m, open(path, "w"))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["keep_tag", "no_tag", "other_chunks_tag"])
@pytest.mark.parametrize("completer_checks", [False, True])
def test_a_rewritten_marker_does_not_get_an_altered_chunk_adopted(setup, pristine, tmp_path, how, completer_checks):
    url = str(tmp_path / "resume.zarr")
    assert _stream(setup, url, shards=2, shard=0, launch="L").status == "shard_done"
    again = _stream(setup, url, shards=2, shard=0, launch="L")           # its own markers: adopted, not redone
    assert again.status == "shard_done" and again.computed == 0
    d = _mark_dir(url)
    c = _chunks(os.path.join(d, "dla", "dla_heads", "dla_heads"))
    shutil.copyfile(c[2], c[0])                          # chunk 0 now holds chunk 2's numbers
    forge_marker(url, d, 0, how)
    if not completer_checks:
        again = _stream(setup, url, shards=2, shard=0, launch="L")
        assert again.status == "shard_done" and again.computed == 1            # chunk 0 only
    assert _stream(setup, url, shards=2, shard=1, launch="L").status == "complete"
    assert_same_dla(url, pristine)
    assert catalog_cli.main(["verify", f"url={url}"]) == 0


# ----------------------------------------------------------------------------- a stalled writer collected

def test_a_stalled_writer_whose_attempt_was_collected_stops_with_one_line(tmp_path, monkeypatch):
    """The writer stalls between creating its attempt's folder and its first lease; `store gc older_than=0`
    runs then (the attempt has no lease yet: no live writer holds it) and collects it. The writer resumes:
    one line naming what happened and the fix, and nothing listed (it used to be "cannot create
    .../_ctl/lease.shard-0.0.json (FileNotFoundError ...)")."""
    from reward_lens_spec.errors import StoreError
    from reward_lens_spec.store import _backend
    from reward_lens_spec.store.attempts import Attempt
    from reward_lens_spec.store.gc import collect_run
    from reward_lens_spec.store.layout import check_layout

    url = str(tmp_path / "s.zarr")
    b = Backend(url)
    check_layout(b, create=True)
    link, collected = os.link, []

    def stalled_link(src, dst):
        if dst.endswith("lease.shard-0.0.json") and not collected:
            collected.append(collect_run(Backend(url), "r", older_than_s=0))     # what a gc meanwhile does
        return link(src, dst)

    monkeypatch.setattr(_backend.os, "link", stalled_link)
    with pytest.raises(StoreError) as e:
        Attempt.create(b, "r", {"shards": 1}, role="shard-0")
    monkeypatch.setattr(_backend.os, "link", link)
    msg = str(e.value)
    assert collected and collected[0], collected
    assert "\n" not in msg and "FileNotFoundError" not in msg and "was removed while this writer was stalled" in msg \
        and msg.endswith("Fix: run the same command again."), msg
    runs = os.path.join(url, "runs")
    left = [a for r in os.listdir(runs) if os.path.isdir(os.path.join(runs, r))
            for a in os.listdir(os.path.join(runs, r))]
    assert len(open_store(url).runs()) == 0 and not [a for a in left if a.startswith("attempt-")], left
