"""The measured slow list (``slow_in_process.txt``, issue 27 item 6) names real tests and leaves every test
file at least one test in the fast tier."""
from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _listed() -> list[str]:
    lines = (HERE / "slow_in_process.txt").read_text(encoding="utf-8").splitlines()
    return [line.rsplit(" ", 1)[0] for line in lines if line.strip() and not line.startswith("#")]


def test_every_listed_test_exists_and_every_file_keeps_a_fast_test():
    listed = _listed()
    assert listed and len(set(listed)) == len(listed)
    by_file: dict[str, set[str]] = {}
    for node in listed:
        path, _, name = node.partition("::")
        by_file.setdefault(path, set()).add(node)
        src = (HERE.parent / path).read_text(encoding="utf-8")
        assert re.search(rf"^(?:async )?def {re.escape(name.split('[')[0])}\(", src, re.M), node
    for path, nodes in by_file.items():
        src = (HERE.parent / path).read_text(encoding="utf-8")
        names = re.findall(r"^def (test_\w+)\(", src, re.M)
        whole = {n.split("::")[1] for n in nodes if "[" not in n}
        assert any(n not in whole for n in names), f"{path}: every test is in the slow list"
