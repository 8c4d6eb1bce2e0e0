"""The README and docs/ keep their promises (issue 39): the README fits a screen and keeps its first two
commands, the site builds with MkDocs in strict mode (a broken link fails), every fenced ``bash`` / ``python``
block runs or is marked ``<!-- not-run: reason -->`` right before its fence, every ``yaml`` block parses and
agrees with the shipped file it names, and every test the README's guarantees name exists."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_MAX_BYTES = 12 * 1024
FIRST_COMMANDS = ("pip install torch==2.13.0 -e . && reward-lens-spec\n"
                  "pip install -e '.[test]' && python -m pytest -m \"not slow\" -n auto --dist loadfile --cov"
                  " && python -m pytest -m slow -n auto --dist loadfile\n")
MARKER = re.compile(r"^<!-- not-run: (?P<reason>.*?) -->$")
FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_-]*)\s*$")


@dataclass(frozen=True)
class Block:
    path: str
    line: int            # 1-based line of the opening fence
    lang: str
    body: str
    not_run: str | None  # the reason, when marked


def blocks(text: str, path: str = "<page>") -> list[Block]:
    """Every fenced block of a markdown page, with the not-run reason of a marker on the line before it.
    Raises ValueError for a marker that no fence follows, a marker without a reason, or an unclosed fence."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- not-run"):
            m = MARKER.match(line)
            if not m or not m["reason"].strip():
                raise ValueError(f"{path}:{i + 1}: a not-run marker needs a reason: <!-- not-run: why -->")
            if i + 1 >= len(lines) or not FENCE.match(lines[i + 1]):
                raise ValueError(f"{path}:{i + 1}: a not-run marker must be the line right before a fence")
        fence = FENCE.match(line)
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise ValueError(f"{path}:{i + 1}: unclosed fence")
            prev = MARKER.match(lines[i - 1]) if i else None
            out.append(Block(path, i + 1, fence["lang"], "\n".join(lines[i + 1:end]) + "\n",
                             prev["reason"] if prev else None))
            i = end
        i += 1
    return out


def page_blocks(page: Path) -> list[Block]:
    return blocks(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))


def runnable(page: Path) -> list[Block]:
    return [b for b in page_blocks(page) if b.lang in ("bash", "python") and b.not_run is None]


# ----------------------------------------------------------------------------- fast tier

def test_readme_fits_a_screen_and_keeps_its_first_two_commands():
    assert len(README.read_bytes()) <= README_MAX_BYTES, len(README.read_bytes())
    first = page_blocks(README)[0]
    assert (first.lang, first.body) == ("bash", FIRST_COMMANDS)


def test_every_block_is_run_or_marked_with_a_reason():
    counts = {"run": 0, "not-run": 0}
    for page in [README, *PAGES]:
        for b in page_blocks(page):
            assert b.lang, f"{b.path}:{b.line}: a fence without a language"
            if b.lang in ("bash", "python"):
                counts["not-run" if b.not_run else "run"] += 1
            else:
                assert b.not_run is None, f"{b.path}:{b.line}: only bash/python blocks are run or marked"
    assert counts["run"] >= 8 and counts["not-run"] >= 1, counts
    print(f"documented blocks: {counts['run']} run by tests/test_docs.py, {counts['not-run']} marked not-run")


@pytest.mark.parametrize("page, problem", [
    ("<!-- not-run: -->\n```bash\nls\n```\n", "needs a reason"),
    ("<!-- not-run: far away -->\n\n```bash\nls\n```\n", "right before a fence"),
    ("<!-- not-run: x --> trailing\n```bash\nls\n```\n", "needs a reason"),
    ("```python\nprint(1)\n", "unclosed fence"),
])
def test_a_misplaced_or_empty_marker_is_refused(page, problem):
    with pytest.raises(ValueError, match=problem):
        blocks(page)


def test_a_marker_applies_only_to_the_fence_right_after_it():
    got = blocks("<!-- not-run: slow -->\n```bash\na\n```\n\n```bash\nb\n```\n")
    assert [(b.body, b.not_run) for b in got] == [("a\n", "slow"), ("b\n", None)]


def test_every_yaml_block_parses_and_agrees_with_the_file_it_names():
    for page in [README, *PAGES]:
        for b in page_blocks(page):
            if b.lang != "yaml":
                continue
            doc = yaml.safe_load(b.body)
            named = re.match(r"# (conf/\S+\.yaml)", b.body)
            if named:
                shipped = yaml.safe_load((ROOT / named[1]).read_text(encoding="utf-8"))
                assert {k: shipped.get(k) for k in doc} == doc, f"{b.path}:{b.line} differs from {named[1]}"


def test_every_page_is_in_the_nav_and_every_readme_link_resolves():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = {next(iter(item.values())) for item in config["nav"]}
    assert nav == {p.name for p in PAGES}
    assert config["strict"] is True and config["theme"]["name"] == "material"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert links and all((ROOT / link).is_file() for link in links if "://" not in link), links


def test_every_guarantee_names_a_test_that_exists():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(bullets) >= 10
    for bullet in bullets:
        m = re.search(r"`(tests/test_\w+\.py)::(test_\w+)`", bullet)
        assert m, f"no test named in: {bullet}"
        src = (ROOT / m[1]).read_text(encoding="utf-8")
        assert re.search(rf"^def {m[2]}\(", src, re.M), f"{m[1]}::{m[2]} does not exist"


# ----------------------------------------------------------------------------- slow tier: build and run

def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.mark.slow
def test_the_site_builds_in_strict_mode_and_a_broken_link_fails(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs build needs mkdocs (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the docs build needs mkdocs-material (pip install -e '.[docs]')")
    ok = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "store-format" / "index.html").is_file()
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "trust.md", "a", encoding="utf-8") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    broken = _mkdocs(copy / "mkdocs.yml", tmp_path / "site2")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stderr, broken.stderr[-3000:]


def _run_block(block: Block, cwd: Path, env: dict) -> None:
    if block.lang == "python":
        cmd = [sys.executable, "-c", block.body]
    else:        # the CLI of this checkout, whatever is on PATH
        cmd = ["bash", "-euo", "pipefail", "-c",
               f'reward-lens-spec() {{ "{sys.executable}" -m reward_lens_spec "$@"; }}\n{block.body}']
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{block.path}:{block.line} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, f"{block.path}:{block.line}:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """The README's runnable blocks, in order, in one fresh folder: later pages read its store."""
    cwd = tmp_path_factory.mktemp("docs_run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "REWARD_LENS_SPEC_CACHE": str(tmp_path_factory.mktemp("docs_cache"))}
    for block in runnable(README):
        _run_block(block, cwd, env)
    return cwd, env


@pytest.mark.slow
def test_the_readme_tour_runs_and_leaves_a_store_and_a_report(tour):
    cwd, _ = tour
    assert (cwd / "outputs" / "store.zarr" / "zarr.json").is_file()
    assert (cwd / "outputs" / "report" / "index.html").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("page", [p.name for p in PAGES if runnable(p)])
def test_every_runnable_block_of_a_page_runs(page, tour):
    cwd, env = tour
    for block in runnable(ROOT / "docs" / page):
        _run_block(block, cwd, env)
