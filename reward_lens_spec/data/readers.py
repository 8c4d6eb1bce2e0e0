"""Readers of TRL's dataset shapes: one object per shape, each shaped like xarray's ``BackendEntrypoint``.

Every reader has ``name``, ``description``, ``url`` (where the shape is defined), ``open_dataset_parameters``,
``guess_can_open(filename_or_obj)`` (a path, whose first record is looked at, or one record) and
``open_dataset(filename_or_obj, **kw)`` (the ``PairSet`` of a file, through the one loading path,
``inputs.load_dataset``, by the dataset reader of the shape's kind), plus
``read_row(row, where, mapping)``: one record as a ``Pair`` (id left ``None`` for ``load_pairs`` to make), a
``SpecError`` naming the row (``line N`` / ``item N``) and the field otherwise. ``READERS`` lists them; the
``trl`` dataset kind picks the first preference reader whose ``guess_can_open`` takes the file's first record,
and every later record must be of that shape.

Shapes (TRL's dataset formats, huggingface.co/docs/trl/dataset_formats):

=========================  ===========================================================================
``standard_explicit``      ``prompt``, ``chosen``, ``rejected``: strings
``standard_implicit``      ``chosen``, ``rejected``: strings that both hold the prompt
``conversational_explicit``  ``prompt``, ``chosen``, ``rejected``: lists of ``{role, content}`` messages
``conversational_implicit``  ``chosen``, ``rejected``: whole conversations (message lists)
``stepwise``               ``prompt`` (string), ``completions`` (list of step strings), ``labels`` (list of
                           bools, one per step): one response per row, not a pair (TRL's stepwise
                           supervision, for process reward models)
=========================  ===========================================================================

**The implicit prompt** (``implicit_prompt``). Conversational: the prompt is the longest common prefix of the
two message lists, messages compared whole (every key and value equal), capped so that each side keeps at
least its last message; the rest of each list is that side's response. Standard: the prompt is the longest
common prefix of the two strings (code points compared exactly), cut back to just before the last whitespace
character inside it — so a response starts at a word boundary, never inside a word; with no whitespace in
the common prefix the prompt is empty and each string is wholly its response. Worked: ``"The sky is blue."``
/ ``"The sky is green."`` → prompt ``"The sky is"``, responses ``" blue."`` / ``" green."``; ``"x = 42"`` /
``"x = 43"`` → ``"x ="``, ``" 42"`` / ``" 43"``.

**Messages in a Pair.** A conversational side is kept as the canonical JSON text of its message list
(``messages_text``: keys sorted, no whitespace, code points as given), so checksums and ids cover every
message exactly. The run renders prompt + response messages with a chat template (``inputs.encode``,
``models.formatting`` format ``messages``): ``dataset.chat_template`` when set, else the model's tokenizer's.

**A stepwise row** becomes a ``Pair`` whose ``chosen`` and ``rejected`` both hold the response — the steps,
each followed by ``step_separator`` (TRL's ``PRMConfig.step_separator``, ``"\\n"`` by default), since the
executor's unit is a two-sided row — and whose meta ``step_labels`` holds the labels (in the checksum,
``data.checksum.LABEL_META``). Only row-reading instruments read such data (``ops.prm_labels``); the
pair-shaped ones are refused at plan time (``planning.refuse_row_data``).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..errors import SpecError
from ..registries import DATASET_READERS
from .pairs import Pair, make_meta

TRL_URL = "https://huggingface.co/docs/trl/dataset_formats"
STEP_LABELS = "step_labels"           # Pair.meta key of a stepwise row's labels


def messages_text(messages: list) -> str:
    """The canonical JSON text of a message list (keys sorted, no whitespace, code points kept)."""
    return json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def implicit_prompt(chosen, rejected) -> int:
    """Where the implicit prompt ends: the number of leading messages (lists) or code points (strings) of
    ``chosen``/``rejected`` that form the prompt (the rule in the module docstring)."""
    if isinstance(chosen, list):
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
            n += 1
        return n
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    return next((j for j in range(k - 1, -1, -1) if chosen[j].isspace()), 0)


class _Reader:
    """What every reader shares: the field mapping, typed getters, the extra keys kept as meta."""

    name = ""
    description = ""
    url = TRL_URL
    open_dataset_parameters = ("path", "fields", "limit", "dimensions", "base_dir")
    kind = "trl"
    names: tuple[str, ...] = ()        # the row keys the shape reads (dataset.fields may rename them)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {self.description}>"

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        """True when ``filename_or_obj`` — one record, or a file whose first record is read — has this shape."""
        row = filename_or_obj if isinstance(filename_or_obj, Mapping) else _first_record(filename_or_obj)
        return isinstance(row, Mapping) and self.matches(row, {})

    def open_dataset(self, filename_or_obj, **kw):
        """The ``PairSet`` of a file of this shape, read by the dataset reader of its kind (``trl`` or
        ``trl_stepwise``, ``registries.DATASET_READERS``) through the one loading path (``inputs.load_dataset``)."""
        return DATASET_READERS.get(self.kind).open_dataset(filename_or_obj, **kw)

    def matches(self, row: Mapping, mapping: dict) -> bool:
        raise NotImplementedError

    def read_row(self, row: Mapping, where: str, mapping: dict) -> Pair:
        raise NotImplementedError

    # -- helpers
    def key(self, mapping: dict, name: str) -> str:
        return mapping.get(name, name)

    def need(self, row, where, mapping, name):
        key = self.key(mapping, name)
        if key not in row:
            raise SpecError(f"dataset.fields.{name}", f"{where} has no key {key!r} for field '{name}' of shape "
                            f"{self.name} (keys present: {', '.join(sorted(row))}).",
                            fix=f"give every row '{key}', or set dataset.fields.{name}=<key>.")
        return row[key]

    def text(self, row, where, mapping, name) -> str:
        value = self.need(row, where, mapping, name)
        if not isinstance(value, str):
            raise SpecError(f"dataset.fields.{name}", f"{where}: '{self.key(mapping, name)}' must be a string in "
                            f"shape {self.name}, got {type(value).__name__}.",
                            fix="make every row of the file one shape (TRL's dataset formats).")
        return value

    def messages(self, row, where, mapping, name) -> list:
        value = self.need(row, where, mapping, name)
        field = self.key(mapping, name)
        if not isinstance(value, list) or not value:
            raise SpecError(f"dataset.fields.{name}", f"{where}: '{field}' must be a non-empty list of "
                            f"{{role, content}} messages in shape {self.name}, got "
                            f"{type(value).__name__ if value != [] else 'an empty list'}.",
                            fix="make every row of the file one shape (TRL's dataset formats).")
        for j, m in enumerate(value):
            if not isinstance(m, dict):
                raise SpecError(f"dataset.fields.{name}", f"{where}: {field}[{j}] is a {type(m).__name__}, not a "
                                "{role, content} message.", fix="write each message as {\"role\": ..., \"content\": ...}.")
            for k in ("role", "content"):
                if not isinstance(m.get(k), str):
                    raise SpecError(f"dataset.fields.{name}", f"{where}: {field}[{j}] has no string '{k}'"
                                    f"{'' if k not in m else f' (got {type(m[k]).__name__})'}.",
                                    fix="write each message as {\"role\": ..., \"content\": ...} with strings.")
        return value

    def pair(self, row, mapping, used, prompt, chosen, rejected, **extra_meta) -> Pair:
        opt = {}
        for name in ("id", "dimension", "source"):
            key = self.key(mapping, name)
            if isinstance(row.get(key), str):
                opt[name] = row[key]
                used.add(key)
        meta = {k: v for k, v in row.items() if k not in used}
        meta.update(extra_meta)
        return Pair(id=opt.get("id"), prompt=prompt, chosen=chosen, rejected=rejected,
                    dimension=opt.get("dimension", ""), source=opt.get("source", ""), meta=make_meta(meta))


class StandardExplicit(_Reader):
    name = "standard_explicit"
    description = "prompt, chosen, rejected: strings"
    names = ("prompt", "chosen", "rejected")

    def matches(self, row, mapping):
        return all(isinstance(row.get(self.key(mapping, n)), str) for n in self.names)

    def read_row(self, row, where, mapping):
        p, c, r = (self.text(row, where, mapping, n) for n in self.names)
        return self.pair(row, mapping, {self.key(mapping, n) for n in self.names}, p, c, r)


class _Implicit(_Reader):
    """An implicit-prompt shape: ``chosen``/``rejected`` both hold the prompt, split at ``implicit_prompt``."""

    names = ("chosen", "rejected")
    value_type: type = str

    def matches(self, row, mapping):
        return self.key(mapping, "prompt") not in row and all(isinstance(row.get(self.key(mapping, n)), self.value_type)
                                                                for n in self.names)

    def side(self, row, where, mapping, name):
        raise NotImplementedError

    def as_text(self, part):
        return part

    def read_row(self, row, where, mapping):
        if self.key(mapping, "prompt") in row:
            raise SpecError("dataset.fields.prompt", f"{where} has a '{self.key(mapping, 'prompt')}' key, but the "
                            "file's first row made it implicit-prompt (no prompt key).",
                            fix="make every row of the file one shape (TRL's dataset formats).")
        c, r = (self.side(row, where, mapping, n) for n in self.names)
        k = implicit_prompt(c, r)
        return self.pair(row, mapping, {self.key(mapping, n) for n in self.names},
                         self.as_text(c[:k]), self.as_text(c[k:]), self.as_text(r[k:]))


class StandardImplicit(_Implicit):
    name = "standard_implicit"
    description = "chosen, rejected: strings that both hold the prompt (split at the implicit-prompt rule)"

    def side(self, row, where, mapping, name):
        return self.text(row, where, mapping, name)


class ConversationalExplicit(_Reader):
    name = "conversational_explicit"
    description = "prompt, chosen, rejected: lists of {role, content} messages"
    names = ("prompt", "chosen", "rejected")

    def matches(self, row, mapping):
        return all(isinstance(row.get(self.key(mapping, n)), list) for n in self.names)

    def read_row(self, row, where, mapping):
        p, c, r = (self.messages(row, where, mapping, n) for n in self.names)
        return self.pair(row, mapping, {self.key(mapping, n) for n in self.names},
                         messages_text(p), messages_text(c), messages_text(r))


class ConversationalImplicit(_Implicit):
    name = "conversational_implicit"
    description = ("chosen, rejected: whole conversations (message lists); the prompt is their longest common "
                   "message prefix")
    value_type = list

    def side(self, row, where, mapping, name):
        return self.messages(row, where, mapping, name)

    def as_text(self, part):
        return messages_text(part)


class Stepwise(_Reader):
    name = "stepwise"
    kind = "trl_stepwise"
    description = "prompt (string), completions (step strings), labels (one bool per step): one response per row"
    names = ("prompt", "completions", "labels")
    open_dataset_parameters = _Reader.open_dataset_parameters + ("step_separator",)

    def matches(self, row, mapping):
        return (isinstance(row.get(self.key(mapping, "prompt")), str)
                and all(isinstance(row.get(self.key(mapping, n)), list) for n in ("completions", "labels")))

    def read_row(self, row, where, mapping, step_separator: str = "\n"):
        prompt = self.text(row, where, mapping, "prompt")
        steps, labels = self.need(row, where, mapping, "completions"), self.need(row, where, mapping, "labels")
        ck, lk = self.key(mapping, "completions"), self.key(mapping, "labels")
        if not isinstance(steps, list) or not steps:
            raise SpecError("dataset.fields.completions", f"{where}: '{ck}' must be a non-empty list of step strings.",
                            fix="give each row its steps as a list of strings.")
        for j, s in enumerate(steps):
            if not isinstance(s, str):
                raise SpecError("dataset.fields.completions", f"{where}: {ck}[{j}] is a {type(s).__name__}, not a "
                                "string.", fix="give each step as a string.")
            if step_separator in s:
                raise SpecError("dataset.fields.completions", f"{where}: {ck}[{j}] contains the step separator "
                                f"{step_separator!r}, so the model would read more steps than the row labels.",
                                fix="set dataset.step_separator to a string no step contains (and the PRM's "
                                    "model.prm.step_token to the same).")
        if not isinstance(labels, list) or len(labels) != len(steps):
            got = f"{len(labels)} labels" if isinstance(labels, list) else f"a {type(labels).__name__}"
            raise SpecError("dataset.fields.labels", f"{where}: '{lk}' must hold one label per step: {len(steps)} "
                            f"step(s), {got}.", fix="give one true/false label per step.")
        for j, b in enumerate(labels):
            if not isinstance(b, bool):
                raise SpecError("dataset.fields.labels", f"{where}: {lk}[{j}] is {b!r}, not true/false.",
                                fix="write each step label as true (a correct step) or false.")
        response = "".join(s + step_separator for s in steps)
        return self.pair(row, mapping, {self.key(mapping, n) for n in self.names}, prompt, response, response,
                         **{STEP_LABELS: list(labels)})


PREFERENCE_READERS = (StandardExplicit(), StandardImplicit(), ConversationalExplicit(), ConversationalImplicit())
STEPWISE = Stepwise()
READERS = {r.name: r for r in PREFERENCE_READERS + (STEPWISE,)}
CONVERSATIONAL = ("conversational_explicit", "conversational_implicit")


def preference_reader(row: Any, where: str, mapping: dict) -> _Reader:
    """The preference reader whose shape ``row`` (the file's first record) has; ``SpecError`` when none."""
    if isinstance(row, Mapping):
        for r in PREFERENCE_READERS:
            if r.matches(row, mapping):
                return r
        if all(isinstance(row.get(k), list) for k in ("completions", "labels")):
            raise SpecError("dataset.kind", f"{where} is a stepwise row (prompt, completions, labels), not a "
                            "preference pair.", fix="set dataset=trl_stepwise (read by observable=prm_labels).")
    keys = ", ".join(sorted(row)) if isinstance(row, Mapping) else type(row).__name__
    raise SpecError("dataset.path", f"{where} has none of TRL's preference shapes (keys: {keys}).",
                    fix="give chosen and rejected (strings or message lists), with or without a prompt "
                        f"({TRL_URL}).")


def _first_record(path) -> Any:
    from .files import json_list_records, jsonl_records, read_text, resolve_path

    p = resolve_path(path, None)
    text, _ = read_text(p, path)
    it = json_list_records(text, str(p)) if p.name.lower().endswith((".json", ".json.gz")) else \
        jsonl_records(text, str(p))
    return next((row for _, _, row in it), None)


# ----------------------------------------------------------------------------- the TRL kinds' options

TRL_FIELDS = {"trl": ("id", "prompt", "chosen", "rejected", "dimension", "source"),
              "trl_stepwise": ("id", "prompt", "completions", "labels", "dimension", "source")}


def check_trl_options(kind: str, chat_template: Any, step_separator: Any) -> None:
    """``dataset.chat_template`` only for kind=trl (Jinja text); ``dataset.step_separator`` a non-empty string.
    Raises ``SpecError`` naming the field."""
    if chat_template is not None and (kind != "trl" or not isinstance(chat_template, str) or not chat_template):
        raise SpecError("dataset.chat_template", "a declared chat template (Jinja text) renders the messages of "
                        f"kind=trl's conversational shapes; got {type(chat_template).__name__} with kind={kind}.",
                        fix="drop dataset.chat_template (the model's tokenizer template is used), or use dataset=trl.")
    if not isinstance(step_separator, str) or not step_separator:
        raise SpecError("dataset.step_separator", f"must be a non-empty string, got {step_separator!r}.",
                        fix="e.g. dataset.step_separator='\\n' (TRL's default).")


def check_trl_fields(fields: Any, kind: str) -> dict[str, str]:
    """``dataset.fields`` of a TRL kind: only the shape's keys (``TRL_FIELDS``), each mapped to a key name.
    Raises ``SpecError`` (``dataset.fields.<name>``)."""
    given = {str(k): v for k, v in dict(fields or {}).items()}
    for name, key in given.items():
        if name not in TRL_FIELDS[kind]:
            raise SpecError(f"dataset.fields.{name}", f"kind={kind} has no field '{name}'.", value=name,
                            options=TRL_FIELDS[kind], fix="map only the shape's keys, id, dimension or source.")
        if not isinstance(key, str) or not key:
            raise SpecError(f"dataset.fields.{name}", f"must name a key of the file, got {key!r}.",
                            fix=f"set dataset.fields.{name}=<key>.")
    return given
