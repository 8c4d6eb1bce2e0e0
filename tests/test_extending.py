"""One face for extenders (issue 38 item 5): ``reward_lens_spec.extend`` exports the extension API, and every
recipe of ``docs/extending.md`` — an operator, a dataset reader, a criterion — runs as written, each in a fresh
process in a scratch folder, registering its member in one place and running it through the real executor."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"
FACE = {"Operator", "register", "PlanInfo", "need_dim", "labelled", "RunContext", "DatasetReader", "Criterion",
        "Kind", "Lazy", "OPERATORS", "DATASET_READERS", "CRITERIA", "KINDS", "FAMILIES", "COMMANDS", "Registry"}


def python_blocks() -> list[tuple[int, str]]:
    """(line, body) of every ``python`` block of the page that is not marked ``<!-- not-run: ... -->``."""
    lines, out = PAGE.read_text(encoding="utf-8").split("\n"), []
    for i, line in enumerate(lines):
        if line == "```python" and not (i and lines[i - 1].startswith("<!-- not-run")):
            end = lines.index("```", i + 1)
            out.append((i + 1, "\n".join(lines[i + 1:end]) + "\n"))
    return out


def test_the_face_exports_the_extension_api():
    import reward_lens_spec.extend as extend
    assert FACE <= set(extend.__all__) and all(hasattr(extend, n) for n in extend.__all__)
    assert extend.__doc__ and extend.register.__self__ is extend.OPERATORS


def test_the_page_has_a_recipe_for_each_extension_point():
    bodies = [b for _, b in python_blocks()]
    for what in (r"@register\nclass \w+\(Operator\)", r"DATASET_READERS\.register\(", r"CRITERIA\.register\("):
        assert sum(bool(re.search(what, b)) for b in bodies) == 1, what
    assert all("reward_lens_spec.run(" in b or "card_verdict" in b for b in bodies)


@pytest.mark.slow
def test_every_recipe_runs_as_written(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "REWARD_LENS_SPEC_CACHE": str(tmp_path / "cache")}
    for line, body in python_blocks():
        done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"docs/extending.md:{line}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert (tmp_path / "extend_store.zarr").is_dir()
