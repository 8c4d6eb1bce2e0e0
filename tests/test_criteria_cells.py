"""Every criterion's ``cells`` recomputation is a reference (``kinds.base.Lazy``) into ``trust.cell_truth`` that
resolves to a function of it: the gates name the recomputation without importing the workflow module that runs it."""
from __future__ import annotations

import inspect

import reward_lens_spec.trust.criteria  # noqa: F401  (registers the criteria)
from reward_lens_spec.kinds.base import Lazy
from reward_lens_spec.registries import CRITERIA


def test_every_cells_reference_resolves_to_a_cell_truth_function():
    refs = {n: CRITERIA[n].cells for n in CRITERIA if CRITERIA[n].cells is not None}
    assert len(refs) == 13                    # 10 organism criteria + 3 kind criteria (leace ×2, curvature)
    for name, ref in refs.items():
        assert isinstance(ref, Lazy), name
        fn = ref.resolve()
        assert ref.module.startswith("reward_lens_spec.trust.cell_truth"), name     # the module or a part of it
        assert inspect.isfunction(fn) and fn.__name__ == ref.attr and fn.__module__.startswith(ref.module), name
