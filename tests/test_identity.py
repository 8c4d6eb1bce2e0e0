"""Run identity is what the model sees: Unicode form, line endings, pair order and the template each give a
new run id, and every stored margin is labelled with the id of the pair it was computed on.

Every stored margin is checked against a naive computation written here from the documented rules: the
file read with ``json``, the plain template filled in, one unpadded forward pass per side through the HF
model, and the documented content id (``"pair-" + sha256(json [prompt, null, chosen, rejected,
dimension])[:16]``). On the code before this rule, the NFD, CRLF-content and reordered files reused the
first file's run (the checksum folded NFC/CRLF and ignored order; ids were line numbers).
"""
from __future__ import annotations

import hashlib
import json
import unicodedata

import numpy as np
import pytest
import torch

from reward_lens_spec.models.loading import load_model
from reward_lens_spec.spec import ModelSpec
from reward_lens_spec.store import open_store

TEMPLATE = "User: {prompt}\nAssistant: {response}"
ROWS = [{"prompt": f"Caf\u00e9 {i}?\nSay more about na\u00efve \u00e9l\u00e8ves.",
         "chosen": f"R\u00e9sum\u00e9 {i}:\nline one\nline two" + " \u00e9" * i,
         "rejected": f"No.\nCr\u00e8me {i}"} for i in range(5)]


def write(path, rows, *, newline="\n"):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + newline for r in rows), encoding="utf-8",
                    newline="")
    return path


def transform(rows, fn):
    return [{k: v if k == "id" else fn(v) for k, v in r.items()} for r in rows]


def content_id(r) -> str:
    if "id" in r:
        return r["id"]
    blob = json.dumps([r["prompt"], None, r["chosen"], r["rejected"], ""], ensure_ascii=False, separators=(",", ":"))
    return "pair-" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


@pytest.fixture(scope="module")
def lm():
    return load_model(ModelSpec(name="tiny", source="builtin:tiny"))


def naive_margins(lm, path, template=TEMPLATE) -> dict[str, float]:
    """id -> margin, from the file's raw text and one unpadded forward pass per side."""
    out = {}
    for line in path.read_bytes().decode("utf-8").split("\n"):
        if not line.strip():
            continue
        r = json.loads(line)
        rewards = []
        for resp in (r["chosen"], r["rejected"]):
            text = template.replace("{prompt}", r["prompt"]).replace("{response}", resp)
            ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
            with torch.no_grad():
                rewards.append(float(lm.model(input_ids=ids).logits[0, 0]))
        out[content_id(r)] = rewards[0] - rewards[1]
    return out


def score(tmp_path, path, url, *extra):
    from reward_lens_spec.run.compose import compose_run
    from reward_lens_spec.run import execute

    run, text = compose_run(["model=tiny", "dataset=jsonl", f"dataset.path={path}", *extra])
    out = execute(run, resolved_yaml=text, base_dir=str(tmp_path), store_url=url, progress=False)
    if out.reused:
        return out, None
    margin = open_store(url).load(out.run_id, "score", lazy=False)["margin"]
    return out, dict(zip(map(str, margin["pair"].values), margin.values.astype(float)))


def check_labels(stored, naive):
    assert set(stored) == set(naive)
    for pid, m in naive.items():
        assert stored[pid] == pytest.approx(m, abs=2e-5), pid


@pytest.fixture(scope="module", params=["ids_from_content", "ids_in_data"])
def base(request, tmp_path_factory, lm):
    d = tmp_path_factory.mktemp("identity")
    url = str(d / "s.zarr")
    rows = ROWS if request.param == "ids_from_content" else [{"id": f"q{i}", **r} for i, r in enumerate(ROWS)]
    path = write(d / "pairs.jsonl", rows)
    out, stored = score(d, path, url)
    check_labels(stored, naive_margins(lm, path))
    return d, url, out.run_id, stored, rows


@pytest.mark.parametrize("case", ["nfd", "crlf_in_text", "reordered"])
def test_what_the_model_sees_differently_is_a_new_run(base, lm, case):
    d, url, first_id, first, base_rows = base
    rows = {"nfd": transform(base_rows, lambda s: unicodedata.normalize("NFD", s)),
            "crlf_in_text": transform(base_rows, lambda s: s.replace("\n", "\r\n")),
            "reordered": base_rows[::-1]}[case]
    path = write(d / f"{case}.jsonl", rows)
    out, stored = score(d, path, url)
    assert not out.reused and out.run_id != first_id
    naive = naive_margins(lm, path)
    check_labels(stored, naive)
    if case == "reordered":          # same texts: each id keeps its margin, whatever line it is on
        assert set(stored) == set(first)
        for pid in first:
            assert stored[pid] == pytest.approx(first[pid], abs=2e-5)
    else:                            # other texts: other numbers, so reuse would have been wrong
        assert not np.allclose([stored[content_id(r)] for r in rows], [first[content_id(r)] for r in base_rows],
                               atol=1e-6)


def test_crlf_between_records_changes_nothing_the_model_sees_and_is_reused(base, lm):
    d, url, first_id, first, base_rows = base
    path = write(d / "crlf_file.jsonl", base_rows, newline="\r\n")
    out, stored = score(d, path, url)
    assert out.reused and out.run_id == first_id
    check_labels(first, naive_margins(lm, path))       # the reused numbers are this file's numbers


def test_a_changed_template_is_a_new_run_with_its_own_numbers(base, lm):
    d, url, first_id, _, _ = base
    template = "Q: {prompt}\nA: {response}"
    out, stored = score(d, d / "pairs.jsonl", url, f"model.template='{template}'")
    assert not out.reused and out.run_id != first_id
    check_labels(stored, naive_margins(lm, d / "pairs.jsonl", template))


def test_encoded_digest_sees_order_ids_and_every_token(lm):
    from reward_lens_spec.data import Pair
    from reward_lens_spec.models.formatting import encode_pairs

    pairs = [Pair(id=f"p{i}", prompt=f"q{i}", chosen="yes", rejected="no") for i in range(3)]
    ref = encode_pairs(lm.tokenizer, pairs).digest()
    assert encode_pairs(lm.tokenizer, pairs).digest() == ref
    assert encode_pairs(lm.tokenizer, pairs[::-1]).digest() != ref
    assert encode_pairs(lm.tokenizer, [pairs[0], pairs[1], Pair("p9", "q2", "yes", "no")]).digest() != ref
    assert encode_pairs(lm.tokenizer, [pairs[0], pairs[1], Pair("p2", "q2", "yes", "n0")]).digest() != ref
    assert encode_pairs(lm.tokenizer, pairs, template="{prompt} {response}").digest() != ref


def test_repeated_rows_get_distinct_content_ids(tmp_path):
    from reward_lens_spec.data import load_pairs

    r = {"prompt": "p", "chosen": "a", "rejected": "b"}
    ps = load_pairs("jsonl", path=str(write(tmp_path / "rep.jsonl", [r, {**r, "chosen": "c"}, r])))
    assert ps.ids == (content_id(r), content_id({**r, "chosen": "c"}), content_id(r) + "-2")
    given = load_pairs("jsonl", path=str(write(tmp_path / "given.jsonl", [{**r, "id": "mine"}])))
    assert given.ids == ("mine",)                      # the data's own id wins
