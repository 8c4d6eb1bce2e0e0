"""transformers' LOAD REPORT (a table of a checkpoint's missing, unexpected and mismatched tensors, logged as a
warning by ``transformers.modeling_utils`` on every ``from_pretrained`` that meets one) as this package's one line.

A classifier loaded from a causal-LM or base checkpoint always meets one: ``score.weight MISSING`` (the head
``models.head_init`` refuses or makes deterministically, in its own words) and a causal LM's ``lm_head``
``UNEXPECTED`` (a classifier has none). ``held_report`` holds the table back while such a load runs; what it
would have said that matters comes back as one line: tensors the checkpoint holds that the classifier does not
use, beside the language-model head (``unused_warning``: a reward head stored under another name is not
used), and a head whose size is not ``model.num_labels`` (``mismatch_error``: transformers raises a
``RuntimeError`` pointing at the table).
"""
from __future__ import annotations

import logging
import re
import warnings
from contextlib import contextmanager

from ..errors import SpecError

LOGGER = "transformers.modeling_utils"       # the logger transformers hands its loading report to
CONFIG_LOGGER = "transformers.configuration_utils"   # its "num_labels=… incompatible to the id2label map" line
_SIZES = re.compile(r"ckpt: torch\.Size\(\[([\d, ]*)\]\) vs model: ?torch\.Size\(\[([\d, ]*)\]\)")


@contextmanager
def held_report():
    """Within: transformers' LOAD REPORT records (and its configuration's line on a ``num_labels`` that differs
    from the checkpoint's ``id2label``, which ``mismatch_error`` or the head's own line says better) are held back
    (the list yielded gets each one's text); any other record of those loggers passes. On an error inside other
    than a ``SpecError`` (which says what they said), the held records are logged as they were (their details are
    the error's) before the error goes on."""
    logs = [logging.getLogger(LOGGER), logging.getLogger(CONFIG_LOGGER)]
    held: list[str] = []
    records: list[tuple[logging.Logger, logging.LogRecord]] = []

    def holder(log):
        def hold(record: logging.LogRecord) -> bool:
            text = record.getMessage()
            if "LOAD REPORT" in text or ("num_labels" in text and "id2label" in text):
                held.append(text)
                records.append((log, record))
                return False
            return True
        return hold

    filters = [(log, holder(log)) for log in logs]
    for log, f in filters:
        log.addFilter(f)
    try:
        yield held
    except SpecError:
        raise
    except BaseException:
        for log, f in filters:
            log.removeFilter(f)
        for log, record in records:
            log.handle(record)
        raise
    finally:
        for log, f in filters:
            log.removeFilter(f)


def unused_warning(source: str, unexpected, head_keys=("lm_head",)) -> None:
    """One ``UserWarning`` line naming the checkpoint tensors (``unexpected``, transformers' loading info) the
    classifier does not use, beside a language-model head's (``head_keys``, top-level module names); nothing
    when there are none."""
    unused = sorted(k for k in map(str, unexpected or ()) if k.split(".", 1)[0] not in head_keys)
    if unused:
        shown = ", ".join(unused[:6]) + (f", … ({len(unused)} in all)" if len(unused) > 6 else "")
        warnings.warn(f"model.source '{source}': the checkpoint holds tensors a sequence classifier does not use "
                      f"({shown}); they were not loaded (a reward head stored under another name is not used). "
                      "Fix: point model.source at a classifier checkpoint, or convert its head to the "
                      "classifier's (score).", UserWarning, stacklevel=3)


def mismatch_error(source: str, num_labels: int, held: list[str], exc: Exception) -> SpecError | None:
    """The ``SpecError`` for transformers' ``RuntimeError`` on tensors whose size differs from the checkpoint's
    (``held``: the reports ``held_report`` kept): ``model.num_labels`` when only the head's rows differ, else
    ``model.source``; None for another error."""
    if "ignore_mismatched_sizes" not in str(exc):
        return None
    rows = [ln for text in held for ln in text.splitlines() if "MISMATCH" in ln and "|" in ln]
    keys = [ln.split("|", 1)[0].strip() for ln in rows]
    sizes = [_SIZES.search(ln) for ln in rows]
    shapes = [(tuple(int(x) for x in m.group(1).split(",") if x.strip()),
               tuple(int(x) for x in m.group(2).split(",") if x.strip())) if m else None for m in sizes]
    said = ", ".join(f"{k} {list(s[0])} in the checkpoint, {list(s[1])} here" if s else k
                     for k, s in zip(keys, shapes)) or "some tensors"
    head_rows = {s[0][0] for s in shapes if s and s[0] and s[0][1:] == s[1][1:] and s[1][0] == num_labels}
    if shapes and all(s is not None for s in shapes) and len(head_rows) == 1:
        (n,) = head_rows
        return SpecError("model.num_labels", f"'{source}' has a reward head with {n} output(s), not "
                         f"model.num_labels={num_labels} ({said}).", fix=f"set model.num_labels={n}.")
    return SpecError("model.source", f"'{source}' holds tensors of other sizes than this architecture's ({said}).",
                     fix="point model.source at a checkpoint of this architecture.")
