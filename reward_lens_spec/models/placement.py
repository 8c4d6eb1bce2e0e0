"""A model beyond one device: ``model.device_map``, ``model.max_memory`` and ``model.offload_folder``.

``model.device_map`` (default null: the whole model on ``model.device``, as before) is ``auto``,
``balanced``, ``sequential`` or an explicit mapping ``{module name: device}`` (a device is ``cpu``,
``disk``, a GPU index ``0`` or ``cuda:N``; ``""`` names the whole model). ``model.max_memory`` caps each
device (``{cpu: 2GiB, 0: 70GiB}``; sizes as bytes or strings with ``B``/``KB``/``MB``/``GB``/``TB`` (powers
of 1000) or ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 1024)). With ``model.device=cpu`` only the CPU (and
disk) is used; with ``cuda`` or ``auto`` every visible GPU, then the CPU, then the disk.

The map is planned **before any weight is read** (``plan_map``): the model is built weightless on the meta
device from its config, and Hugging Face Accelerate's ``infer_auto_device_map`` (after ``get_balanced_memory``
for ``auto``/``balanced``) fills each device up to its cap in module order, never splitting a decoder layer
(``_no_split_modules``). Modules that fit nowhere go to ``disk``; without ``model.offload_folder`` that is a
one-line ``SpecError`` naming ``model.max_memory``, raised before loading. The planned map is then passed to
``from_pretrained`` (or, for a built-in model, ``accelerate.dispatch_model``), so the map recorded in the run's
provenance (``placement_record``) is exactly the one used.

Numbers: Accelerate's hooks copy an offloaded module's weights, bit for bit, to the module's execution
device just before it runs; every module executes on the first GPU of the map when there is one, else on
the CPU (``dispatch_model``). So where a weight *lives* never changes a number: the map is provenance, not
identity. What executes does: the execution device type enters a reduced-precision run's identity
(``execution_type``, via ``run.identity.numerics``), where a kernel's rounding is visible.

Reading the model: ``input_device`` (where input ids go), ``module_device`` (where a module runs),
``materialized`` (a module's offloaded weights present for reading, e.g. the reward head and final norm)
and ``offloaded_value`` (one offloaded tensor, for the fingerprint).
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager

from ..errors import SpecError
from ..model_checks import place_of, size_bytes
import os
from pathlib import Path
import copy

def budget(spec) -> dict | None:
    """``model.max_memory`` as ``{device: bytes}`` (GPU keys as ints), limited to the CPU when
    ``model.device=cpu``; ``None`` leaves Accelerate's default (every visible device's free memory)."""
    device = resolve_device(str(getattr(spec.device, "value", spec.device)))
    mm = {place_of(k, "model.max_memory"): size_bytes(v, f"model.max_memory.{k}")
          for k, v in (spec.max_memory or {}).items()}
    if device == "cpu":
        if "cpu" not in mm:
            from accelerate.utils import get_max_memory
            mm["cpu"] = int(get_max_memory()["cpu"])
        return {"cpu": mm["cpu"]}
    return mm or None


def _covering(names, mapped) -> list[str]:
    """``names`` (parameter names) that no key of ``mapped`` covers (a key covers itself and what is under it)."""
    return [n for n in names if not any(k == "" or n == k or n.startswith(k + ".") for k in mapped)]


def plan_map(spec, skeleton, dtype) -> dict:
    """The device map (``{module name: "cpu" | "disk" | GPU index}``) for ``spec`` on ``skeleton`` (the model,
    weightless on meta or built) in ``dtype`` (a ``torch.dtype``); see the module doc.

    Raises ``SpecError``: ``model.device_map`` (an explicit map that names no module of the model or leaves
    some parameters unplaced, or a GPU that is not visible), ``model.max_memory`` (the caps cannot hold the
    model and no ``model.offload_folder`` is set).
    """
    import torch

    dm = spec.device_map
    params = [n for n, _ in skeleton.named_parameters()]
    if isinstance(dm, Mapping):
        plan = {str(k): place_of(v, f"model.device_map.{k}") for k, v in dm.items()}
        modules = {n for n, _ in skeleton.named_modules()}
        unknown = [k for k in plan if k not in modules]
        if unknown:
            raise SpecError("model.device_map", f"names modules the model does not have: {unknown[:4]}.",
                            fix="use names from model.named_modules(), e.g. model.layers.0, score.")
        left = _covering(params, plan)
        if left:
            raise SpecError("model.device_map", f"leaves {len(left)} parameters unplaced (e.g. {left[0]}).",
                            fix="map every module (the top-level children, e.g. model and score, cover all of it).")
    else:
        from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map
        no_split = list(getattr(skeleton, "_no_split_modules", None) or [])
        caps = budget(spec)
        if dm == "sequential":
            caps = get_max_memory(caps)
        else:
            caps = get_balanced_memory(skeleton, max_memory=caps, no_split_module_classes=no_split, dtype=dtype)
        plan = dict(infer_auto_device_map(skeleton, max_memory=caps, no_split_module_classes=no_split, dtype=dtype))
        on_disk = [k for k, v in plan.items() if v == "disk"]
        if on_disk and not spec.offload_folder:
            need = sum(p.numel() for p in skeleton.parameters()) * torch.finfo(dtype).bits // 8
            held = {k: _mb(v) for k, v in (budget(spec) or get_max_memory()).items()}
            raise SpecError("model.max_memory", f"{held} cannot hold the model ({_mb(need)} in "
                            f"{str(dtype).replace('torch.', '')}): {len(on_disk)} modules ({', '.join(on_disk[:3])}"
                            f"{', …' if len(on_disk) > 3 else ''}) would go to disk and model.offload_folder is not set.",
                            fix="raise model.max_memory, or set model.offload_folder=PATH to stream the rest from disk.")
    gpus = [v for v in plan.values() if isinstance(v, int)]
    if gpus:
        n = torch.cuda.device_count()
        if max(gpus) >= n:
            raise SpecError("model.device_map", f"places modules on GPU {max(gpus)} but {n} GPU(s) are visible.",
                            fix="map to visible GPUs, cpu or disk.")
    return plan


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def execution_type(spec) -> str:
    """``"cuda"`` or ``"cpu"``: the device type a ``ModelSpec``'s modules execute on (every module runs on the
    map's first GPU when it has one, else on the CPU; ``accelerate.dispatch_model``). From the spec alone."""
    device = resolve_device(str(getattr(spec.device, "value", spec.device)))
    dm = spec.device_map
    if device == "cpu":
        return "cpu"
    if isinstance(dm, Mapping):
        return "cuda" if any(isinstance(place_of(v, "model.device_map"), int) for v in dm.values()) else "cpu"
    return "cuda"


# ------------------------------------------------------------------------------------------ a placed model
def is_placed(model) -> bool:
    """True when Accelerate dispatched ``model`` (a device map with hooks)."""
    return getattr(model, "hf_device_map", None) is not None and any(
        hasattr(m, "_hf_hook") for m in model.modules())


def module_device(module):
    """The ``torch.device`` ``module`` executes on: its Accelerate hook's execution device, else its first
    parameter's (or buffer's) device, else the CPU."""
    import torch
    hook = getattr(module, "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    if dev is not None:
        return torch.device(dev if not isinstance(dev, int) else f"cuda:{dev}")
    for t in list(module.parameters()) + list(module.buffers()):
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def input_device(model):
    """Where input ids go: the execution device of the input embeddings (the first module that runs)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return module_device(emb if emb is not None else model)


def compute_dtype(model):
    """The floating dtype the model's weights compute in (meta parameters keep theirs)."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


@contextmanager
def materialized(module):
    """While inside, ``module``'s own offloaded weights (Accelerate's ``align_module_device``) are real tensors
    on its execution device, so they can be read; a module not offloaded is left as it is."""
    if not getattr(getattr(module, "_hf_hook", None), "offload", False):
        yield module
        return
    from accelerate.utils import align_module_device
    with align_module_device(module):
        yield module


def offloaded_value(model, name: str, like):
    """The value of the offloaded tensor ``name`` (on meta in ``model``) from its Accelerate hook's weights map,
    on the CPU in ``like``'s dtype (what the hook hands the module when it runs). ``KeyError`` when no hook
    holds it."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:i])
        mod = model.get_submodule(prefix) if prefix else model
        hook = getattr(mod, "_hf_hook", None)
        if getattr(hook, "offload", False) and getattr(hook, "weights_map", None) is not None:
            key = ".".join(parts[i:])
            try:
                value = hook.weights_map[key]
            except KeyError:
                continue
            return value.to(device="cpu", dtype=like.dtype)
    raise KeyError(name)


def placement_record(lm) -> dict | None:
    """Provenance of a placed model (``None`` when not placed): the map used, the caps, whether a folder held
    offloaded weights, and the execution devices."""
    rec = getattr(lm, "placement", None)
    if not rec:
        return None
    return dict(rec)


def offload_dir(spec, base_dir: str | None = None) -> str | None:
    """``model.offload_folder`` as an absolute path (relative to ``base_dir``, like ``model.source``), created."""
    if not spec.offload_folder:
        return None
    path = Path(os.path.expanduser(str(spec.offload_folder)))
    if not path.is_absolute() and base_dir:
        path = Path(base_dir) / path
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def meta_skeleton(config, num_labels: int):
    """The sequence classifier of ``config`` with ``num_labels`` outputs, weightless on the meta device
    (sizes for ``plan_map``; never runs the checkpoint's own code)."""
    import torch
    import transformers as tf
    cfg = copy.deepcopy(config)
    cfg.num_labels = int(num_labels)
    with torch.device("meta"):
        return tf.AutoModelForSequenceClassification.from_config(cfg, trust_remote_code=False)


def record(spec, plan: dict, folder: str | None, model) -> dict:
    """What ``LoadedModel.placement`` keeps and the run's provenance shows (``placement`` in run attrs): the
    strategy asked for, the map used (module → ``cpu``/``disk``/GPU index as a string), the caps in bytes,
    the offload folder, the devices modules execute on, and how many modules live on each place."""
    counts: dict = {}
    for v in plan.values():
        counts[str(v)] = counts.get(str(v), 0) + 1
    caps = None if spec.max_memory is None else {str(place_of(k, "model.max_memory")): size_bytes(v)
                                                 for k, v in spec.max_memory.items()}
    execs = sorted({str(module_device(m)) for m in model.modules() if hasattr(m, "_hf_hook")} or
                   {str(input_device(model))})
    return {"device_map": spec.device_map if isinstance(spec.device_map, str) else "explicit",
            "map": {k: str(v) for k, v in plan.items()}, "max_memory": caps, "offload_folder": folder,
            "modules_per_place": counts, "execution_devices": execs}


def place_built(model, spec, dtype, base_dir: str | None = None) -> dict:
    """Place a model built in memory (``builtin:``) by ``spec``'s map through ``accelerate.dispatch_model``
    (modules on ``disk`` are written to ``model.offload_folder``); returns its ``record``."""
    from accelerate import dispatch_model
    plan = plan_map(spec, model, dtype)
    folder = offload_dir(spec, base_dir)
    dispatch_model(model, device_map=plan, offload_dir=folder, force_hooks=True)
    return record(spec, plan, folder, model)


def resolve_device(device: str) -> str:
    """``model.device`` as a torch device: ``auto`` → ``cuda`` when visible, else ``cpu``; ``cuda:N`` as it is.

    Raises ``SpecError`` (``model.device``) for ``cuda`` or ``cuda:N`` with no CUDA device visible, or with
    fewer than N + 1."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        want = int(device.split(":", 1)[1]) if ":" in device else 0
        if want >= n:
            seen = "no CUDA device is visible" if n == 0 else f"only {n} CUDA device(s) are visible (cuda:0…cuda:{n - 1})"
            raise SpecError("model.device", f"{device} was asked for but {seen}.",
                            fix="use model.device=cpu or model.device=auto"
                                + (f", or cuda:N with N < {n}." if n else "."))
    return device
