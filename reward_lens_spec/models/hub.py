"""The one guarded loader: every transformers ``from_pretrained`` of the package is in this module.

Config, tokenizer and sequence classifier (and ArmoRM's config and tokenizer, ``models.armorm``)
are read here, and only here, so one set of rules holds on every route (run, validate, fit, frames,
partners):

* ``trust_remote_code`` is always passed, as a ``bool`` (``model.trust_remote_code``, default
  false); anything else is a ``TypeError``. Given ``None``, transformers would ask on stdin and run
  a checkpoint's own Python (``auto_map``) on a "y". While a call runs, transformers' prompt
  timeout is also set to 0 (``no_prompt``), so no code path of it can read stdin.
* With trust false, a checkpoint whose ``auto_map`` names its own Python loads with transformers'
  own class when the model type is one transformers ships; otherwise it is refused with a
  one-line ``SpecError`` naming ``model.trust_remote_code`` (``remote_code_error``).
* Weights: safetensors only (``use_safetensors=True``) unless ``allow_pickle``; GGUF files are read
  by transformers' GGUF loader (``gguf_file``). Pickle weights that torch's safe loader (``weights_only``)
  refuses give one ``SpecError`` naming ``model.allow_pickle`` (``unpickling_error``), not a traceback.
* ``load_classifier`` also returns the tensors the checkpoint lacked (transformers'
  ``output_loading_info``), so the caller can refuse, or deterministically make, a missing head
  (``models.head_init``) instead of taking transformers' random one. transformers' LOAD REPORT table is
  held back there (``models.load_report``): unused tensors beside a causal LM's head are one warning line, a
  head of another size than ``model.num_labels`` one ``SpecError`` naming it.

Other failures to read a checkpoint raise a ``SpecError`` naming ``model.source``.
"""
from __future__ import annotations

import pickle
import threading
from contextlib import contextmanager

from ..errors import SpecError
from ..admission import permitted

_PROMPT_LOCK = threading.Lock()
_DEPTH, _SAVED = [0], [None]          # how many callers are inside no_prompt; transformers' own timeout


def trust_remote_code(spec) -> bool:
    """``model.trust_remote_code`` as a bool, never ``None`` (transformers asks on stdin when given ``None``),
    honoured only as the model door allowed it (``admission.permitted``; ``SpecError`` otherwise)."""
    return permitted(spec, "trust_remote_code")


def _source(spec_or_source) -> str:
    return str(getattr(spec_or_source, "source", spec_or_source))


def remote_code_error(spec, exc: Exception) -> SpecError | None:
    """The clear error for transformers' refusal to run a checkpoint's own code (``None`` for other errors).

    ``spec``: a ``ModelSpec`` or the source string, for the message.
    """
    text = str(exc)
    if "trust_remote_code" not in text and "custom code" not in text:
        return None
    return SpecError("model.trust_remote_code", f"'{_source(spec)}' needs its own Python code (an auto_map in "
                     "config.json or tokenizer_config.json) and model.trust_remote_code is false, so it was not run.",
                     fix="read that code; set model.trust_remote_code=true only if you trust it, or use a "
                         "checkpoint of a model type transformers ships.")


def _check_trust(trust) -> bool:
    if not isinstance(trust, bool):
        raise TypeError(f"trust_remote_code must be True or False, got {trust!r} (None makes transformers ask "
                        "on stdin).")
    return trust


@contextmanager
def no_prompt():
    """While inside, transformers' "run the custom code? [y/N]" prompt times out at once (never reads stdin).

    Nests and works across threads: the setting is restored when the last one leaves; loads are not serialized.
    """
    import transformers.dynamic_module_utils as dmu

    with _PROMPT_LOCK:
        if _DEPTH[0] == 0:
            _SAVED[0] = getattr(dmu, "TIME_OUT_REMOTE_CODE", None)
        _DEPTH[0] += 1
        dmu.TIME_OUT_REMOTE_CODE = 0
    try:
        yield
    finally:
        with _PROMPT_LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                dmu.TIME_OUT_REMOTE_CODE = _SAVED[0]


def _kwargs(trust, gguf_file, revision) -> dict:
    kw: dict = {"trust_remote_code": _check_trust(trust)}
    if gguf_file:
        kw["gguf_file"] = gguf_file
    if revision:
        kw["revision"] = revision
    return kw


def unpickling_error(source, exc: Exception) -> SpecError:
    """One line for pickle weights torch's safe loader (``weights_only``) refused: the global it would have
    called, named; nothing of the file ran."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    why = next((ln for ln in lines if "GLOBAL" in ln or "Unsupported" in ln), lines[0] if lines else "")
    return SpecError("model.allow_pickle", f"torch refused to unpickle the weights of '{source}' ({why.rstrip('.')}); "
                     "nothing of the file was run.",
                     fix="use a safetensors checkpoint of this model (convert it only where you trust the file).")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def load_config(loc, *, trust_remote_code: bool, source: str | None = None, gguf_file: str | None = None,
                revision: str | None = None):
    """The transformers config at ``loc`` (folder, hub id; ``gguf_file`` inside it), no weights.

    Raises ``SpecError``: ``model.trust_remote_code`` (custom code refused), ``model.source`` (unreadable).
    """
    import transformers as tf

    kw = _kwargs(trust_remote_code, gguf_file, revision)
    try:
        with no_prompt():
            return tf.AutoConfig.from_pretrained(str(loc), **kw)
    except (OSError, ValueError) as exc:
        raise remote_code_error(source or loc, exc) or SpecError(
            "model.source", f"cannot read the model config at '{source or loc}': {_first_line(exc)}",
            fix="set model.source to a local folder with config.json or a Hub id (org/name), "
                "and model.revision if needed.") from None


def load_tokenizer(loc, *, trust_remote_code: bool, source: str | None = None, gguf_file: str | None = None,
                   revision: str | None = None):
    """The tokenizer at ``loc``. Raises ``SpecError`` like ``load_config`` (``model.source`` also for a folder
    without tokenizer files)."""
    import transformers as tf

    kw = _kwargs(trust_remote_code, gguf_file, revision)
    try:
        with no_prompt():
            tok = tf.AutoTokenizer.from_pretrained(str(loc), **kw)
    except (OSError, ValueError) as exc:       # (a folder without tokenizer files: transformers' ValueError)
        raise remote_code_error(source or loc, exc) or SpecError(
            "model.source", f"could not load the tokenizer of '{source or loc}': {_first_line(exc)}",
            fix="put the model's tokenizer files in that folder (tokenizer.json and tokenizer_config.json, as "
                "save_pretrained writes them), or point model.source at a folder or Hub id that has them "
                "(tests never download).") from None
    from .tiny_tokenizer import no_whole_text_cache
    return no_whole_text_cache(tok)           # a texts-sized cache that saves nothing (no pre-tokenizer split)


def _weights(auto: str, loc, *, trust_remote_code: bool, dtype, allow_pickle: bool, source, gguf_file, revision,
             attn_implementation, **extra):
    """``transformers.<auto>.from_pretrained(loc)`` under this module's rules (the one call of it for weights)."""
    import transformers as tf

    kw = _kwargs(trust_remote_code, gguf_file, revision)
    kw.update(extra)
    if dtype is not None:
        kw["dtype"] = dtype
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    if not gguf_file:
        kw["use_safetensors"] = None if allow_pickle else True
    try:
        with no_prompt():
            return getattr(tf, auto).from_pretrained(str(loc), **kw)
    except ValueError as exc:
        err = remote_code_error(source or loc, exc)
        if err is None:
            raise
        raise err from None
    except pickle.UnpicklingError as exc:
        raise unpickling_error(source or loc, exc) from None
    except OSError as exc:
        hint = ("weights are not safetensors: set model.allow_pickle=true only if you trust the file."
                if "safetensors" in str(exc).lower() else "check model.source (tests never download).")
        raise SpecError("model.source", f"could not load '{source or loc}': {_first_line(exc)}", fix=hint) from None


def load_classifier(loc, *, trust_remote_code: bool, num_labels: int, dtype=None, allow_pickle: bool = False,
                    source: str | None = None, gguf_file: str | None = None, revision: str | None = None,
                    attn_implementation: str | None = None, device_map: dict | None = None,
                    offload_folder: str | None = None) -> tuple:
    """``(model, missing_keys)``: the ``AutoModelForSequenceClassification`` at ``loc`` and the names of
    the tensors its checkpoint lacked (transformers initialised those at random; see ``models.head_init``).

    Weights come from safetensors only unless ``allow_pickle`` (not for ``gguf_file``). ``device_map`` (planned
    by ``models.placement.plan_map``) and ``offload_folder`` place it over devices through Accelerate. Raises ``SpecError``:
    ``model.trust_remote_code`` (custom code refused), ``model.source`` (unreadable; pickle weights
    without ``allow_pickle`` say so).
    """
    from .load_report import held_report, mismatch_error, unused_warning

    with held_report() as held:             # the missing head is models.head_init's to refuse or make
        try:
            model, info = _weights("AutoModelForSequenceClassification", loc, trust_remote_code=trust_remote_code,
                                   dtype=dtype, allow_pickle=allow_pickle, source=source, gguf_file=gguf_file,
                                   revision=revision, attn_implementation=attn_implementation,
                                   num_labels=int(num_labels), output_loading_info=True,
                                   **({"device_map": device_map, "offload_folder": offload_folder} if device_map
                                      else {}))
        except RuntimeError as exc:
            err = mismatch_error(str(source or loc), int(num_labels), held, exc)
            if err is None:
                raise
            raise err from None
    unused_warning(str(source or loc), (info or {}).get("unexpected_keys"))
    missing = tuple(sorted(str(k) for k in (info or {}).get("missing_keys") or ()))
    return model, missing


def load_causal_lm(loc, *, trust_remote_code: bool, dtype=None, allow_pickle: bool = False, source: str | None = None,
                   gguf_file: str | None = None, revision: str | None = None, attn_implementation: str | None = None):
    """The ``AutoModelForCausalLM`` at ``loc`` (a judge, or a policy or reference of ``model.kind=implicit``),
    under the same rules as ``load_classifier``: ``trust_remote_code`` a bool, safetensors unless
    ``allow_pickle``, GGUF via ``gguf_file``. Raises ``SpecError``: ``model.trust_remote_code`` (custom code
    refused), ``model.source``."""
    return _weights("AutoModelForCausalLM", loc, trust_remote_code=trust_remote_code, dtype=dtype,
                    allow_pickle=allow_pickle, source=source, gguf_file=gguf_file, revision=revision,
                    attn_implementation=attn_implementation)
