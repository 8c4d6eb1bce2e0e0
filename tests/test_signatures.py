"""Signatures for a lab (issue 26 item 6): ed25519 over every log entry (which binds each document's
seal, its sequence number and the chain), a store-level list of trusted keys, and ``store verify
recompute=K`` re-executing sampled pairs through the one executor.

Where a store requires signers, evidence that is unsigned, signed by an unknown key or badly signed
cannot lift a run above ``exploratory``; without the requirement, signatures that are present and by a
trusted key are still checked.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("cryptography", reason="signatures need the `sign` extra (cryptography)")

from reward_lens_spec.store import open_store  # noqa: E402
from reward_lens_spec.store.catalog_cli import main as store_main  # noqa: E402
from reward_lens_spec.store.log import entry_hash  # noqa: E402
from reward_lens_spec.store.trust_root import ENV_TRUST  # noqa: E402
from reward_lens_spec.trust.evidence import content_hash  # noqa: E402
from reward_lens_spec.trust.scorecard import write_card  # noqa: E402
from reward_lens_spec.store.signing import ENV_KEY  # noqa: E402

from test_adjudication_pins import forge_digests, inflate_margin  # noqa: E402
from test_evidence_log import card, entries, margin_trust  # noqa: E402
from test_trust import execute_run, make_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for name in ("lab", "other"):
        assert store_main(["keygen", f"out={d / name}.key"]) == 0
    assert oct(os.stat(d / "lab.key").st_mode & 0o777) == "0o600"
    assert store_main(["keygen", f"out={d / 'lab.key'}"]) == 2          # never overwrites a key
    return d


def build(tmp, sign_with=None):
    """A passing card and the run it calibrates, written (and signed with ``sign_with``) through the writer."""
    store = str(tmp / "store.zarr")
    old = os.environ.pop(ENV_KEY, None)
    if sign_with:
        os.environ[ENV_KEY] = str(sign_with)
    try:
        write_card(card(True, "a"), store)
        rid = execute_run(store, tmp, make_run(observable="score"))
    finally:
        os.environ.pop(ENV_KEY, None)
        if old is not None:
            os.environ[ENV_KEY] = old
    return store, rid


@pytest.fixture(scope="module")
def _signed(tmp_path_factory, keys, one_thread):
    return build(tmp_path_factory.mktemp("signed"), keys / "lab.key")


@pytest.fixture(scope="module")
def _unsigned(tmp_path_factory, one_thread):
    return build(tmp_path_factory.mktemp("unsigned"))


def copy(src, tmp_path):
    store, rid = src
    shutil.copytree(store, tmp_path / "store.zarr")
    return str(tmp_path / "store.zarr"), rid


def trust_keys(store, keys, *names, require=True):
    """List ``names``' keys in the store and pin them (and ``@require``) in a reader's trust file
    (``store.trust_root``) beside it, named by the environment."""
    lines = []
    for n in names:
        assert store_main(["keys", f"url={store}", f"add={keys / n}.key.pub", f"name={n}"]) == 0
        lines.append(f"{n}@lab {store} ed25519:{(keys / f'{n}.key.pub').read_text().strip()}")
    assert store_main(["keys", f"url={store}", f"require={'true' if require else 'false'}"]) == 0
    path = f"{store}.trust"
    with open(path, "w") as f:
        f.write("\n".join(lines + (["@require *"] if require else [])) + "\n")
    os.environ[ENV_TRUST] = path               # restored after each test (conftest)


def test_signed_by_a_trusted_key_calibrates(_signed, keys, tmp_path, capsys):
    store, rid = copy(_signed, tmp_path)
    assert all("sig" in json.loads(f.read_text()) for f in entries(store))
    trust_keys(store, keys, "lab")
    assert margin_trust(store, rid)["level"] == "calibrated"
    capsys.readouterr()
    assert store_main(["keys", f"url={store}"]) == 0
    out = capsys.readouterr().out
    assert "1 listed key(s), 1 trusted; signers required" in out and " lab " in out and "pinned" in out
    assert store_main(["verify", f"url={store}"]) == 0


def test_unsigned_when_required(_unsigned, keys, tmp_path):
    store, rid = copy(_unsigned, tmp_path)
    assert margin_trust(store, rid)["level"] == "calibrated"           # no requirement: unsigned is fine
    trust_keys(store, keys, "lab")
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and not t["verified"] and "unsigned" in t["why"], t
    assert store_main(["verify", f"url={store}"]) == 1


def test_signed_by_unknown_key(_signed, keys, tmp_path):
    store, rid = copy(_signed, tmp_path)
    trust_keys(store, keys, "other")
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and "not a trusted key" in t["why"], t
    trust_keys(store, keys, "other", require=False)                    # not required: unknown signers pass
    assert margin_trust(store, rid)["level"] == "calibrated"


@pytest.mark.parametrize("how", ["sig", "rehash"])
def test_forged_signature_is_caught(_signed, keys, tmp_path, how):
    store, rid = copy(_signed, tmp_path)
    trust_keys(store, keys, "lab", require=False)                      # a trusted signature always verifies
    f = entries(store)[-1]
    e = json.loads(f.read_text())
    if how == "sig":
        e["sig"] = e["sig"][:-2] + ("00" if e["sig"][-2:] != "00" else "11")
    else:                                                               # the forger edits and rehashes the entry
        e["created"] = "2000-01-01T00:00:00.000+00:00"
        e["hash"] = entry_hash(e)
    f.write_text(json.dumps(e))
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and "does not verify" in t["why"], t


def test_recompute_matches_and_catches_a_full_forgery(_unsigned, tmp_path, capsys):
    from reward_lens_spec.store.verify import verify_lines

    store, rid = copy(_unsigned, tmp_path)
    lines, ok = verify_lines(open_store(store), rid, recompute=2, base_dir=str(tmp_path))
    assert ok, lines
    rec = [ln for ln in lines if "recompute" in ln]
    assert rec and " ok " in rec[0] and "recomputed 2 pair(s)" in rec[0] and "margin max|Δ|" in rec[0], lines
    # without signatures a forger who edits the data, the digests, the seal and the log entry passes every
    # integrity check; recomputation does not
    inflate_margin(store, rid)
    forge_digests(store, rid)
    f = entries(store)[-1]
    e = json.loads(f.read_text())
    e["doc"] = content_hash(open_store(store).document(rid))
    e["hash"] = entry_hash(e)
    f.write_text(json.dumps(e))
    assert margin_trust(store, rid)["level"] == "calibrated"           # the integrity checks are fooled
    lines, ok = verify_lines(open_store(store), rid, recompute=2, base_dir=str(tmp_path))
    assert not ok and any("recompute  FAILED" in ln and "margin max|Δ|" in ln and "MISMATCH" in ln
                          for ln in lines), lines
    assert store_main(["verify", f"url={store}", f"run={rid}", "--recompute", "2"]) == 1


@pytest.mark.slow
def test_recompute_regrades_a_card_and_catches_readings_its_code_did_not_compute(tmp_path, dla_card, one_thread):
    """``store verify recompute=K`` grades each card's organism check again (``trust.recompute.recompute_card``):
    the honest card agrees; a card whose readings are 5 % off (written as broken code would, sealed and
    logged like any other) is caught, though every integrity check passes."""
    import dataclasses

    from reward_lens_spec.trust.recompute import recompute_card

    url = str(tmp_path / "cards.zarr")
    honest = write_card(dla_card, url)
    ok, detail = recompute_card(open_store(url), honest)
    assert ok is True and "MISMATCH" not in detail, detail
    forged = dataclasses.replace(dla_card, readings={
        c: [None if v is None else 1.05 * v for v in vals] for c, vals in dla_card.readings.items()})
    other = str(tmp_path / "forged.zarr")
    bad = write_card(forged, other)
    assert open_store(other).verify(bad)["ok"]                # the seal and data digests hold
    ok, detail = recompute_card(open_store(other), bad)
    assert ok is False and "MISMATCH" in detail, detail
