"""transformers' LOAD REPORT (a warning table of missing, unexpected and mismatched tensors) on the one loader
(``models.hub.load_classifier``): a head-less checkpoint loads with no table (the head is ``model.head_init``'s
to refuse or make, in one line of its own), tensors the classifier does not use beside a causal LM's head are one
warning line, a head of another size than ``model.num_labels`` one ``SpecError`` line naming it; any other error
still shows the table."""
from __future__ import annotations

import logging
import shutil
import warnings

import pytest
import torch

from reward_lens_spec.errors import SpecError
from reward_lens_spec.models.load_report import CONFIG_LOGGER, LOGGER, held_report
from reward_lens_spec.models.loading import load_model
from reward_lens_spec.models.tiny_tokenizer import build_tiny_tokenizer
from reward_lens_spec.spec import ModelSpec
from test_model_loading_guard import headless  # noqa: F401  (a module-scoped fixture)


@pytest.fixture(scope="module")
def folders(headless, tmp_path_factory):
    """``test_model_loading_guard``'s head-less checkpoints (a causal LM with its own ``lm_head``, a base model),
    a classifier with one output, and the causal LM with a reward head stored under another name."""
    import transformers as tf
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("report")
    config = tf.AutoConfig.from_pretrained(headless["causal"])
    torch.manual_seed(0)
    tf.LlamaForSequenceClassification(tf.LlamaConfig(**{**config.to_dict(), "num_labels": 1})).save_pretrained(
        root / "rm1")
    build_tiny_tokenizer().save_pretrained(root / "rm1")
    extra = root / "extra"
    shutil.copytree(headless["causal"], extra)
    weights = load_file(extra / "model.safetensors")
    weights["v_head.weight"] = torch.zeros(1, config.hidden_size)
    save_file(weights, extra / "model.safetensors", metadata={"format": "pt"})
    return {**headless, "rm1": root / "rm1", "extra": extra}


def _load(folder, **kw):
    """``(UserWarning texts, what transformers' loading logger emitted)`` of loading ``folder``."""
    log, logged = logging.getLogger(LOGGER), []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    log.addHandler(handler)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            load_model(ModelSpec(name="m", source=str(folder), **kw))
        finally:
            log.removeHandler(handler)
    return [str(w.message) for w in said if issubclass(w.category, UserWarning)], "\n".join(logged)


@pytest.mark.parametrize("kind", ["causal", "base"])
def test_a_headless_checkpoint_loads_with_no_table_and_no_warning(folders, kind):
    said, err = _load(folders[kind], head_init="seeded")
    assert "LOAD REPORT" not in err and "MISSING" not in err and "UNEXPECTED" not in err, err
    assert not [w for w in said if "model.source" in w], said


def test_tensors_the_classifier_does_not_use_are_one_warning_line(folders):
    said, err = _load(folders["extra"], head_init="seeded")
    assert "LOAD REPORT" not in err, err
    (line,) = [w for w in said if "does not use" in w]
    assert "v_head.weight" in line and "lm_head" not in line and "\n" not in line and "Fix:" in line


def test_a_head_of_another_size_is_one_line_naming_model_num_labels(folders):
    logs, logged = [logging.getLogger(LOGGER), logging.getLogger(CONFIG_LOGGER)], []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    for log in logs:
        log.addHandler(handler)
    try:
        with pytest.raises(SpecError) as e:
            load_model(ModelSpec(name="m", source=str(folders["rm1"]), num_labels=3))
    finally:
        for log in logs:
            log.removeHandler(handler)
    msg = str(e.value)
    assert e.value.field == "model.num_labels" and "\n" not in msg, msg
    assert "1 output(s)" in msg and "score.weight [1, 32] in the checkpoint, [3, 32] here" in msg, msg
    assert msg.endswith("Fix: set model.num_labels=1.")
    assert not [m for m in logged if "LOAD REPORT" in m or "id2label" in m], logged     # the one line says it


def test_the_table_comes_back_with_any_other_error_and_other_records_pass():
    log = logging.getLogger(LOGGER)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)
    try:
        with held_report() as held:
            log.warning("Model LOAD REPORT from: x\nkey | MISSING")
            log.warning("another warning")
        assert held == ["Model LOAD REPORT from: x\nkey | MISSING"] and seen == ["another warning"]
        with pytest.raises(ValueError):
            with held_report():
                log.warning("Model LOAD REPORT from: y")
                raise ValueError("boom")
        assert seen == ["another warning", "Model LOAD REPORT from: y"]
    finally:
        log.removeHandler(handler)
