"""A JSON-Lines file of ``n`` numbered pairs (ids ``q0``…; prompts repeat every 97 rows), for the tests that
measure what a run holds per pair (``test_memory_route``, ``test_file_pairs``)."""
from __future__ import annotations

import json


def write_numbered_pairs(path, n: int):
    """Write ``n`` pairs to ``path`` (one JSON object per line) and return ``path``."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "prompt": f"Q{i % 97}: {i % 7} + {i % 5}?",
                                "chosen": f"It is {i % 7 + i % 5}.", "rejected": f"Maybe {i % 11}."}) + "\n")
    return path
