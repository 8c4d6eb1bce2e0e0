"""A trust root outside the store (issue 36, finding 3 and Deliver 3): which signers a store requires and
which keys are trusted come from the READER's lab trust file (``store.trust_root``), never from the store.

A writer with store access edits ``keys/`` (deletes it, deletes ``policy.json``, writes
``{"require_signers": false}``, lists a key of its own) or re-seals a lab-signed run by hand (data, digests,
content hash, log chain): evidence it did not sign with a pinned key never counts where the reader's trust
file requires signers, and ``store verify`` exits non-zero naming the policy's source.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from reward_lens_spec.errors import SpecError
from reward_lens_spec.store._backend import Backend
from reward_lens_spec.store.catalog_cli import main as store_main
from reward_lens_spec.store.keys import add_key, set_require_signers
from reward_lens_spec.store.trust_root import ENV_TRUST, fingerprint, load, policy

HEX_A, HEX_B = "11" * 32, "22" * 32


def write(path: Path, *lines: str) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# ----------------------------------------------------------------------------- the file (no model)

def test_trust_file_lines_parse_and_a_bad_line_is_one_error_naming_file_and_line(tmp_path, capsys):
    good = load(write(tmp_path / "lab.trust", "# lab signers", "alice@lab /data/*.zarr ed25519:" + HEX_A + "  # ok",
                      "ci@lab * sha256:" + fingerprint(HEX_B), "@require /data/*.zarr"))
    assert [(s.principal, s.scope, s.public_key, s.line) for s in good.signers] == [
        ("alice@lab", "/data/*.zarr", HEX_A, 2), ("ci@lab", "*", None, 3)]
    assert good.require == (("/data/*.zarr", 4),)
    for i, bad in enumerate(["alice@lab ed25519:" + HEX_A, "alice@lab * ed25519:abc", "alice@lab * rsa:" + HEX_A,
                             "@require", "alice@lab * sha256:" + HEX_A[:60]]):
        p = write(tmp_path / f"bad{i}.trust", "# first", bad)
        with pytest.raises(SpecError, match=rf"store.trust_file: {p} line 2: .*Fix: one signer a line"):
            load(p)
    url = str(tmp_path / "s.zarr")
    assert store_main(["verify", f"url={url}", f"trust_file={tmp_path / 'bad0.trust'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad0.trust line 2" in err and "Traceback" not in err
    assert store_main(["verify", f"url={url}", f"trust_file={tmp_path / 'absent.trust'}"]) == 2
    assert "cannot read the trust file" in capsys.readouterr().err


@pytest.mark.parametrize("tamper", ["none", "delete_policy", "delete_keys", "policy_false", "list_own_key"])
def test_the_store_can_neither_lower_the_requirement_nor_add_trust(tmp_path, tamper):
    b = Backend(str(tmp_path / "s.zarr"))
    kid_a = add_key(b, HEX_A, "alice")
    set_require_signers(b, True)
    os.environ[ENV_TRUST] = write(tmp_path / "lab.trust", f"alice@lab * sha256:{fingerprint(HEX_A)}",
                                  f"@require {tmp_path}/*.zarr")
    if tamper == "delete_policy":
        os.remove(b.path("_internal/keys/policy.json"))
    elif tamper == "delete_keys":
        shutil.rmtree(b.path("_internal/keys"))
    elif tamper == "policy_false":
        set_require_signers(b, False)
    elif tamper == "list_own_key":
        add_key(b, HEX_B, "mallory")
    pol = policy(b)
    assert pol.required and "lab.trust line 2 (@require" in pol.source, pol.source
    # pinned by fingerprint: the key is taken from the store's list only where it hashes to the pin
    assert set(pol.keys) == (set() if tamper == "delete_keys" else {kid_a}), pol.keys
    assert fingerprint(HEX_B)[:16] not in pol.keys


def test_scope_and_the_store_raising_the_requirement(tmp_path):
    b = Backend(str(tmp_path / "s.zarr"))
    add_key(b, HEX_A, "alice")
    os.environ[ENV_TRUST] = write(tmp_path / "lab.trust", f"alice@lab /elsewhere/*.zarr ed25519:{HEX_A}",
                                  "@require /elsewhere/*")
    pol = policy(b)
    assert not pol.required and pol.keys == {} and "no key pinned for this store" in pol.source
    set_require_signers(b, True)                     # a store may ask for more than its reader does
    pol = policy(b)
    assert pol.required and "keys/policy.json" in pol.source and pol.keys == {}
    os.environ.pop(ENV_TRUST)
    assert "no trust file" in policy(b).source


def test_the_typed_word_names_the_readers_trust_file_and_verify_says_where_the_policy_came_from(tmp_path, capsys):
    from reward_lens_spec.cli import main
    from reward_lens_spec.store.layout import check_layout

    url = str(tmp_path / "s.zarr")
    check_layout(Backend(url), create=True)
    src = write(tmp_path / "lab.trust", f"alice@lab {url} ed25519:{HEX_A}", f"@require {url}")
    with pytest.raises(SystemExit) as e:
        main(["store", "verify", f"url={url}", f"store.trust_file={src}"])
    out = capsys.readouterr().out.splitlines()
    assert e.value.code == 0 and os.environ[ENV_TRUST] == src
    assert out[0] == (f"signer-policy  trust file {src}: alice@lab key {fingerprint(HEX_A)[:16]} (line 1) for this "
                      f"store; signers required by {src} line 2 (@require {url})"), out
    assert out[1] == f"no complete runs in {url}"


# ----------------------------------------------------------------------------- tampering with real evidence

cryptography = pytest.importorskip("cryptography", reason="signatures need the `sign` extra (cryptography)")

from reward_lens_spec.store import open_store  # noqa: E402
from reward_lens_spec.store.log import entry_hash  # noqa: E402
from reward_lens_spec.trust.evidence import content_hash  # noqa: E402
from reward_lens_spec.store.signing import load_private, sign  # noqa: E402

from test_adjudication_pins import forge_digests  # noqa: E402
from test_evidence_log import entries, margin_trust  # noqa: E402
from test_signatures import _signed, _unsigned, build, copy, keys  # noqa: E402,F401


def lab_trust(tmp_path, keys, *names, require=True, scope="*") -> str:
    """A reader's trust file pinning ``names``' keys (and requiring signers), named by the environment."""
    lines = [f"{n}@lab {scope} ed25519:{(keys / f'{n}.key.pub').read_text().strip()}" for n in names]
    path = write(tmp_path / "lab.trust", *lines, *(["@require *"] if require else []))
    os.environ[ENV_TRUST] = path
    return path


def verify(store, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = store_main(["verify", f"url={store}"])
    return rc, capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("tamper", ["delete_policy", "delete_keys", "policy_false"])
def test_a_required_store_stays_required_whatever_its_keys_folder_says(_unsigned, keys, tmp_path, tamper, capsys):
    store, rid = copy(_unsigned, tmp_path)
    for args in ([f"add={keys / 'lab'}.key.pub"], ["require=true"]):
        assert store_main(["keys", f"url={store}", *args]) == 0
    src = lab_trust(tmp_path, keys, "lab")
    {"delete_policy": lambda: os.remove(f"{store}/_internal/keys/policy.json"),
     "delete_keys": lambda: shutil.rmtree(f"{store}/_internal/keys"),
     "policy_false": lambda: Path(f"{store}/_internal/keys/policy.json").write_text('{"require_signers": false}')}[tamper]()
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and not t["verified"] and "unsigned" in t["why"], t
    rc, out = verify(store, capsys)
    first = out.splitlines()[0]
    assert rc == 1 and first.startswith("signer-policy") and f"signers required by {src} line 2" in first, out


@pytest.mark.slow
def test_a_key_listed_only_in_the_store_adds_no_trust(_signed, keys, tmp_path, capsys):
    store, rid = copy(_signed, tmp_path)                   # every entry signed by lab
    assert store_main(["keys", f"url={store}", f"add={keys / 'lab'}.key.pub", "require=true"]) == 0
    lab_trust(tmp_path, keys, "other")                     # the reader pins another key only
    t = margin_trust(store, rid)
    assert t["level"] == "exploratory" and "not a trusted key" in t["why"], t
    assert verify(store, capsys)[0] == 1
    pub = (keys / "lab.key.pub").read_text().strip()       # pinned by fingerprint: the listed key is used
    os.environ[ENV_TRUST] = write(tmp_path / "fp.trust", f"lab@lab * sha256:{fingerprint(pub)}", "@require *")
    assert margin_trust(store, rid)["level"] == "calibrated"
    assert verify(store, capsys)[0] == 0
    shutil.rmtree(f"{store}/_internal/keys")                         # the key gone from the list: fail closed
    assert margin_trust(store, rid)["level"] == "exploratory"


def rechain(store, rid, *, own=None, drop_sig=False) -> None:
    """Rewrite ``rid``'s log entry to its document's current content hash and chain every later entry
    again (``own``: a private key to sign them with; ``drop_sig``: leave them unsigned), as a writer with
    store access can."""
    doc, prev, hit = content_hash(open_store(store).document(rid)), None, False
    for f in entries(store):
        e = json.loads(f.read_text())
        hit |= e["id"] == rid
        if hit:
            if e["id"] == rid:
                e["doc"] = doc
            if prev is not None:
                e["prev"] = prev
            if drop_sig:
                e.pop("signer", None), e.pop("sig", None)
            if own is not None:
                e["signer"] = sign(own, "")[0]             # "signer" is under the hash, "sig" is not
            e["hash"] = entry_hash(e)
            if own is not None:
                e["sig"] = sign(own, e["hash"])[1]
            f.write_text(json.dumps(e, sort_keys=True))
        prev = e["hash"]


def reseal_by_hand(store, rid, keys, how) -> None:
    """A writer without lab's private key negates the run's margins and re-seals everything: the data's
    digests and the document's content hash, the run's log entry and every later one (chained again)."""
    a = zarr.open_array(store=zarr.storage.LocalStore(store), path=f"runs/{rid}/score/margin", mode="r+")
    a[...] = -np.asarray(a[...])
    forge_digests(store, rid)
    if how == "own_key":                                   # its own key, listed in the store, requirement off
        assert store_main(["keys", f"url={store}", f"add={keys / 'other'}.key.pub", "require=false"]) == 0
    rechain(store, rid, own=load_private(str(keys / "other.key")) if how == "own_key" else None,
            drop_sig=how == "drop_sig")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["keep_sig", "drop_sig", "own_key"])
def test_a_hand_resealed_lab_signed_run_is_not_calibrated(_signed, keys, tmp_path, how, capsys):
    store, rid = copy(_signed, tmp_path)
    lab_trust(tmp_path, keys, "lab")
    assert margin_trust(store, rid)["level"] == "calibrated"            # the honest run, as signed
    reseal_by_hand(store, rid, keys, how)
    assert open_store(store).verify(rid)["ok"]                         # data digests and seal are consistent
    t = margin_trust(store, rid)
    why = {"keep_sig": "does not verify", "drop_sig": "unsigned", "own_key": "not a trusted key"}[how]
    assert t["level"] == "exploratory" and not t["verified"] and why in t["why"], t
    rc, out = verify(store, capsys)
    assert rc == 1 and f"{rid}  FAILED  evidence log: its log entry" in out and why in out, out
