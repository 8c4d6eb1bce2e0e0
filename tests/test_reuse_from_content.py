"""Reuse decided from content (issue 36, finding 2 / Deliver 2): a rerun is reused only when the bytes it would
read are the bytes the stored run read. Files edited under their old size and mtime (what ``cp -p``,
``rsync -t``, ``tar x`` and ``touch -r`` leave), files swapped with ``mv``, and planted or edited entries of the
user's cache (``files``, ``fingerprints``, ``runs``) never bring back another content's numbers."""
from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np
import pytest

from reward_lens_spec import signed_cache
from reward_lens_spec.models import fingerprint_cache
from reward_lens_spec.run import compose_run, execute
from reward_lens_spec.store import open_store

ROWS = [{"prompt": f"Question {i}: is {i} even?", "chosen": "Yes, it is." if i % 2 == 0 else "No, it is odd.",
         "rejected": "Purple." if i % 2 == 0 else "Banana!!!!!!!"} for i in range(4)]


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _swapped(rows) -> list:
    return [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in rows]


def _rewrite_keeping_size_and_mtime(path, data: bytes) -> None:
    """Write ``data`` (the file's size) and set the old access and modification times back, as ``cp -p`` would.
    If the write fell in the filesystem clock's tick of the original one (ctime unchanged), write again."""
    st = path.stat()
    assert len(data) == st.st_size
    for _ in range(200):
        path.write_bytes(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        if path.stat().st_ctime_ns != st.st_ctime_ns:
            break
        time.sleep(0.01)
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def _remember_fresh_files(mp) -> None:
    """Remember every file's digest, however recently written (no racy-clean wait), so that the (size, mtime,
    ctime, inode) key, not a skipped entry, is what must catch an edit."""
    mp.setattr(fingerprint_cache, "RACY_NS", -10**18, raising=False)


def _go(tmp_path, *over, progress=False):
    run, y = compose_run(["observable=score", *over])
    return execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                   progress=progress)


def _margins(tmp_path, out) -> np.ndarray:
    return np.asarray(open_store(str(tmp_path / "s.zarr")).load(out.run_id, "score")["margin"].values).ravel()


def _signed_path(kind: str, digest: str):
    key = signed_cache._key(create=True)
    return signed_cache._folder() / kind / f"{signed_cache._mac(key, kind, digest)}.json"


def _ident(path) -> str:
    """``(device, inode, size, mtime_ns, ctime_ns)`` as ``fingerprint_cache.stat_identity`` writes it."""
    st = path.stat()
    return f"{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def _old_key(path) -> str:
    """The (absolute path, size, mtime) key the file-digest cache used before (to plant its entries too)."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()


# ----------------------------------------------------------------------------- the file digest itself (fast)

def test_a_file_edited_under_its_old_size_and_mtime_is_hashed_again(tmp_path, monkeypatch):
    _remember_fresh_files(monkeypatch)
    f = tmp_path / "pairs.jsonl"
    f.write_bytes(_jsonl(ROWS))
    assert fingerprint_cache.file_sha256(f) == hashlib.sha256(_jsonl(ROWS)).hexdigest()
    _rewrite_keeping_size_and_mtime(f, _jsonl(_swapped(ROWS)))
    assert fingerprint_cache.file_sha256(f) == hashlib.sha256(_jsonl(_swapped(ROWS))).hexdigest()
    assert len(list((signed_cache._folder() / "files").glob("*.json"))) == 2     # both remembered, signed


def test_two_files_of_one_size_and_mtime_swapped_with_mv_keep_their_own_digests(tmp_path, monkeypatch):
    _remember_fresh_files(monkeypatch)
    a, b, tmp = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "t"
    a.write_bytes(_jsonl(ROWS))
    b.write_bytes(_jsonl(_swapped(ROWS)))
    os.utime(a, ns=(0, 10**18))
    os.utime(b, ns=(0, 10**18))
    da, db = fingerprint_cache.file_sha256(a), fingerprint_cache.file_sha256(b)
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)
    assert fingerprint_cache.file_sha256(a) == db == hashlib.sha256(a.read_bytes()).hexdigest()
    assert fingerprint_cache.file_sha256(b) == da == hashlib.sha256(b.read_bytes()).hexdigest()


def test_a_planted_or_edited_digest_entry_is_not_taken(tmp_path, monkeypatch):
    _remember_fresh_files(monkeypatch)
    f = tmp_path / "pairs.jsonl"
    f.write_bytes(_jsonl(ROWS))
    truth = hashlib.sha256(f.read_bytes()).hexdigest()
    fingerprint_cache.file_sha256(f)
    (fingerprint_cache.cache_dir() / "files").mkdir(exist_ok=True)                 # planted where it once lived
    (fingerprint_cache.cache_dir() / "files" / f"{_old_key(f)}.json").write_text(json.dumps({"sha256": "1" * 64}))
    assert fingerprint_cache.file_sha256(f) == truth
    ident = _ident(f)
    path = _signed_path("files", ident)
    signed = json.loads(path.read_text())
    signed["doc"]["sha256"] = "0" * 64                                            # edited, old signature
    path.write_text(json.dumps(signed))
    assert fingerprint_cache.file_sha256(f) == truth
    (signed_cache._folder() / "files" / f"{ident}.json").write_text(            # planted under its plain name
        json.dumps({"doc": {"sha256": "1" * 64}, "mac": "0" * 64}))
    assert fingerprint_cache.file_sha256(f) == truth


def test_a_file_written_within_the_racy_window_is_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprint_cache, "RACY_NS", 10**15, raising=False)   # "recent": any ctime of this test
    f = tmp_path / "pairs.jsonl"
    f.write_bytes(_jsonl(ROWS))                   # an edit within this clock tick could keep its ctime
    assert fingerprint_cache.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()
    assert not list((signed_cache._folder() / "files").glob("*.json"))
    assert not list((fingerprint_cache.cache_dir() / "files").glob("*.json"))      # nor where it once lived


def test_the_builtin_weights_key_covers_every_source_file_of_the_package(monkeypatch):
    run, _ = compose_run(["observable=score"])
    k1 = fingerprint_cache.weights_key(run.model)
    monkeypatch.setitem(signed_cache._PACKAGE_DIGEST, "d", "0" * 64)   # as if any module the builder imports changed
    assert fingerprint_cache.weights_key(run.model) != k1
    assert not hasattr(fingerprint_cache, "_BUILDERS")


# ----------------------------------------------------------------------------- whole runs (slow tier)

@pytest.mark.slow
def test_a_data_file_edited_under_its_old_size_and_mtime_is_recomputed(tmp_path, monkeypatch):
    _remember_fresh_files(monkeypatch)
    data = tmp_path / "pairs.jsonl"
    data.write_bytes(_jsonl(ROWS))
    over = ("dataset.kind=jsonl", f"dataset.path={data}")
    first = _go(tmp_path, *over)
    assert _go(tmp_path, *over).reused                                           # the rerun is reused...
    _rewrite_keeping_size_and_mtime(data, _jsonl(_swapped(ROWS)))               # chosen <-> rejected
    again = _go(tmp_path, *over)
    assert not again.reused and again.run_id != first.run_id                     # ...until the bytes change
    forced = _go(tmp_path, *over, "store.force=true")
    m0, m1, mf = _margins(tmp_path, first), _margins(tmp_path, again), _margins(tmp_path, forced)
    assert np.allclose(m1, mf) and np.allclose(m1, -m0, atol=1e-5)
    assert np.sign(m1.mean()) == np.sign(mf.mean()) == -np.sign(m0.mean()) != 0


@pytest.mark.slow
def test_a_checkpoint_edited_under_its_old_size_and_mtime_is_not_reused(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save

    from reward_lens_spec.models.tiny import build_tiny

    _remember_fresh_files(monkeypatch)
    model, tok = build_tiny("tiny_llama", seed=0)
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    over = (f"model.source={folder}", "dataset.limit=4")
    first = _go(tmp_path, *over)
    assert _go(tmp_path, *over).reused
    weights = folder / "model.safetensors"
    state = load_file(weights)
    name = next(k for k in state if k.endswith("score.weight"))
    state[name] = -state[name]                                                   # the head negated: same size
    _rewrite_keeping_size_and_mtime(weights, save(state, metadata={"format": "pt"}))
    again = _go(tmp_path, *over)
    assert not again.reused and again.run_id != first.run_id
    assert np.allclose(_margins(tmp_path, again), -_margins(tmp_path, first), atol=1e-5)


@pytest.mark.slow
def test_two_data_files_swapped_with_mv_each_give_their_own_numbers(tmp_path, monkeypatch):
    _remember_fresh_files(monkeypatch)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(_jsonl(ROWS))
    b.write_bytes(_jsonl(_swapped(ROWS)))
    for f in (a, b):
        os.utime(f, ns=(0, 10**18))
    over_a, over_b = ("dataset.kind=jsonl", f"dataset.path={a}"), ("dataset.kind=jsonl", f"dataset.path={b}")
    ma, mb = _margins(tmp_path, _go(tmp_path, *over_a)), _margins(tmp_path, _go(tmp_path, *over_b))
    assert np.allclose(ma, -mb, atol=1e-5) and ma.mean() != 0
    os.rename(a, tmp_path / "t")
    os.rename(b, a)
    os.rename(tmp_path / "t", b)
    assert np.allclose(_margins(tmp_path, _go(tmp_path, *over_a)), mb)          # a now holds b's bytes
    assert np.allclose(_margins(tmp_path, _go(tmp_path, *over_b)), ma)
    assert np.allclose(_margins(tmp_path, _go(tmp_path, *over_a, "store.force=true")), mb)


@pytest.mark.slow
def test_validate_refuses_a_file_now_invalid_under_its_old_size_and_mtime(tmp_path, monkeypatch, capsys):
    from reward_lens_spec.cli import main

    _remember_fresh_files(monkeypatch)
    data = tmp_path / "pairs.jsonl"
    data.write_bytes(_jsonl(ROWS))
    monkeypatch.chdir(tmp_path)
    args = ["validate", "observable=score", "dataset.kind=jsonl", f"dataset.path={data}"]
    main(args)
    assert "data OK: 4 pairs" in capsys.readouterr().out
    _rewrite_keeping_size_and_mtime(data, b"{" * len(_jsonl(ROWS)))
    with pytest.raises(SystemExit):
        main(args)
    out = capsys.readouterr()
    assert "data OK" not in out.out and "malformed JSON" in out.err


@pytest.mark.slow
def test_a_planted_file_digest_never_makes_3_pairs_read_as_14(tmp_path, monkeypatch, capsys):
    _remember_fresh_files(monkeypatch)
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"q{i}", "chosen": "yes", "rejected": "no"} for i in range(14)]
    data.write_bytes(_jsonl(rows))
    over = ("dataset.kind=jsonl", f"dataset.path={data}")
    _go(tmp_path, *over)
    digest14 = hashlib.sha256(data.read_bytes()).hexdigest()
    data.write_bytes(_jsonl(rows[:3]))
    (fingerprint_cache.cache_dir() / "files").mkdir(exist_ok=True)            # planted: the 3-pair file's key -> 14's
    (fingerprint_cache.cache_dir() / "files" / f"{_old_key(data)}.json").write_text(json.dumps({"sha256": digest14}))
    for entry in (signed_cache._folder() / "files").glob("*.json"):             # every signed entry edited to say 14
        signed = json.loads(entry.read_text())
        signed["doc"]["sha256"] = digest14
        entry.write_text(json.dumps(signed))
    ident = _ident(data)
    (signed_cache._folder() / "files" / f"{ident}.json").write_text(
        json.dumps({"doc": {"sha256": digest14}, "mac": "0" * 64}))
    capsys.readouterr()
    again = _go(tmp_path, *over, progress=True)
    out = capsys.readouterr().out
    assert "3 of 3 scored" in out and "14 of 14" not in out and not again.reused
    assert _margins(tmp_path, again).shape == (3,)


@pytest.mark.slow
def test_an_edited_runs_entry_for_changed_data_is_not_taken(tmp_path, monkeypatch):
    from reward_lens_spec.run import reuse

    _remember_fresh_files(monkeypatch)
    data = tmp_path / "pairs.jsonl"
    data.write_bytes(_jsonl(ROWS))
    over = ("dataset.kind=jsonl", f"dataset.path={data}")
    first = _go(tmp_path, *over)
    data.write_bytes(_jsonl(_swapped(ROWS)))
    run, y = compose_run(["observable=score", *over])
    key = reuse.reuse_key(run, y, str(tmp_path), None)                   # the new bytes' key -> the old run
    (fingerprint_cache.cache_dir() / "runs").mkdir(exist_ok=True)
    (fingerprint_cache.cache_dir() / "runs" / f"{key}.json").write_text(json.dumps({"run_id": first.run_id}))
    signed_cache.write_signed("runs", key, {"run_id": first.run_id})     # even signed: the stored data sha256 differs
    again = _go(tmp_path, *over)
    assert not again.reused and again.run_id != first.run_id
    assert np.allclose(_margins(tmp_path, again), -_margins(tmp_path, first), atol=1e-5)


@pytest.mark.slow
def test_an_edited_fingerprint_entry_is_not_taken(tmp_path, monkeypatch):
    a = _go(tmp_path, "dataset.limit=4")
    b = _go(tmp_path, "dataset.limit=4", "model.seed=1")
    fp_b = open_store(str(tmp_path / "s.zarr")).provenance(b.run_id)["model_fingerprint"]
    run, _ = compose_run(["observable=score", "dataset.limit=4"])
    wkey = fingerprint_cache.weights_key(run.model, str(tmp_path))
    (fingerprint_cache.cache_dir() / "fingerprints").mkdir(exist_ok=True)       # where it once lived, plain
    (fingerprint_cache.cache_dir() / "fingerprints" / f"{wkey}.json").write_text(
        json.dumps({"model_fingerprint": fp_b}))
    path = _signed_path("fingerprints", wkey)
    if path.exists():
        signed = json.loads(path.read_text())
        signed["doc"]["model_fingerprint"] = fp_b                               # seed 0's weights -> seed 1's print
        path.write_text(json.dumps(signed))
    again = _go(tmp_path, "dataset.limit=4")
    assert again.run_id == a.run_id != b.run_id
    assert np.allclose(_margins(tmp_path, again), _margins(tmp_path, a))


@pytest.mark.slow
def test_a_checkpoint_sequence_is_reused_from_bytes_until_an_earlier_checkpoint_changes(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save

    from reward_lens_spec.models.tiny import build_tiny

    _remember_fresh_files(monkeypatch)
    for seed in (0, 1):
        model, tok = build_tiny("tiny_llama", seed=seed)
        model.save_pretrained(tmp_path / f"ck{seed}")
        tok.save_pretrained(tmp_path / f"ck{seed}")
    over = (f"model.checkpoints=[{tmp_path / 'ck0'},{tmp_path / 'ck1'}]", "model.checkpoint=1", "dataset.limit=4")
    first = _go(tmp_path, *over)
    again = _go(tmp_path, *over)
    assert again.reused and again.provenance is not None                       # decided from bytes
    assert again.provenance["checkpoint"]["chain_sha256"] == _independent_chain(tmp_path, over)
    weights = tmp_path / "ck0" / "model.safetensors"                           # the EARLIER checkpoint
    state = load_file(weights)
    name = next(k for k in state if k.endswith("score.weight"))
    state[name] = -state[name]
    _rewrite_keeping_size_and_mtime(weights, save(state, metadata={"format": "pt"}))
    changed = _go(tmp_path, *over)
    assert not changed.reused and changed.run_id != first.run_id                # its place in the chain changed
    assert np.allclose(_margins(tmp_path, changed), _margins(tmp_path, first))  # checkpoint 1's own numbers did not


def _independent_chain(tmp_path, over) -> str:
    """The chain hash of the composed run's checkpoint, from an independent fold of the two folders' file digests."""
    h = None
    for d in ("ck0", "ck1"):
        c = hashlib.sha256(b"reward_lens_spec.checkpoint.v1")
        root = tmp_path / d
        for p in sorted(root.rglob("*")):
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts):
                c.update(f"{p.relative_to(root).as_posix()}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode())
        h = hashlib.sha256(f"{h or 'reward_lens_spec.chain.v1'}|{c.hexdigest()}".encode()).hexdigest()
    return h


INC = """name: myinc
steps:
  - {name: r, op: capture, site: readout}
  - {name: reward, op: project, input: r, bias: true}
  - {name: margin, op: diff, input: reward}
outputs: [margin]
"""
TOP = "name: mytop\ninclude: [myinc]\nsteps:\n  - {name: m2, op: scale, input: margin, by: 1.0}\noutputs: [m2]\n"


@pytest.mark.slow
def test_an_included_observable_edited_in_a_user_folder_is_recomputed(tmp_path, monkeypatch):
    """Adversarial pass (after issue 36): the resolved config keeps ``include: [myinc]`` unexpanded, so editing
    the included file in ``--config-dir`` kept the reuse key and returned the old numbers ("reused")."""
    _remember_fresh_files(monkeypatch)
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "cfg" / "observable"
    cfg.mkdir(parents=True)
    (cfg / "myinc.yaml").write_text(INC)
    (cfg / "mytop.yaml").write_text(TOP)

    def go(*extra):
        run, y = compose_run(["--config-dir", str(tmp_path / "cfg"), "observable=mytop", "dataset.limit=4", *extra])
        return execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                       progress=False)
    first = go()
    assert go().reused
    (cfg / "myinc.yaml").write_text(INC.replace("bias: true", "bias: false")
                                    .replace("op: diff, input: reward", "op: reduce, input: reward, dim: side, how: sum"))
    again, forced = go(), go("store.force=true")
    assert not again.reused and again.run_id == forced.run_id != first.run_id
    s = open_store(str(tmp_path / "s.zarr"))
    a, f = (np.asarray(s.load(o.run_id, "mytop", lazy=False)["m2"].values) for o in (again, forced))
    assert np.array_equal(a, f)


@pytest.mark.slow
def test_an_observable_included_by_path_outside_the_config_folders_is_recomputed(tmp_path, monkeypatch):
    """Second adversarial pass: ``observable=./x.yaml`` with ``include: [/abs/y.yaml]`` (outside every config
    folder) kept the reuse key when y was edited; the key now hashes every included file's bytes."""
    _remember_fresh_files(monkeypatch)
    monkeypatch.chdir(tmp_path)
    inc = tmp_path / "elsewhere" / "y.yaml"
    inc.parent.mkdir()
    inc.write_text(INC)
    top = tmp_path / "x.yaml"
    top.write_text(TOP.replace("include: [myinc]", f"include: [{inc}]"))

    def go(*extra):
        run, y = compose_run([f"observable={top}", "dataset.limit=4", *extra])
        return execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "s.zarr"),
                       progress=False)
    first = go()
    assert go().reused
    inc.write_text(INC.replace("op: diff, input: reward", "op: reduce, input: reward, dim: side, how: sum"))
    again, forced = go(), go("store.force=true")
    assert not again.reused and again.run_id == forced.run_id != first.run_id
