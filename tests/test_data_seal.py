"""The seal covers the data (issue 26): every stored array's digest is in the sealed run document and
checked on read; chunks carry a crc32c checksum; resume re-verifies the chunks it adopts."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import xarray as xr
import zarr

from reward_lens_spec import open_store
from reward_lens_spec.errors import StoreError
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.run.stream import stream
from reward_lens_spec.spec import StoreSpec
from reward_lens_spec.store import catalog_cli
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.digest import KEY
from reward_lens_spec.store.layout import check_layout
from reward_lens_spec.trust.evidence import seal
from tests.conftest import make_pairs, tiny_lm
from tests.test_streaming import TEMPLATE, plan_of

N, CHUNK = 24, 2          # 12 chunks


@pytest.fixture(scope="module")
def setup():
    lm, pairs = tiny_lm("tiny_llama"), make_pairs(N)
    plan, info = plan_of(lm, "dla")
    enc = encode_pairs(lm.tokenizer, pairs, fmt="plain", template=TEMPLATE, max_length=512)
    return lm, pairs, plan, info, enc


def _stream(setup, url, run_id="r", **spec):
    lm, pairs, plan, info, enc = setup
    b = Backend(url)
    check_layout(b, create=True)
    attrs = lambda counts, chunks, stored, logits: seal({"observables": [plan.observable], "chunks": chunks,  # noqa: E731
                                                         "gauge": {v: "x" for v in stored.data_vars}})
    return stream(b, run_id, lm, pairs, enc, plan, info, capture_kw=dict(batch_size=4), frame=None,
                  store_spec=StoreSpec(chunk_pairs=CHUNK, **spec), run_attrs=attrs)


@pytest.fixture(scope="module")
def pristine(setup, tmp_path_factory):
    url = str(tmp_path_factory.mktemp("seal") / "pristine.zarr")
    assert _stream(setup, url).status == "complete"
    return url


def _group(url, run_id="r"):
    return os.path.join(url, "runs", run_id, "dla")         # the published observable


def _arr(url, path):
    return zarr.open_array(store=zarr.storage.LocalStore(url), path=os.path.relpath(path, url), mode="r+")


def _chunks(d):
    """Chunk files of the array at ``d``, in order along its first (pair) axis (chunk keys ``c/0/1`` in an
    attempt, ``c.0.1`` where published)."""
    flat = sorted((f for f in os.listdir(d) if f.startswith("c.")), key=lambda f: [int(x) for x in f.split(".")[1:]])
    if flat:
        return [os.path.join(d, f) for f in flat]
    out = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(d, "c")) for f in fs]
    return sorted(out, key=lambda p: [int(x) for x in os.path.relpath(p, os.path.join(d, "c")).split(os.sep)])


def _replace_bytes(url, g):
    c = _chunks(os.path.join(g, "dla"))
    shutil.copyfile(c[1], c[0])


def _reencode(url, g):
    a = _arr(url, os.path.join(g, "dla"))
    v = a[3]
    a[3] = v + 1.0                      # decoded, edited, encoded again: its checksum is valid


def _bit_flip(url, g):
    p = _chunks(os.path.join(g, "dla"))[2]
    raw = bytearray(open(p, "rb").read())
    raw[len(raw) // 2] ^= 0x10
    open(p, "wb").write(bytes(raw))


def _delete_chunk(url, g):
    os.remove(_chunks(os.path.join(g, "dla"))[0])     # reads back as fill (NaN)


def _swap_labels(url, g):
    a = _arr(url, os.path.join(g, "pair"))
    v = a[:]
    v[[0, 1]] = v[[1, 0]]
    a[:] = v


def _dla_times_ten(url, g):
    a = _arr(url, os.path.join(g, "dla"))
    a[:] = a[:] * 10


TAMPER = {"bytes_replaced": _replace_bytes, "value_reencoded": _reencode, "bit_flip": _bit_flip,
          "chunk_deleted": _delete_chunk, "labels_swapped": _swap_labels, "dla_times_ten": _dla_times_ten}


def test_pristine_run_reads_and_verifies(pristine, capsys):
    st = open_store(pristine)
    doc = st.document("r")
    assert set(doc[KEY]["dla"]) == {"dla", "dla_heads"} and doc["content_hash"]
    res = st.load("r", "dla", lazy=False)
    assert np.isfinite(res["dla"].values).any()
    lazy = st.load("r", "dla")
    np.testing.assert_array_equal(lazy["dla"].values, res["dla"].values)
    assert st.runs().trust_verified.all()
    assert catalog_cli.main(["verify", f"url={pristine}"]) == 0
    assert "r  verified" in capsys.readouterr().out
    meta = json.load(open(os.path.join(_group(pristine), "dla", "zarr.json")))
    assert {"name": "crc32c"} in meta["codecs"]


@pytest.mark.parametrize("how", list(TAMPER))
def test_tampered_data_are_caught_on_read(how, pristine, tmp_path, capsys):
    url = str(tmp_path / "t.zarr")
    shutil.copytree(pristine, url)
    var = "dla"
    TAMPER[how](url, _group(url))
    st = open_store(url)
    with pytest.raises(StoreError, match=r"run r\b.*dla") as e:
        st.load("r", "dla", lazy=False)
    assert "r" in str(e.value) and (var in str(e.value) or "pair" in str(e.value))
    verdict = st.trust("r")
    assert verdict["trust_verified"] is False and "digest" in verdict["trust_reason"]
    assert not st.runs().trust_verified.any()
    with pytest.raises(Exception, match="digest|checksum|crc|Checksum|decode"):      # lazy: caught when read
        open_store(url).load("r", "dla")[var].values
    assert catalog_cli.main(["verify", f"url={url}", "run=r"]) == 1
    policy, *out = capsys.readouterr().out.strip().splitlines()          # the reader's signer policy first
    assert policy.startswith("signer-policy  ") and len(out) == 1 and out[0].startswith("r  FAILED"), out
    if how == "labels_swapped":                                        # show reads coords, not data
        assert catalog_cli.main(["show", f"url={url}", "run=r"]) == 2


def test_an_edited_digest_breaks_the_seal(pristine, tmp_path):
    url = str(tmp_path / "d.zarr")
    shutil.copytree(pristine, url)
    p = os.path.join(url, "runs", "r", "zarr.json")
    doc = json.load(open(p))
    blocks = doc["attributes"][KEY]["dla"]["dla"]["blocks"]
    blocks[0] = blocks[1]
    json.dump(doc, open(p, "w"))
    st = open_store(url)
    assert st.trust("r")["trust_verified"] is False
    assert catalog_cli.main(["verify", f"url={url}"]) == 1


def assert_same_dla(url, want_url) -> None:
    """Run ``r``'s ``dla`` outputs in ``url`` equal, value for value, those in ``want_url``."""
    got = open_store(url).load("r", "dla", lazy=False)
    want = open_store(want_url).load("r", "dla", lazy=False)
    for v in want:
        np.testing.assert_array_equal(got[v].values, want[v].values, err_msg=v)


def _mark_dir(url, run_id="r"):
    attempts = os.path.join(url, "_internal", "attempts", run_id)
    (att,) = [a for a in os.listdir(attempts) if a.startswith("attempt-")]
    return os.path.join(attempts, att)


@pytest.mark.parametrize("completer_checks", [False, True])
def test_resume_recomputes_chunks_whose_data_do_not_match_their_marker(setup, pristine, tmp_path,
                                                                         completer_checks):
    """Half the chunks are in (shard 0 of 2), then a marked dla chunk is copied over another and a
    head-logit ("reward") chunk deleted. The same job again (``completer_checks=False``), or only the job
    that completes the run, must recompute them: the result equals an untouched run."""
    url = str(tmp_path / "resume.zarr")
    assert _stream(setup, url, shards=2, shard=0, launch="L").status == "shard_done"
    d = _mark_dir(url)
    assert len([f for f in os.listdir(os.path.join(d, "_ctl")) if f.startswith("chunk.")]) == 6
    c = _chunks(os.path.join(d, "dla", "dla_heads", "dla_heads"))     # per-pair output (dla: a reduction)
    shutil.copyfile(c[2], c[0])                                   # both marked (shard 0's chunks 0 and 4)
    os.remove(_chunks(os.path.join(d, "_stage", "head_logits", "head_logits"))[2])
    if not completer_checks:
        assert _stream(setup, url, shards=2, shard=0, launch="L").status == "shard_done"
    assert _stream(setup, url, shards=2, shard=1, launch="L").status == "complete"
    assert_same_dla(url, pristine)
    assert catalog_cli.main(["verify", f"url={url}"]) == 0


def test_the_attempt_holds_the_pair_labels_once(pristine):
    """A streamed run writes the pair labels to the observable's group only: no variable group keeps a copy of the
    ``pair`` ids, and the scratch group (read by the reductions, here ``dla``'s) has no labels of its own. The
    published Dataset still has every label, and each variable reads back with the labels' ids."""
    d = _mark_dir(pristine)
    labels = {"pair", "dimension", "prompt_id"}
    assert labels <= set(os.listdir(os.path.join(d, "dla")))
    for group in ("dla", "_stage"):
        for var in [v for v in os.listdir(os.path.join(d, group)) if os.path.isdir(os.path.join(d, group, v))]:
            if var not in labels and os.path.exists(os.path.join(d, group, var, var, "zarr.json")):
                assert "pair" not in os.listdir(os.path.join(d, group, var)), f"{group}/{var}"
    assert not labels & set(os.listdir(os.path.join(d, "_stage")))
    ds = xr.open_zarr(_group(pristine), consolidated=False)
    assert labels <= set(ds.coords) and ds.sizes["pair"] == len(ds["pair"])
    got = open_store(pristine).load("r", "dla", lazy=False)
    for v in got:
        if "pair" in got[v].dims:
            assert list(got[v]["pair"].values) == list(ds["pair"].values)


def test_every_forced_run_recomputes_never_adopting_an_attempt_that_completed(setup, tmp_path):
    """``store.force=true`` recomputes: a forced run used to adopt the attempt an earlier forced run had replaced
    (no longer named, its role free, its chunks marked) and republish its chunks ("resumed: 1 of 1 chunk(s)").
    Each forced run computes every chunk in an attempt of its own, and the numbers stay the same."""
    url = str(tmp_path / "forced.zarr")
    first = _stream(setup, url)
    assert first.status == "complete" and first.computed == first.chunks
    first_url = str(tmp_path / "first.zarr")
    shutil.copytree(url, first_url)                        # the first run's numbers, as stored
    published = [first.attempt]
    for _ in range(3):
        again = _stream(setup, url, force=True)
        assert again.status == "complete" and again.computed == again.chunks, again
        published.append(again.attempt)
    assert len(set(published)) == 4, published
    assert_same_dla(url, first_url)


@pytest.mark.parametrize("gone", ["dla/dla_heads", "dla", "_stage/head_logits"])
def test_an_attempt_that_lost_a_recorded_array_is_refused_in_one_line_then_runs_again(setup, pristine, tmp_path,
                                                                                        gone):
    """A marked chunk's array or group removed by hand: resuming used to recompute the chunk into an array that was
    no longer there (zarr's ``ArrayNotFoundError`` traceback, on every rerun). It is refused in one line naming the
    attempt's folder; following the Fix, the run completes equal to an untouched one."""
    url = str(tmp_path / "lost.zarr")
    assert _stream(setup, url, shards=2, shard=0, launch="L").status == "shard_done"
    d = _mark_dir(url)
    shutil.rmtree(os.path.join(d, *gone.split("/")))
    with pytest.raises(StoreError) as e:
        _stream(setup, url, shards=2, shard=0, launch="L")
    msg = str(e.value)
    assert "\n" not in msg and "cannot be resumed" in msg and "Fix: remove the folder _internal/attempts/r/" in msg, msg
    shutil.rmtree(os.path.join(url, msg.split("Fix: remove the folder ", 1)[1].split(" from the store")[0]))
    assert _stream(setup, url, shards=2, shard=0, launch="L").status == "shard_done"
    assert _stream(setup, url, shards=2, shard=1, launch="L").status == "complete"
    assert_same_dla(url, pristine)
