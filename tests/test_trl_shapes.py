"""TRL's dataset shapes (issue 41 item 2): the four preference shapes and stepwise supervision, read by reader
objects (``data.readers``), run end to end through the one executor; the implicit-prompt rule on worked
examples; malformed rows refused in one line naming the row and the field; a stepwise file graded against
hand-computed per-step accuracy, AUC and first-error step; the pair-shaped instruments refusing rows."""
from __future__ import annotations

import json

import numpy as np
import pytest

from reward_lens_spec import open_store
from reward_lens_spec.data import load_pairs
from reward_lens_spec.data.readers import READERS, implicit_prompt, messages_text
from reward_lens_spec.errors import SpecError
from reward_lens_spec.run import compose_run, execute

pytestmark = pytest.mark.usefixtures("one_thread")
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def msgs(*turns):
    return [{"role": r, "content": c} for r, c in turns]


Q1, Q2 = ("user", "What colour is the sky?"), ("user", "What is 2 + 2?")
ROWS = {
    "standard_explicit": [{"prompt": "What colour is the sky?", "chosen": "Blue.", "rejected": "Green."},
                          {"prompt": "What is 2 + 2?", "chosen": "4.", "rejected": "5."}],
    "standard_implicit": [{"chosen": "The sky is blue.", "rejected": "The sky is green."},
                          {"chosen": "2 + 2 = 4", "rejected": "2 + 2 = 5"}],
    "conversational_explicit": [{"prompt": msgs(Q1), "chosen": msgs(("assistant", "Blue.")),
                                 "rejected": msgs(("assistant", "Green."))},
                                {"prompt": msgs(Q2), "chosen": msgs(("assistant", "4.")),
                                 "rejected": msgs(("assistant", "5."))}],
    "conversational_implicit": [{"chosen": msgs(Q1, ("assistant", "Blue.")), "rejected": msgs(Q1, ("assistant", "Green."))},
                                {"chosen": msgs(Q2, ("assistant", "4.")), "rejected": msgs(Q2, ("assistant", "5."))}],
}


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def trl_dataset(tmp_path, path, chat_template=None):
    """A dataset YAML (kind trl) naming ``path`` and, when given, a declared chat template."""
    import yaml
    doc = {"name": "prefs", "kind": "trl", "path": str(path), **({"chat_template": chat_template}
                                                                 if chat_template else {})}
    out = tmp_path / "prefs.yaml"
    out.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return f"dataset={out}"


def run_file(tmp_path, path, *over, url="s.zarr"):
    run, y = compose_run([*over, f"dataset.path={path}"])
    return execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / url), progress=False)


# -- the rule ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chosen, rejected, prompt, c, r", [
    ("The sky is blue.", "The sky is green.", "The sky is", " blue.", " green."),
    ("x = 42", "x = 43", "x =", " 42", " 43"),                    # never inside a word (or a number)
    ("abc", "abd", "", "abc", "abd"),                             # no whitespace in the common prefix
    ("Hello world", "Hello world again", "Hello", " world", " world again"),
])
def test_the_implicit_prompt_of_two_strings_ends_before_the_last_common_whitespace(chosen, rejected, prompt, c, r):
    k = implicit_prompt(chosen, rejected)
    assert (chosen[:k], chosen[k:], rejected[k:]) == (prompt, c, r)


def test_the_implicit_prompt_of_two_conversations_is_their_longest_common_message_prefix():
    sys_, a1, a2 = ("system", "Be brief."), ("assistant", "Blue."), ("assistant", "Green.")
    assert implicit_prompt(msgs(sys_, Q1, a1), msgs(sys_, Q1, a2)) == 2
    # a message equal in content but not in role ends the prefix; each side keeps at least its last message
    assert implicit_prompt(msgs(("system", "x"), a1), msgs(("user", "x"), a1)) == 0
    assert implicit_prompt(msgs(Q1, a1), msgs(Q1, a1)) == 1
    assert implicit_prompt(msgs(Q1, a1, Q2, a1), msgs(Q1, a1, Q2, a2)) == 3       # multi-turn: up to the last turn


@pytest.mark.parametrize("shape", sorted(ROWS))
def test_each_reader_guesses_its_own_shape_only(shape, tmp_path):
    path = write(tmp_path / "d.jsonl", ROWS[shape])
    assert [n for n, r in READERS.items() if r.guess_can_open(path)] == [shape]
    ps = READERS[shape].open_dataset(path)
    assert ps.shape == shape and len(ps) == 2
    if shape == "conversational_implicit":
        assert ps[0].prompt == messages_text(msgs(Q1)) and ps[0].chosen == messages_text(msgs(("assistant", "Blue.")))


# -- end to end, each shape ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", sorted(ROWS))
def test_each_preference_shape_runs_end_to_end_and_records_its_shape(shape, tmp_path):
    path = write(tmp_path / "d.jsonl", ROWS[shape])
    out = run_file(tmp_path, path, trl_dataset(tmp_path, path, TEMPLATE))
    attrs = open_store(str(tmp_path / "s.zarr")).provenance(out.run_id)
    want_tmpl = ("dataset:" + __import__("hashlib").sha256(TEMPLATE.encode()).hexdigest()
                 if shape.startswith("conversational") else None)
    assert attrs["data_shape"] == {"shape": shape, "chat_template": want_tmpl, "step_separator": None}
    assert out.result["margin"].sizes["pair"] == 2 and np.isfinite(out.result["margin"].values).all()


def test_messages_are_rendered_by_the_declared_template_else_the_models_and_the_run_id_follows(tmp_path):
    from reward_lens_spec.models.tiny import build_tiny
    model, tok = build_tiny("tiny")
    path = write(tmp_path / "d.jsonl", ROWS["conversational_implicit"])
    declared = run_file(tmp_path, path, trl_dataset(tmp_path, path, TEMPLATE))
    own = run_file(tmp_path, path, "dataset=trl")
    assert declared.run_id != own.run_id
    attrs = open_store(str(tmp_path / "s.zarr")).provenance(own.run_id)
    assert attrs["data_shape"]["chat_template"] == "model"
    # the reward is the model's own head on exactly the declared rendering (a plain forward, no package path)
    import torch
    text = "[user] What colour is the sky?\n[assistant] Blue.\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    got = float(declared.result["reward"].sel(side="chosen").values[0])
    assert got == pytest.approx(want, abs=1e-5)


# -- malformed rows ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, rows, field, where", [
    ("trl", [ROWS["conversational_explicit"][0], {**ROWS["conversational_explicit"][1], "chosen": "4."}],
     "dataset.fields.chosen", "line 2"),
    ("trl", [ROWS["conversational_implicit"][0], {"chosen": msgs(Q1, ("assistant", "x")),
                                                  "rejected": [{"role": "assistant"}]}], "dataset.fields.rejected",
     "line 2"),
    ("trl", [ROWS["standard_implicit"][0], {"prompt": "p", "chosen": "a", "rejected": "b"}],
     "dataset.fields.prompt", "line 2"),
    ("trl", [{"question": "q", "answer": "a"}], "dataset.path", "line 1"),
    ("trl_stepwise", [{"prompt": "p", "completions": ["a", "b"], "labels": [True]}], "dataset.fields.labels",
     "line 1"),
    ("trl_stepwise", [{"prompt": "p", "completions": ["a"], "labels": [1]}], "dataset.fields.labels", "line 1"),
    ("trl_stepwise", [{"prompt": "p", "completions": ["a\nb"], "labels": [True]}], "dataset.fields.completions",
     "line 1"),
    ("trl_stepwise", [{"prompt": "p", "completions": [], "labels": []}], "dataset.fields.completions", "line 1"),
])
def test_a_malformed_row_is_refused_in_one_line_naming_the_row_and_the_field(tmp_path, kind, rows, field, where):
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SpecError) as e:
        load_pairs(kind, path=str(path))
    msg = str(e.value)
    assert msg.startswith(field) and where in msg and "Fix:" in msg and "\n" not in msg


def test_stepwise_rows_given_to_the_preference_reader_name_the_right_kind(tmp_path):
    path = write(tmp_path / "s.jsonl", [{"prompt": "p", "completions": ["a"], "labels": [True]}])
    with pytest.raises(SpecError, match="dataset=trl_stepwise"):
        load_pairs("trl", path=str(path))


def test_step_labels_are_sealed_in_the_checksum(tmp_path):
    rows = [{"prompt": "p", "completions": ["a", "b"], "labels": [True, False]}]
    a = load_pairs("trl_stepwise", path=str(write(tmp_path / "a.jsonl", rows)))
    rows[0]["labels"] = [True, True]
    b = load_pairs("trl_stepwise", path=str(write(tmp_path / "b.jsonl", rows)))
    assert a.checksum != b.checksum and a.flags["identical_sides"] == []


# -- stepwise: graded against hand-computed numbers ---------------------------------------------------------
STEPS = [
    {"prompt": "Which is larger, 9.8 or 9.11?", "completions": ["9.8 has fractional part 0.8.",
     "9.11 has fractional part 0.11.", "0.11 is greater than 0.8.", "So 9.11 is larger."],
     "labels": [True, True, False, False]},
    {"prompt": "What is 3 * 4?", "completions": ["3 * 4 = 12.", "The answer is 12."], "labels": [True, True]},
    {"prompt": "What is 10 - 7?", "completions": ["10 - 7 = 2.", "The answer is 2."], "labels": [False, False]},
]


def naive_auc(pos, neg):
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg) / (len(pos) * len(neg))


def test_a_stepwise_file_is_graded_against_hand_computed_accuracy_auc_and_first_error(tmp_path):
    path = write(tmp_path / "steps.jsonl", STEPS)
    out = run_file(tmp_path, path, "model=tiny_prm", "dataset=trl_stepwise", "observable=prm_labels")
    r = out.result
    rewards = r["step_reward"].values
    labels = [row["labels"] for row in STEPS]
    # the stored step rewards are the PRM's own head at each step's separator: recomputed with a plain forward
    import torch
    from reward_lens_spec.models.tiny import build_tiny
    model, tok = build_tiny("tiny_llama")
    for i, row in enumerate(STEPS):
        text = f"Problem: {row['prompt']}\nSolution:\n" + "".join(s + "\n" for s in row["completions"])
        ids = tok(text)["input_ids"]
        nl = tok("\n", add_special_tokens=False)["input_ids"]
        start = len(tok(f"Problem: {row['prompt']}\nSolution:\n")["input_ids"])
        ends = [j for j in range(start, len(ids)) if ids[j] == nl[0]]
        with torch.no_grad():
            out_h = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
            want = [model.score(out_h[j]).item() for j in ends]
        np.testing.assert_allclose(rewards[i, :len(labels[i])], want, atol=1e-5)
        assert np.isnan(rewards[i, len(labels[i]):]).all()
    flat = [(rewards[i, k], lab) for i, ls in enumerate(labels) for k, lab in enumerate(ls)]
    acc = sum((rw > 0) == lab for rw, lab in flat) / len(flat)
    auc = naive_auc([rw for rw, lab in flat if lab], [rw for rw, lab in flat if not lab])
    firsts = []
    for i, ls in enumerate(labels):
        want_l = next((k for k, lab in enumerate(ls) if not lab), -1)
        want_m = next((k for k in range(len(ls)) if not rewards[i, k] > 0), -1)
        firsts.append(want_l == want_m)
        assert list(r["first_error"].values[i]) == [want_l, want_m]
    assert float(r["step_accuracy"]) == pytest.approx(acc, abs=1e-12)
    assert float(r["step_auc"]) == pytest.approx(auc, abs=1e-12)
    assert float(r["first_error_accuracy"]) == pytest.approx(sum(firsts) / len(firsts), abs=1e-12)
    assert list(r["step_label"].values[0]) == [1, 1, 0, 0]
    attrs = open_store(str(tmp_path / "s.zarr")).provenance(out.run_id)
    assert attrs["data_shape"] == {"shape": "stepwise", "chat_template": None, "step_separator": "\n"}


def test_grade_on_planted_rewards_matches_the_naive_numbers():
    from reward_lens_spec.ops.prm_labels import grade
    r = np.array([[2.0, 1.0, -1.0, np.nan], [0.5, -0.5, 0.5, 3.0]])
    y = np.array([[1, 1, 0, np.nan], [1, 1, 0, 0]], float)
    assert grade(r, y, "accuracy") == pytest.approx(4 / 7)             # row 0: 3 of 3; row 1: 1 of 4
    assert grade(r, y, "auc") == pytest.approx(naive_auc([2.0, 1.0, 0.5, -0.5], [-1.0, 0.5, 3.0]))
    assert grade(r, y, "first_error_accuracy") == pytest.approx(1 / 2)    # row 0: 2 = 2; row 1: 1 ≠ 2


def test_pair_shaped_instruments_refuse_stepwise_rows_and_prm_labels_refuses_pairs(tmp_path):
    path = write(tmp_path / "steps.jsonl", STEPS)
    with pytest.raises(SpecError, match="one response per row") as e:
        run_file(tmp_path, path, "model=tiny_prm", "dataset=trl_stepwise", "observable=dla")
    assert "\n" not in str(e.value) and "Fix:" in str(e.value)
    with pytest.raises(SpecError, match="reads stepwise rows"):
        run, y = compose_run(["observable=prm_labels"])
        execute(run, resolved_yaml=y, base_dir=str(tmp_path), store_url=str(tmp_path / "x.zarr"), progress=False)


def test_a_prm_whose_step_token_differs_from_the_data_separator_is_refused(tmp_path):
    path = write(tmp_path / "steps.jsonl", STEPS)
    with pytest.raises(SpecError, match="dataset.step_separator"):
        run_file(tmp_path, path, "model=tiny_prm", "dataset=trl_stepwise", "observable=prm_labels",
                 "model.prm.step_token='\\n\\n'")
