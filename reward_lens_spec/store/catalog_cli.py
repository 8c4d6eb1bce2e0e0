"""``reward-lens-spec store <command> url=URL [key=value ...]``: browse a store.

Commands (all key=value arguments; loads no model, imports no torch):

    ls       url= [model_fingerprint= dataset= observable= trust= trust_verified= spec_hash= model=] [--wide]
             fits 100 columns (8-digit hashes); --wide prints every column and full hashes
    show     url= run=                 provenance + each observable's dims/variables
    diff     url= a= b=                unified diff of the two resolved configs (run=/run_b= also work)
    export   url= run= observable= [var=NAME] out=PATH.nc|PATH.csv
                                       (var= needed when the observable's variables have
                                       different coordinate sets: one file would pad them)
    gc       url= [older_than=SECONDS] remove what no live writer holds and no reader lists
                                       (default age 3600 s; never a complete run, never via a symlink)
    migrate  url=                      bring an older store's root to this layout
    verify   url= [run=] [recompute=K] [trust_file=PATH]
                                       the reader's signer policy and where it came from (first line), then
                                       read every complete run (or one) and check its arrays against the
                                       digests in its sealed document, and the evidence log: one line per run;
                                       recompute=K (or --recompute K) also re-executes K sampled pairs of each
                                       run whose model is at hand and every card's organism check, and compares
                                       with the stored values; exit 1 on a failure
    keygen   out=PATH                  a new ed25519 signing key (PATH, mode 0600) and PATH.pub (extra `sign`)
    keys     url= [add=PATH.pub] [name=LABEL] [require=true|false]
                                       list (add) keys in the store's keys/ and show which the reader's trust
                                       file pins; a listed key is not trusted, and require=false lowers
                                       nothing (writers sign with REWARD_LENS_SPEC_SIGN_KEY=PATH)

Trust root: which keys are trusted and which stores require signers is read from the READER's lab trust
file, ``REWARD_LENS_SPEC_TRUST_FILE=PATH`` or ``trust_file=PATH`` here (``store.trust_file=PATH`` for every
command), never from the store; one line a signer, git ``allowed_signers``-shaped:
``PRINCIPAL STORE-PATTERN ed25519:<hex public key>`` (or ``sha256:<hex fingerprint>``), and
``@require STORE-PATTERN`` (``store.trust_root``).

``trust`` is derived on read from the store's evidence (``trust.evidence``), never the
stored label; ``trust_verified=false`` lists the records whose stored label or documents
fail to verify (``show`` prints ``trust_reason``).

Two runs are ``a=``/``b=`` and one run is ``run=``, as in ``compare`` and ``report``.
Optional ``endpoint_url=`` is passed to fsspec as ``client_kwargs.endpoint_url``
(credentials come from the environment, e.g. AWS_ACCESS_KEY_ID). Errors go to
stderr with exit code 2.
"""
from __future__ import annotations

import sys

import yaml

from reward_lens_spec.errors import RewardLensError, StoreError, did_you_mean
from reward_lens_spec.store.trust_root import use_words
from reward_lens_spec.store.gc import GC_AGE_S

COMMANDS = ("ls", "show", "diff", "export", "gc", "migrate", "verify", "keygen", "keys")
KEYS = {"url", "run", "a", "b", "run_b", "observable", "var", "out", "model_fingerprint", "dataset", "trust",
        "trust_verified", "spec_hash", "model", "older_than", "endpoint_url", "recompute", "add", "name", "require",
        "trust_file"}
FILTERS = ("model_fingerprint", "dataset", "observable", "trust", "trust_verified", "spec_hash", "model")
LS_COLUMNS = ("run_id", "observables", "model", "dataset", "trust", "created", "model_fingerprint")
WIDTH = 100
HASHES = ("model_fingerprint", "dataset_checksum", "spec_hash")


def _parse(argv: list[str]) -> tuple[str, dict]:
    args = list(argv)
    if args and args[0] == "store":
        args = args[1:]
    if not args or "=" in args[0]:
        raise StoreError(f"store: missing command. Usage: reward-lens-spec store "
                         f"<{'|'.join(COMMANDS)}> url=URL [key=value ...]")
    cmd, kv = args[0], {}
    if "--recompute" in args[1:-1]:                    # verify --recompute K == verify recompute=K
        i = args.index("--recompute")
        args[i:i + 2] = [f"recompute={args[i + 1]}"]
    if "--wide" in args[1:]:
        args = [a for a in args if a != "--wide"]
        kv["wide"] = True
    if cmd not in COMMANDS:
        raise StoreError(f"store: unknown command {cmd!r}.{did_you_mean(cmd, COMMANDS)} "
                         f"Valid: {', '.join(COMMANDS)}.")
    for tok in args[1:]:
        key, sep, value = tok.partition("=")
        if not sep or key not in KEYS:
            raise StoreError(f"store {cmd}: bad argument {tok!r}; expected key=value with key in "
                             f"{', '.join(sorted(KEYS))}.{did_you_mean(key, KEYS)}")
        kv[key] = value
    if "trust_file" in kv:                              # the reader's trust root (store.trust_root)
        use_words([f"trust_file={kv.pop('trust_file')}"], "trust_file")
    if "url" not in kv and cmd != "keygen":
        raise StoreError(f"store {cmd}: url= is required.")
    if cmd == "diff":                                  # the older spelling run= run_b= still works
        kv.setdefault("a", kv.pop("run", None))
        kv.setdefault("b", kv.pop("run_b", None))
    return cmd, kv


LS_CELL_MAX = {"run_id": 30, "observables": 16, "model": 16, "dataset": 16}   # longer cells are shortened


def _shorten(x, n: int):
    """``x`` as at most ``n`` characters: its start, ``…`` and its last 6 (the hash tail of a run id)."""
    s = str(x)
    return s if len(s) <= n else f"{s[:n - 7]}…{s[-6:]}"


def ls_table(df, wide: bool = False) -> str:
    """The ``ls`` table: every column with full hashes (``wide``), else ``LS_COLUMNS`` with 8-digit
    hashes, minute times and long cells (a ``compare-…`` run id) shortened to ``LS_CELL_MAX``, so one long
    id does not push the other columns out; trailing columns are dropped only if it still exceeds ``WIDTH``."""
    df = df.assign(observables=df["observables"].map(",".join))
    if wide:
        return df.to_string(index=False)
    df = df.assign(created=df["created"].dt.strftime("%Y-%m-%d %H:%M"),
                   **{h: df[h].map(lambda x: str(x)[:8] if x else x) for h in HASHES},
                   **{c: df[c].map(lambda x, n=n: _shorten(x, n) if x is not None else x)
                      for c, n in LS_CELL_MAX.items() if c in df})
    df = df.rename(columns={"model_fingerprint": "fingerprint"})
    cols = [c.replace("model_fingerprint", "fingerprint") for c in LS_COLUMNS]
    text = df[cols].to_string(index=False)
    while len(cols) > 2 and max(map(len, text.splitlines())) > WIDTH:
        cols.pop()
        text = df[cols].to_string(index=False)
    return text


def _need(kv: dict, cmd: str, *keys: str) -> None:
    missing = [k for k in keys if not kv.get(k)]
    if missing:
        raise StoreError(f"store {cmd}: missing {', '.join(k + '=' for k in missing)}")


def _run(cmd: str, kv: dict) -> int | None:
    from reward_lens_spec.store import migrate, open_store
    so = {"client_kwargs": {"endpoint_url": kv["endpoint_url"]}} if kv.get("endpoint_url") else None
    if cmd in ("keygen", "keys"):                  # logic in store.verify
        from reward_lens_spec.store.verify import run_keys
        return run_keys(cmd, kv, so)
    url = kv["url"]
    if cmd == "migrate":
        print(f"store {url}: layout {migrate(url, storage_options=so)}")
        return
    store = open_store(url, storage_options=so)
    if cmd == "verify":                        # logic in store.verify
        from reward_lens_spec.store.verify import run_verify
        return run_verify(store, kv)
    if cmd == "ls":
        df = store.runs(**{k: kv[k] for k in FILTERS if k in kv})
        if df.empty:
            print(f"no complete runs in {url}")
        else:
            print(ls_table(df, kv.get("wide", False)))
            if not kv.get("wide"):
                print("(--wide: every column, full hashes and run ids)")
        n_unverified = int((~df["trust_verified"].astype(bool)).sum()) if not df.empty else 0
        if n_unverified:
            print(f"({n_unverified} run(s) with trust_verified=False: the stored label or a document fails to "
                  f"verify; `store show run=...` gives trust_reason)")
        n_bad = len(store.incomplete())
        if n_bad:
            print(f"({n_bad} incomplete run(s); `reward-lens-spec store gc url={url}` removes them)")
    elif cmd == "show":
        _need(kv, cmd, "run")
        prov = store.provenance(kv["run"])
        config = prov.pop("config_yaml", None)
        print(yaml.safe_dump(prov, sort_keys=True).rstrip())
        if config:
            print("config_yaml: |\n" + "\n".join("  " + line for line in str(config).splitlines()))
        for obs, res in store.load(kv["run"]).items():
            print(f"observable {obs}:")
            for name, da in res.items():
                dims = " × ".join(f"{d}={n}" for d, n in da.sizes.items()) or "scalar"
                print(f"  {name}: {dims}")
    elif cmd == "diff":
        _need(kv, cmd, "a", "b")
        lines = store.diff(kv["a"], kv["b"])
        print("\n".join(lines) if lines else f"configs of {kv['a']} and {kv['b']} are identical")
    elif cmd == "export":
        _need(kv, cmd, "run", "observable", "out")
        print(f"wrote {store.export(kv['run'], kv['observable'], kv['out'], variable=kv.get('var'))}")
    elif cmd == "gc":
        try:
            older = float(kv["older_than"]) if kv.get("older_than") else GC_AGE_S
        except ValueError:
            raise StoreError(f"store gc: older_than={kv['older_than']!r} is not a number of seconds.")
        removed = store.remove_incomplete(older_than_s=older)
        print(f"removed {len(removed)} run(s)/attempt(s) no live writer holds" +
              (": " + ", ".join(removed) if removed else ""))


def main(argv: list[str]) -> int:
    """Run one store command; return 0 on success, 2 on a usage or store error."""
    try:
        cmd, kv = _parse(argv)
        rc = _run(cmd, kv)
    except RewardLensError as e:                  # a store error, or a bad trust file (SpecError)
        print(f"error: {e}", file=sys.stderr)
        return 2
    return rc or 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
