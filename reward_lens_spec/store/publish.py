"""Publication: a completing attempt's observables copied into the run group as plain xarray Datasets,
and the root's consolidated metadata (store layout 4, ``docs/store-format.md``).

An attempt stores each output variable in a group of its own with exactly its own coordinates
(``store.groups``). Publication makes ``runs/<run_id>/<observable>`` **one** Dataset holding every
output variable, its coordinates and the pair labels, so ``xr.open_zarr(url, group=...)`` and
``xr.open_datatree(url, engine="zarr")`` read it as it is. Arrays are copied file by file (a hard link
on a local store, a server-side copy on an object store): chunks are never re-encoded, so the published
arrays hold the bytes the attempt's digests were computed over. Only an array's ``zarr.json`` may change:

- two variables whose coordinate of one name differs (``dla``'s ``layer`` is −1…L−1,
  ``patch_effect``'s 0…L−1) cannot share it in one Dataset; the later variable's copy is published as
  ``<name>__<variable>`` (its dim renamed with it), never padded;
- each variable's CF ``coordinates`` attribute names its own non-index coordinates.

The group's attrs say how to undo that: ``stored_as = {variable: {"coords": {name: stored name},
"dims": {stored dim: dim}}}`` (``groups.open_published``), and ``attempt`` names the attempt published.

Consolidated metadata (``consolidate``): the root ``zarr.json`` carries, under ``consolidated_metadata``,
the metadata documents of ``runs``, every complete run's group and its published groups and arrays, so
plain readers never list the store (and never meet ``_internal/``). It is merged, not rebuilt: entries of
other runs are kept, runs no longer listed are dropped, and after writing it the writer re-lists the runs
and adds any complete one it missed (a concurrent completion), until nothing is missing. One writer at a
time does so: under the store-wide ``root`` lease, taken after a run's ``publish`` lease, never before.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from reward_lens_spec.errors import StoreError
from reward_lens_spec.store._backend import DOC, RUNS, Backend, group_doc
from reward_lens_spec.store.attempts import PUBLISH, Attempt

VARIABLES = "output_variables"
STORED_AS = "stored_as"
ATTEMPT = "attempt"
COORDS = "coordinates"
_INLINE = {"kind": "inline", "must_understand": False}
# the run id of the store-wide lease ``consolidate`` holds (``_internal/attempts/_root/_publish``): never a run's
# (``_backend.RUN_NAME`` starts alphanumeric), and ``store gc`` lists runs from ``runs/``, so it never collects it
ROOT = "_root"


def published_group(run_id: str, observable: str) -> str:
    """The key of ``observable``'s published Dataset in run ``run_id``."""
    return f"{RUNS}/{run_id}/{observable}"


def _files(b: Backend, key: str) -> list[str]:
    """Keys (relative to ``key``) of every plain file under ``key``; symlinks are never listed or followed."""
    base = b.path(key)
    if b.local:
        out = []
        for d, dirs, files in os.walk(base, followlinks=False):
            dirs[:] = [x for x in dirs if not os.path.islink(os.path.join(d, x)) and not x.startswith(".")]
            rel = os.path.relpath(d, base)
            out += [f if rel == "." else f"{rel}/{f}" for f in files
                    if not f.startswith(".") and not os.path.islink(os.path.join(d, f))]
        return sorted(out)
    try:
        found = b.fs.find(base, withdirs=False)
    except FileNotFoundError:
        return []
    except Exception as e:
        raise b._fail(f"list {key}", e) from e
    return sorted(p[len(base) + 1:] for p in found if p.startswith(base + "/"))


def _read_many(b: Backend, keys: list[str]) -> dict[str, bytes]:
    if b.local:                          # files this writer just listed (never through a link: ``_files``)
        out = {}
        for k in keys:
            with open(b.path(k), "rb") as f:
                out[k] = f.read()
        return out
    if len(keys) < 2:
        return {k: b.read(k) for k in keys}
    try:
        got = b.fs.cat([b.path(k) for k in keys])
    except Exception as e:
        raise b._fail(f"read {len(keys)} documents", e) from e
    return {k: got[b.path(k)] for k in keys}


def _copy(b: Backend, pairs: list[tuple[str, str]]) -> None:
    """Copy files ``(src key, dst key)``: hard links locally (a copy where links fail), else the
    filesystem's own copy (server-side on S3)."""
    if not pairs:
        return
    if b.local:
        made = set()
        for src, dst in pairs:
            d = os.path.dirname(b.path(dst))
            if d not in made:
                os.makedirs(d, exist_ok=True)
                made.add(d)
            try:
                os.link(b.path(src), b.path(dst))
            except FileExistsError:
                os.remove(b.path(dst))
                os.link(b.path(src), b.path(dst))
            except OSError:
                shutil.copyfile(b.path(src), b.path(dst))
        return
    try:
        b.fs.copy([b.path(s) for s, _ in pairs], [b.path(d) for _, d in pairs])
    except Exception as e:
        raise b._fail(f"copy {len(pairs)} objects", e) from e


def _is_group(doc) -> bool:
    return isinstance(doc, dict) and doc.get("node_type") == "group"


def plan(b: Backend, src: str) -> tuple[dict, dict, dict]:
    """How the attempt group ``src`` (store layout 3: labels + one group per variable; or one Dataset)
    is published: ``(arrays, group attrs, chunk files)``. ``arrays``: ``{published name: (source node,
    zarr.json document to write)}``; ``chunk files``: ``{source node: [chunk keys relative to it]}``."""
    files = _files(b, src)
    doc_keys = [f for f in files if f == DOC or f.endswith("/" + DOC)]
    raw = _read_many(b, [f"{src}/{k}" for k in doc_keys])
    docs = {}
    for k in doc_keys:
        try:
            docs[k[:-len(DOC)].rstrip("/")] = json.loads(raw[f"{src}/{k}"])
        except (TypeError, ValueError) as e:
            raise StoreError(f"store {b.url}: {src}/{k} is not valid JSON ({e}); cannot publish it.") from e
    chunks: dict[str, list[str]] = {}
    for f in files:
        if f in doc_keys:
            continue
        node = f.rsplit("/", 1)[0] if "/" in f else ""
        while node and not (node in docs and not _is_group(docs[node])):
            node = node.rsplit("/", 1)[0] if "/" in node else ""
        if node:                                   # a chunk of the array ``node`` (anything else: not copied)
            chunks.setdefault(node, []).append(f[len(node) + 1:])
    attrs = dict((docs.get("") or {}).get("attributes") or {})
    listed = attrs.get(VARIABLES)
    top = {n: d for n, d in docs.items() if n and "/" not in n and not _is_group(d)}
    arrays: dict[str, tuple[str, dict]] = dict((n, (n, d)) for n, d in top.items())
    shared_pair = "pair" in top
    memo: dict[str, tuple] = {}

    def signature(node):                       # two arrays are one when metadata and chunk bytes agree
        if node not in memo:
            keys = sorted(chunks.get(node, []))
            data = _read_many(b, [f"{src}/{node}/{c}" for c in keys])
            memo[node] = (json.dumps(docs[node], sort_keys=True), tuple(data[f"{src}/{node}/{c}"] for c in keys))
        return memo[node]

    def dims(doc):
        return tuple(doc.get("dimension_names") or ())

    clash = sorted(set(listed or ()) & set(top))
    if clash:
        raise StoreError(f"store {b.url}: {src}: output variable(s) {clash} share their name with the pair labels; "
                         "one Dataset cannot hold both. Fix: rename the variable.")
    reserved = set(listed or ())                # variable names are never given to a coordinate or dim
    stored_as: dict[str, dict] = {}
    for var in listed or []:
        own = {n.split("/", 1)[1]: d for n, d in docs.items()
               if n.startswith(var + "/") and n.count("/") == 1 and not _is_group(d)}
        if var not in own:
            raise StoreError(f"store {b.url}: {src}/{var} holds no array {var}; cannot publish it.")
        coords = [c for c in own if c != var and not (c == "pair" and shared_pair)]
        index = {c for c in coords if dims(own[c]) == (c,)}
        used = {}                                            # dim -> size over what is published so far
        for _, d in arrays.values():
            used.update(zip(dims(d), d.get("shape") or ()))
        sizes = {}
        for d in own.values():
            sizes.update(zip(dims(d), d.get("shape") or ()))
        rename = {}
        for d in sizes:
            if d == "pair" and shared_pair:
                continue
            if d in reserved:
                clash = True
            elif d in index:
                clash = signature(f"{var}/{d}") != signature(arrays[d][0]) if d in arrays else d in used
            else:
                clash = d in arrays or (d in used and used[d] != sizes[d])
            if clash:
                rename[d] = _free(f"{d}__{var}", set(arrays) | set(used) | reserved)
        names = {}
        for c in coords:
            new_dims = [rename.get(x, x) for x in dims(own[c])]
            target = rename.get(c, c)
            if c not in index and (target in reserved or target in arrays and (
                    list(dims(arrays[target][1])) != new_dims or signature(f"{var}/{c}") != signature(arrays[target][0]))):
                target = _free(f"{c}__{var}", set(arrays) | set(used) | reserved)
            names[c] = target
            if target not in arrays:
                arrays[target] = (f"{var}/{c}", _with_dims(own[c], new_dims))
        own_coords = {c: names[c] for c in coords}
        if shared_pair and "pair" in dims(own[var]):
            own_coords.update({k: k for k, d in top.items() if dims(d) == ("pair",)})
        doc = _with_dims(own[var], [rename.get(x, x) for x in dims(own[var])])
        doc["attributes"] = {k: v for k, v in (doc.get("attributes") or {}).items() if k != COORDS}
        non_index = [t for t in own_coords.values() if dims(arrays[t][1]) != (t,)]
        if non_index:
            doc["attributes"][COORDS] = " ".join(non_index)
        arrays[var] = (f"{var}/{var}", doc)
        stored_as[var] = {"coords": own_coords, "dims": {v: k for k, v in rename.items()}}
    data_vars = set(listed or ())
    coords_all = [n for n, (_, d) in arrays.items() if n not in data_vars and dims(d) != (n,)]
    out = {k: v for k, v in attrs.items() if k not in (COORDS, STORED_AS, ATTEMPT)}
    if listed is None:                 # one Dataset already (store layout 2): as it is, its variables listed
        if COORDS in attrs:
            out[COORDS] = attrs[COORDS]
        named = set(str(attrs.get(COORDS, "")).split()).union(
            *(str((d.get("attributes") or {}).get(COORDS, "")).split() for _, d in arrays.values()))
        out[VARIABLES] = [n for n, (_, d) in arrays.items() if n not in named and dims(d) != (n,)]
    else:
        if coords_all:
            out[COORDS] = " ".join(coords_all)
        out[STORED_AS] = stored_as
    return arrays, out, chunks


def _free(name: str, taken) -> str:
    while name in taken:
        name += "_"
    return name


def _with_dims(doc: dict, dims) -> dict:
    out = {**doc, "attributes": dict(doc.get("attributes") or {})}
    if dims:
        out["dimension_names"] = list(dims)
    return out


def _flat_keys(doc: dict):
    """``(doc, key map)``: an array with Zarr's default chunk keys (``c/0/1``) is published with the ``.``
    separator (``c.0.1``): the same chunks, one folder per array instead of one per grid level."""
    enc = doc.get("chunk_key_encoding") or {}
    if enc.get("name") != "default" or (enc.get("configuration") or {}).get("separator", "/") != "/":
        return doc, lambda c: c
    doc = {**doc, "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}}}
    return doc, lambda c: c.replace("/", ".")


def publish_group(b: Backend, src: str, dst: str, attempt: str, fence=None) -> dict:
    """Publish the attempt group ``src`` (a key) as the Dataset group ``dst``: arrays first (chunks copied,
    ``zarr.json`` written), the group document last, naming ``attempt``. Returns the consolidated-metadata
    entries of what it wrote (``{key: document}``)."""
    arrays, attrs, chunks = plan(b, src)
    copies, docs, entries = [], {}, {}
    for name, (node, doc) in arrays.items():
        doc, flat = _flat_keys(doc)
        copies += [(f"{src}/{node}/{c}", f"{dst}/{name}/{flat(c)}") for c in chunks.get(node, [])]
        docs[f"{dst}/{name}/{DOC}"] = json.dumps(doc).encode()          # unindented: group_doc says why
        entries[f"{dst}/{name}"] = _entry(doc)
    if fence is not None:
        fence()
    _copy(b, copies)
    if b.local:                     # new files in a folder no reader lists until the group document exists
        for k, v in docs.items():
            b.check_inside(k)
            os.makedirs(os.path.dirname(b.path(k)), exist_ok=True)
            with open(b.path(k), "wb") as f:
                f.write(v)
    else:
        b.put_many({b.path(k): v for k, v in docs.items()})
    if fence is not None:
        fence()
    gdoc = group_doc({**attrs, ATTEMPT: attempt})
    b.write_atomic(f"{dst}/{DOC}", gdoc)
    entries[dst] = _entry(json.loads(gdoc))
    return entries


def publish(att, run_attrs: dict, fence=None) -> dict:
    """Replace whatever is published in ``runs/<run_id>/`` by the observables ``run_attrs["observables"]``
    of attempt ``att`` (``publish_group`` each). Called under the run's ``publish`` lease, before the run
    document names ``att``. Returns the consolidated-metadata entries of the published groups."""
    b, run = att.b, f"{RUNS}/{att.run_id}"
    for child in b.list_dirs(run):                      # an earlier publication (force) or a crashed one
        if fence is not None:
            fence()
        b.remove_tree(f"{run}/{child}")
    entries = {}
    for obs in run_attrs.get("observables") or []:
        entries.update(publish_group(b, f"{att.prefix}/{obs}", published_group(att.run_id, obs), att.aid, fence))
    return entries


# -- consolidated metadata ------------------------------------------------------------------------------
def _entry(doc: dict) -> dict:
    out = dict(doc)
    if _is_group(out):
        out["consolidated_metadata"] = {**_INLINE, "metadata": {}}
    return out


def run_entries(b: Backend, run_id: str) -> dict:
    """``{key: metadata document}`` of one complete run: its group and, for every observable published from
    the attempt its document names, the observable's group and arrays; ``{}`` for a run that is not
    complete."""
    from reward_lens_spec.store.state import run_state

    state, attrs = run_state(b, run_id)
    if state != "complete":
        return {}
    run = f"{RUNS}/{run_id}"
    out = {run: _entry(json.loads(b.read(f"{run}/{DOC}")))}
    for obs in attrs.get("observables") or []:
        g = published_group(run_id, obs)
        try:
            gdoc = b.read_json(f"{g}/{DOC}")
        except ValueError:
            continue
        if not gdoc or (gdoc.get("attributes") or {}).get(ATTEMPT) != attrs.get("attempt"):
            continue
        names = [f[:-len(DOC) - 1] for f in _files(b, g) if f.endswith("/" + DOC) and f.count("/") == 1]
        raw = _read_many(b, [f"{g}/{n}/{DOC}" for n in names])
        out[g] = _entry(gdoc)
        for n in names:
            try:
                out[f"{g}/{n}"] = _entry(json.loads(raw[f"{g}/{n}/{DOC}"]))
            except (TypeError, ValueError):
                continue
    return out


def _run_of(key: str) -> str | None:
    parts = key.split("/")
    return parts[1] if parts[0] == RUNS and len(parts) > 1 else None


def root_lists(b: Backend, run_id: str) -> bool:
    """Whether the root's consolidated metadata (what plain readers see) lists run ``run_id``: it may still
    after its document was emptied, when the writer died before the root was written again."""
    meta = ((b.read_json(DOC) or {}).get("consolidated_metadata") or {}).get("metadata") or {}
    return f"{RUNS}/{run_id}" in meta


def consolidate(b: Backend, run_ids=(), *, rebuild: bool = False, known: dict | None = None,
                tries: int = 20) -> None:
    """Bring the root's consolidated metadata up to date for ``run_ids`` (and any complete run it lacks);
    ``rebuild``: every run read again; ``known``: ``{run_id: its entries}`` the caller just wrote (not read
    again). The whole read-merge-write runs under the store-wide ``root`` lease (``ROOT``): a writer never
    writes back entries read before another writer's update (a forced writer's unlisting stays). Lock
    order: a run's ``publish`` lease, then this one; nothing takes a run's lease while holding it. Re-lists
    after writing and repeats while a complete run is missing (at most ``tries`` times). Raises StoreError
    when the store cannot be written, or this writer lost the lease (stalled past ``leases.LEASE_S``)."""
    lock = Attempt(b, ROOT, PUBLISH, {})
    try:
        while not lock.claim("root"):                # another writer updates the root now
            time.sleep(0.02)
        _consolidate(b, run_ids, rebuild, dict(known or {}), tries, lambda: lock.fence("root"))
    finally:
        try:
            lock.release("root")
        finally:
            lock.close()


def _consolidate(b: Backend, run_ids, rebuild: bool, known: dict, tries: int, fence) -> None:
    import warnings

    changed = set(run_ids) | set(known)
    for _ in range(tries):
        root = b.read_json(DOC) or {}
        meta = dict(((root.get("consolidated_metadata") or {}).get("metadata")) or {})
        listed = set(b.list_runs())
        todo = set(listed) if rebuild else (changed | {r for r in listed if f"{RUNS}/{r}" not in meta})
        keep = {k: v for k, v in meta.items() if k != RUNS and _run_of(k) in listed and _run_of(k) not in todo}
        runs_doc = b.read_json(f"{RUNS}/{DOC}") or json.loads(group_doc({}))
        keep[RUNS] = _entry(runs_doc)
        workers = 1 if b.local else min(16, max(1, len(todo)))
        for r in todo & set(known):
            keep.update(known[r])
        with ThreadPoolExecutor(workers) as pool:
            for entries in pool.map(lambda r: run_entries(b, r), sorted(todo - set(known))):
                keep.update(entries)
        root = b.read_json(DOC) or {}
        root.setdefault("zarr_format", 3)
        root.setdefault("node_type", "group")
        root["consolidated_metadata"] = {**_INLINE, "metadata": dict(sorted(keep.items()))}
        fence()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b.write_atomic(DOC, json.dumps(root, separators=(",", ":"), allow_nan=True).encode())
        now = set(b.list_runs())
        missing = {r for r in now - {_run_of(k) for k in keep} if run_entries(b, r)}
        if not missing:
            return
        changed, rebuild, known = missing, False, {}
