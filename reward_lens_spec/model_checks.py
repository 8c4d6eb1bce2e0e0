"""The model spec's checks that need no model and no torch: what ``spec.validate`` asks of ``model.*`` before
anything loads (``check_model``), and the string-level halves of placement, checkpoint sequences and intervention
artifacts, whose loading halves live in ``models.placement``, ``models.checkpoints`` and ``models.artifacts``.

Placement: ``model.device_map`` is a strategy (``STRATEGIES``) or ``{module: device}``; ``model.max_memory`` caps
devices (``size_bytes``: bytes, or ``KB``/``MB``/``GB``/``TB``, powers of 1000, ``KiB``…``TiB``, powers of 1024);
``model.offload_folder`` holds what goes to ``disk``. Checkpoints: ``model.checkpoints`` (``[A, B, C]`` or
``{folder, steps}``) and ``model.checkpoint`` (the index; ``select_checkpoint`` points the spec at it: string
work only). Interventions: each ``model.interventions`` entry's kind, site, alpha and file suffix
(``check_entry``; the file is read at the door). A model config without ``name`` is named after its source
(``default_model_name``). Errors: ``SpecError`` naming the key and the fix.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import SpecError
from .kinds import check_kind

DEVICES = ("cpu", "cuda", "cuda:N", "auto")       # model.device (models.placement.resolve_device)
DEVICE = re.compile(r"cpu|auto|cuda(:\d+)?")


def check_model(m, partial: bool = False) -> None:
    """Every value of ``m`` (a ``ModelSpec``, changed in place only by ``select_checkpoint``) that can be checked
    without loading: batch size, lengths, placement keys, ``kind`` and its settings, intervention entries, the
    checkpoint sequence, the plain template. ``partial``: ``m`` holds one command-line override's keys (see
    ``spec.validate``), so checks that relate several keys wait. Raises ``SpecError``."""
    bs = m.batch_size
    if not (bs == "auto" or (isinstance(bs, int) and not isinstance(bs, bool) and bs >= 1)):
        raise SpecError("model.batch_size", f"must be a positive integer or auto (wrong type or value: {bs!r}).",
                        fix="set model.batch_size to a value ≥ 1, or auto (the largest the device holds).")
    for key in ("max_length", "num_labels"):
        if getattr(m, key) <= 0:
            raise SpecError(f"model.{key}", f"must be a positive integer, got {getattr(m, key)}.",
                            fix=f"set model.{key} to a value ≥ 1.")
    if not isinstance(m.device, str) or not DEVICE.fullmatch(m.device):
        raise SpecError("model.device", f"unknown device {m.device!r}.", value=m.device, options=DEVICES,
                        fix="set model.device=cpu, cuda (the first GPU), cuda:N (GPU N) or auto.")
    check_placement_keys(m, partial)            # model.device_map / max_memory / offload_folder
    if m.max_tokens is not None and m.max_tokens <= 0:
        raise SpecError("model.max_tokens", f"must be positive or null, got {m.max_tokens}.",
                        fix="set model.max_tokens=N with N ≥ 1 (tokens per capture batch), or null (no cap).")
    check_kind(m)                               # model.kind and its settings (did you mean)
    if m.interventions:                         # the form of each entry; files are read at the door
        if m.kind != "classifier":
            raise SpecError("model.interventions", f"interventions apply to a classifier's forward pass, not to "
                            f"kind {m.kind}.", fix="drop model.interventions or use model.kind=classifier.")
        for i, e in enumerate(m.interventions):
            check_entry(e, f"model.interventions.{i}")
    if not partial:
        select_checkpoint(m)                    # model.checkpoints: source and name of checkpoint i
    if m.format == "plain" and "{response}" not in m.template:
        raise SpecError("model.template", "a plain template must contain {response}.",
                        fix="e.g. 'User: {prompt}\\nAssistant: {response}'.")


# ---- placement: model.device_map, model.max_memory, model.offload_folder (models.placement plans the map)
STRATEGIES = ("auto", "balanced", "sequential")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_FIX_MAP = ("model.device_map=auto (or balanced, sequential), or a mapping such as "
            "'{model.embed_tokens: cpu, model.layers: disk, model.norm: cpu, score: cpu}'.")


def size_bytes(value, key: str = "model.max_memory") -> int:
    """``value`` (an int of bytes or a string such as ``"2GiB"``, ``"500MB"``) as bytes; ``SpecError`` naming ``key``."""
    if isinstance(value, bool):
        raise SpecError(key, f"a size is bytes or a string like '2GiB', got {value!r}.",
                        fix=f"give {key} a size such as 2GiB or 500MB (a bare number is bytes).")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        if not m or m.group(2).upper() not in _UNITS:
            raise SpecError(key, f"cannot read the size {value!r}.", fix="give bytes or e.g. 2GiB, 500MB, 400KB.")
        n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n <= 0:
        raise SpecError(key, f"a size must be positive, got {value!r}.", fix=f"give {key} a size above 0, e.g. 2GiB.")
    return n


def place_of(value, key: str):
    """A device of a map or a ``max_memory`` key: ``"cpu"``, ``"disk"``, an int GPU index (``cuda:N`` → N)."""
    if isinstance(value, bool):
        raise SpecError(key, f"{value!r} is not a device.", fix="use cpu, disk, a GPU index (0) or cuda:N.")
    if isinstance(value, int) and value >= 0:
        return value
    v = str(value).strip().lower()
    if v in ("cpu", "disk"):
        return v
    if v.isdigit():
        return int(v)
    if v in ("cuda", "gpu"):
        return 0
    if re.fullmatch(r"cuda:[0-9]+", v):
        return int(v.split(":")[1])
    raise SpecError(key, f"{value!r} is not a device.", fix="use cpu, disk, a GPU index (0) or cuda:N.")


def check_placement_keys(m, partial: bool = False) -> None:
    """Validate ``model.device_map``, ``model.max_memory`` and ``model.offload_folder`` of a ``ModelSpec`` (no
    torch, no model): ``SpecError`` naming the key. Used by ``spec.validate`` (``partial``: a config of some
    overrides only, where a key that needs another may not see it yet)."""
    dm, mm, folder = m.device_map, m.max_memory, m.offload_folder
    if dm is None and partial:
        return
    if dm is None:
        for key, val in (("max_memory", mm), ("offload_folder", folder)):
            if val is not None:
                raise SpecError(f"model.{key}", "is only used when model.device_map places the model.",
                                fix=f"add model.device_map=auto, or drop model.{key}.")
        return
    if str(getattr(m, "kind", "classifier")) != "classifier":
        raise SpecError("model.device_map", f"places a classifier only, not model.kind={m.kind}.",
                        fix="drop model.device_map for this kind.")
    if isinstance(dm, str):
        if dm not in STRATEGIES:
            raise SpecError("model.device_map", f"unknown strategy {dm!r}.", value=dm, options=STRATEGIES,
                            fix=_FIX_MAP)
    elif isinstance(dm, Mapping):
        if not dm:
            raise SpecError("model.device_map", "an empty mapping places nothing.", fix=_FIX_MAP)
        places = [place_of(v, f"model.device_map.{k}") for k, v in dm.items()]
        if str(m.device.value if hasattr(m.device, "value") else m.device) == "cpu" and \
                any(isinstance(p, int) for p in places):
            raise SpecError("model.device_map", "names a GPU but model.device=cpu.",
                            fix="set model.device=cuda (or auto), or map those modules to cpu or disk.")
        if "disk" in places and not folder and not partial:
            raise SpecError("model.offload_folder", "model.device_map sends modules to disk but names no folder "
                            "for them.", fix="set model.offload_folder=PATH (a folder with room for those weights).")
    else:
        raise SpecError("model.device_map", f"must be a strategy or a mapping, got {dm!r}.", fix=_FIX_MAP)
    if mm is not None:
        if not isinstance(mm, Mapping) or not mm:
            raise SpecError("model.max_memory", f"must be a mapping {{device: size}}, got {mm!r}.",
                            fix="e.g. model.max_memory='{cpu: 2GiB}' or '{0: 70GiB, cpu: 200GiB}'.")
        for k, v in mm.items():
            p = place_of(k, "model.max_memory")
            if p == "disk":
                raise SpecError("model.max_memory", "the disk has no cap here: what fits nowhere else goes there.",
                                fix="drop the disk entry; set model.offload_folder to allow disk offload.")
            if isinstance(p, int) and str(getattr(m.device, "value", m.device)) == "cpu":
                raise SpecError("model.max_memory", f"names GPU {p} but model.device=cpu.",
                                fix="set model.device=cuda (or auto), or cap only cpu.")
            size_bytes(v, f"model.max_memory.{k}")
    if folder is not None and not str(folder).strip():
        raise SpecError("model.offload_folder", "is empty.", fix="name a folder, or drop the key.")


# ---- checkpoint sequences: model.checkpoints, model.checkpoint (models.checkpoints chains them)
_FIX = ("model.checkpoints=[folder_a, folder_b, ...] or model.checkpoints={folder: RUN_DIR, steps: [100, 200]} "
        "(RUN_DIR/checkpoint-<step>)")


@dataclass(frozen=True)
class Checkpoint:
    index: int
    source: str            # a model source (folder path, hub id, organism:...)
    step: int | None       # training step (the {folder, steps} form), else None
    label: str             # "step<s>" or the entry's folder name


def sequence(spec) -> list[Checkpoint]:
    """The checkpoints ``spec.checkpoints`` names, in order (``[]`` when none). ``SpecError`` on a bad form."""
    cps = getattr(spec, "checkpoints", None)
    if cps is None:
        return []
    if isinstance(cps, dict):
        unknown = sorted(set(cps) - {"folder", "steps"})
        if unknown or not cps.get("folder") or not cps.get("steps"):
            raise SpecError("model.checkpoints", f"a mapping needs exactly 'folder' and a non-empty 'steps' list "
                            f"(got keys {sorted(cps)}).", fix=_FIX)
        steps = list(cps["steps"])
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in steps):
            raise SpecError("model.checkpoints.steps", f"steps must be non-negative integers, got {steps}.", fix=_FIX)
        if steps != sorted(set(steps)):
            raise SpecError("model.checkpoints.steps", f"steps must increase strictly (training order), got {steps}.",
                            fix="list each step once, in increasing order.")
        folder = str(cps["folder"]).rstrip("/")
        return [Checkpoint(i, f"{folder}/checkpoint-{s}", int(s), f"step{s}") for i, s in enumerate(steps)]
    if isinstance(cps, (list, tuple)):
        if not cps or not all(isinstance(c, str) and c.strip() for c in cps):
            raise SpecError("model.checkpoints", f"a list must name at least one checkpoint, each a source string; "
                            f"got {list(cps)}.", fix=_FIX)
        if len(set(cps)) != len(cps):
            raise SpecError("model.checkpoints", "a checkpoint is listed twice.", value=list(cps), fix=_FIX)
        return [Checkpoint(i, str(c), None, str(c).rstrip("/").rsplit("/", 1)[-1] or str(c))
                for i, c in enumerate(cps)]
    raise SpecError("model.checkpoints", f"must be a list of checkpoints or a {{folder, steps}} mapping, got {cps!r}.",
                    fix=_FIX)


def select_checkpoint(spec) -> None:
    """Point ``spec`` (a ``ModelSpec``, changed in place) at checkpoint ``spec.checkpoint`` of its sequence:
    ``source`` and ``name`` (see the module doc). No sequence: nothing to do (``model.checkpoint`` alone is
    refused). Raises ``SpecError``."""
    seq = sequence(spec)
    i = getattr(spec, "checkpoint", None)
    if not seq:
        if i is not None:
            raise SpecError("model.checkpoint", "selects a checkpoint of model.checkpoints, which is not set.",
                            fix=f"set {_FIX}, or drop model.checkpoint.")
        return
    if i is None:
        raise SpecError("model.checkpoint", f"model.checkpoints names {len(seq)} checkpoints; a run reads one.",
                        fix=f"model.checkpoint=<0..{len(seq) - 1}>, or sweep them all: "
                            "reward-lens-spec -m ... model.checkpoint=all")
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(seq):
        raise SpecError("model.checkpoint", f"no checkpoint {i!r}: the sequence has indices 0..{len(seq) - 1}.",
                        value=i, fix="model.checkpoint=<index>, or model.checkpoint=all with -m.")
    cp = seq[i]
    spec.source = cp.source
    base = spec.name.split("@", 1)[0]
    spec.name = f"{base}@{cp.label}"


def checkpoint_indices(spec) -> list[int]:
    """Every index of ``spec``'s sequence (what ``model.checkpoint=all`` expands to); ``SpecError`` without one."""
    seq = sequence(spec)
    if not seq:
        raise SpecError("model.checkpoint", "'all' sweeps model.checkpoints, which is not set.", fix=f"set {_FIX}.")
    return [cp.index for cp in seq]


# ---- intervention entries: model.interventions (models.artifacts reads the files)
INTERVENTION_KINDS = ("erase", "steer", "head")
SITES = ("resid_post", "attn_out", "mlp_out")
_SITE = re.compile(r"(resid_post|attn_out|mlp_out)\.(\d+)")


def parse_site(site, kind: str, key: str) -> tuple[str, int] | None:
    """``(site, layer)`` of ``<resid_post|attn_out|mlp_out>.<layer>`` (``erase``/``steer``); ``None`` for a head
    (site ``readout`` or null). Raises ``SpecError`` naming ``key`` otherwise."""
    if kind == "head":
        if site not in (None, "", "readout"):
            raise SpecError(key, f"a head replaces the reward head at the readout; site {site!r} does not apply.",
                            fix="drop site (or set site: readout).")
        return None
    m = _SITE.fullmatch(str(site or ""))
    if m is None:
        raise SpecError(key, f"unknown site {site!r} for kind {kind}.", value=str(site),
                        options=[f"{s}.<layer>" for s in SITES], fix="e.g. site: resid_post.3 (layer 3's output).")
    return m.group(1), int(m.group(2))


def check_entry(entry, key: str) -> None:
    """The form of one ``model.interventions`` entry at ``key`` (``model.interventions.0``); no file read."""
    if entry.kind not in INTERVENTION_KINDS:
        raise SpecError(key + ".kind", f"unknown intervention kind {entry.kind!r}.", value=entry.kind,
                        options=INTERVENTION_KINDS)
    parse_site(entry.site, entry.kind, key + ".site")
    if entry.kind != "steer" and float(entry.alpha) != 1.0:
        raise SpecError(key + ".alpha", f"alpha scales a steering vector; a {entry.kind} takes none.",
                        fix="drop alpha.")
    if not str(entry.path).endswith(".safetensors"):
        raise SpecError(key + ".path", f"{entry.path!r} is not a .safetensors file; only safetensors artifacts are "
                        "read (a pickle can run code).",
                        fix="export it with `reward-lens-spec export ... out=NAME.safetensors`.")




def default_model_name(source: str, gguf_file: str | None = None) -> str:
    """The label of a model config that gives a ``source`` but no ``name``: the folder's basename or a hub
    id's last part (``models/smollm2_hh`` -> ``smollm2_hh``); for ``package:<module>``, the GGUF file's
    stem when ``gguf_file`` is set, else the module; for ``builtin:<name>``, the name."""
    src = str(source).strip()
    if src.startswith("builtin:"):
        return src.split(":", 1)[1] or src
    if src.startswith("package:"):
        if gguf_file:
            stem = str(gguf_file).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
            return stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
        return src.split(":", 1)[1] or src
    return src.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or src
