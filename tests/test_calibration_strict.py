"""Subtle breakage does not pass calibration (issue 26 item 4).

Each broken instrument is an observable YAML in a user's own folder, read the way ``observable=...``
reads one: a margin scaled by a few percent, an inner lens layer read as the margin, DLA scaled with
a layer dropped, a scaled patch grid without its resid column. None is special-cased by name. What
catches them: outputs named ``reward``/``margin`` must equal the head's own output (every organism
and the run), kept cells of a restricted grid must equal the same cells from a plain HF forward,
exact instruments must match their truth within 1e-3 relative, and a card applies only to the code
that wrote it (``trust.evidence.code_hash``).
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from reward_lens_spec.spec import ObservableSpec
from reward_lens_spec.store import open_store
from reward_lens_spec.trust.evidence import card_verdict, code_changes, code_hash
from reward_lens_spec.trust.scorecard import grade, write_card

from test_trust import execute_run, make_run

pytestmark = pytest.mark.usefixtures("one_thread")

DLA_HEAD = """
  - {name: components, op: capture, site: components}
  - {name: resid, op: capture, site: resid}
  - {name: final_resid, op: select, input: resid, dim: layer, index: last}
  - {name: components_normed, op: final_norm, input: components, mode: frozen, reference: final_resid}
  - {name: dla_sides, op: project, input: components_normed, direction: head}
  - {name: dla_all, op: diff, input: dla_sides}
"""


def scaled_margin(by: float) -> str:
    return f"""name: margin
steps:
  - {{name: h, op: capture, site: readout}}
  - {{name: reward, op: project, input: h, direction: head, bias: true}}
  - {{name: true_margin, op: diff, input: reward}}
  - {{name: margin, op: scale, input: true_margin, by: {by}}}
outputs: [margin]
"""


def lens_as_margin(layer: int) -> str:
    return f"""name: margin
steps:
  - {{name: resid, op: capture, site: resid}}
  - {{name: resid_normed, op: final_norm, input: resid, mode: apply}}
  - {{name: lens_sides, op: project, input: resid_normed, direction: head}}
  - {{name: lens, op: diff, input: lens_sides}}
  - {{name: margin, op: select, input: lens, dim: layer, index: {layer + 1}}}
outputs: [margin]
"""


def dla_dropped(by: float, keep: list) -> str:
    return "name: dla\nsteps:" + DLA_HEAD + f"""
  - {{name: dla_kept, op: select, input: dla_all, dim: layer, values: {keep}}}
  - {{name: dla, op: scale, input: dla_kept, by: {by}}}
outputs: [dla]
"""


def patch_no_resid(by: float) -> str:
    return f"""name: patch
steps:
  - {{name: patch_true, op: patch, quantity: effect, mode: denoise, components: [attn, mlp]}}
  - {{name: patch_effect, op: scale, input: patch_true, by: {by}}}
outputs: [patch_effect]
"""


SUBTLE = {          # the four of the issue, then variants (another factor, layer, dropped layer)
    "margin_x1.08": scaled_margin(1.08),
    "lens_L2_as_margin": lens_as_margin(2),
    "dla_x1.08_last_dropped": dla_dropped(1.08, [-1, 0, 1, 2]),
    "patch_x1.05_attn_mlp": patch_no_resid(1.05),
    "margin_x1.03": scaled_margin(1.03),
    "lens_L1_as_margin": lens_as_margin(1),
    "dla_x1.03_first_dropped": dla_dropped(1.03, [0, 1, 2, 3]),
    "patch_x1.03_attn_mlp": patch_no_resid(1.03),
}


def observable(text: str, folder: Path, name: str = "mine") -> ObservableSpec:
    """The YAML as a user's own config folder holds it (``<folder>/observable/<name>.yaml``)."""
    path = folder / "observable" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ObservableSpec), OmegaConf.load(path)))


@pytest.fixture
def store(tmp_path):
    return str(tmp_path / "store.zarr")


@pytest.fixture(scope="module")
def patch_card(planted):
    return grade("patch", organisms=planted)


@pytest.mark.parametrize("kind", sorted(SUBTLE))
def test_subtle_breakage_fails_calibration(kind, planted, tmp_path):
    card = grade(observable(SUBTLE[kind], tmp_path), organisms=planted)
    assert not card.passed, card.describe()
    broken = [r for per in card.identities for r in per if not r["max_abs_err"] <= 1e-3 * r["scale"]]
    assert broken, card.describe()                   # an identity catches it, not only the magnitude
    (_, m), = card.magnitude.items()
    assert m["truth_from"] == "cells" and abs(m["reading"] - m["truth"]) > 1e-3 * abs(m["truth"])


def test_a_scaled_margin_run_is_not_calibrated_even_with_a_passing_card(store, tmp_path, planted):
    """The run checks itself: a ``margin`` ≠ the head's margin breaks the run's own identity."""
    obs = observable(SUBTLE["margin_x1.03"], tmp_path)
    forged = grade("margin", organisms=planted)
    assert forged.passed, forged.describe()
    from reward_lens_spec.identity import observable_hash
    forged.spec_hash = observable_hash(obs)          # a valid passing card, for the scaled hash
    write_card(forged, store)
    rid = execute_run(store, tmp_path, make_run(observable=obs))
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"] == {"margin": "exploratory"}
    assert "margin = the head's own margin" in t["trust_reason"] and "broken" in t["trust_reason"]


@pytest.mark.parametrize("name", ["margin", "dla", "lens"])
def test_builtin_exact_observables_still_calibrate(name, planted):
    card = grade(name, organisms=planted)
    assert card.passed, card.describe()
    for m in card.magnitude.values():                # the 1e-3 band against the same cells
        assert m["truth_from"] == "cells" and abs(m["reading"] - m["truth"]) <= 1e-3 * abs(m["truth"])
    assert card.code_hash == code_hash()


def test_builtin_patch_calibrates_and_its_kept_cells_are_checked(patch_card):
    assert patch_card.passed, patch_card.describe()
    recs = [r for per in patch_card.identities for r in per if r["identity"].startswith("kept cells")]
    assert {r["variable"] for r in recs} == {"patch_effect", "patch_restored"} and len(recs) == 10
    m = patch_card.magnitude["patch_share"]
    assert m["truth_from"] == "cells" and abs(m["reading"] - m["truth"]) <= 1e-3 * abs(m["truth"])


def test_restricted_builtin_grid_still_calibrates(planted, tmp_path):
    """A restriction alone is no breakage: the kept cells equal the plain forward's."""
    card = grade(observable(dla_dropped(1.0, [-1, 0, 1, 2]), tmp_path), organisms=planted)
    assert card.passed, card.describe()


def test_a_card_applies_only_to_the_code_that_wrote_it(store, tmp_path, patch_card, monkeypatch):
    write_card(patch_card, store)
    rid = execute_run(store, tmp_path, make_run(observable="patch"))
    assert open_store(store).trust(rid)["trust_by_variable"]["patch_effect"] == "calibrated"

    from reward_lens_spec.ops import patch as patch_op
    cls = patch_op.Patch
    real = cls.run

    def bent(self, ctx, *a, **kw):        # ×1.05 except at the last layer: the run's identities still hold
        out = real(self, ctx, *a, **kw)
        last = out.layer.values.max()
        return (out * 1.05).where(out.layer != last, out).assign_attrs(out.attrs)
    monkeypatch.setattr(cls, "run", bent)
    assert code_changes() and code_hash() != patch_card.code_hash
    ok, why = card_verdict(copy.deepcopy(vars(patch_card)))
    assert not ok and "written by other code" in why
    rid2 = execute_run(store, tmp_path, make_run(observable="patch", limit=3))
    t = open_store(store).trust(rid2)
    assert t["trust_by_variable"]["patch_effect"] == "exploratory" and "written by other code" in t["trust_reason"]


def test_a_faked_code_hash_does_not_calibrate(store, tmp_path, planted):
    card = grade("margin", organisms=planted)
    assert card.passed
    card.code_hash = "0" * 64                         # as if written by other code, sealed anew
    write_card(card, store)
    rid = execute_run(store, tmp_path, make_run(observable="margin"))
    t = open_store(store).trust(rid)
    assert t["trust_by_variable"] == {"margin": "exploratory"} and "written by other code" in t["trust_reason"]


@pytest.fixture(scope="module")
def spread():
    from reward_lens_spec.organisms.kind_organisms import organism_family
    return organism_family("planted", n_pairs=6, spread=0.2)


def test_spread_organism_records_its_random_strengths_and_grades_strictly(spread, tmp_path):
    t = spread[-1].truth
    assert set(t["spread"]) == {"0", "2", "3"} and all(0.1 <= k <= 0.3 for k in t["spread"].values())
    assert spread[-1].params["spread"] == 0.2 and t["spread"] == spread[0].truth["spread"]
    card = grade("dla", organisms=spread)
    assert card.passed, card.describe()
    for kind in ("lens_L2_as_margin", "dla_x1.03_first_dropped"):
        assert not grade(observable(SUBTLE[kind], tmp_path, kind), organisms=spread).passed


@pytest.mark.parametrize("module", ["reward_lens_spec.trust.criteria", "reward_lens_spec.trust.kind_criteria",
                                    "reward_lens_spec.organisms.organisms"])
def test_a_card_graded_by_other_criteria_or_organisms_does_not_calibrate(patch_card, monkeypatch, module):
    """The criteria, floors and organisms that grade a card are part of the code a card applies to: replacing any
    function of theirs at run time (as a loosened criterion or a different planted organism would) leaves the card
    written by other code."""
    import importlib
    import inspect

    mod = importlib.import_module(module)
    fn_name, fn = next((n, f) for n, f in vars(mod).items()
                       if inspect.isfunction(f) and f.__module__ == module and not n.startswith("__"))
    assert card_verdict(copy.deepcopy(vars(patch_card)))[0]

    def replaced(*a, **kw):
        return fn(*a, **kw)
    monkeypatch.setattr(mod, fn_name, replaced)
    assert code_changes() and code_hash() != patch_card.code_hash
    ok, why = card_verdict(copy.deepcopy(vars(patch_card)))
    assert not ok and "written by other code" in why
