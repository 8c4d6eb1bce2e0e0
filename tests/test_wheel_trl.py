"""From a wheel in an empty folder (issue 41, done-when): a TRL conversational preference file and a stepwise PRM
file run end to end with the installed CLI; the run records the shape, and the stepwise grades are stored."""
from __future__ import annotations

import json

import pytest

from tests.test_wheel import _run, _venv, _wheel

CONV = [{"chosen": [{"role": "user", "content": f"What is {i} + {i}?"}, {"role": "assistant", "content": f"{2 * i}."}],
         "rejected": [{"role": "user", "content": f"What is {i} + {i}?"}, {"role": "assistant", "content": f"{i + 5}."}]}
        for i in range(3)]
STEPS = [{"prompt": f"What is {i} * 3?", "completions": [f"{i} * 3 = {3 * i}.", f"The answer is {3 * i}."],
          "labels": [True, i % 2 == 0]} for i in range(3)]
READ = """\
import json, sys
from reward_lens_spec import open_store
st = open_store(sys.argv[1])
out = {}
for rid in st.runs()["run_id"]:
    p = st.provenance(rid)
    r = st.load(rid, p["observable"])
    out[p["observable"]] = {"shape": p.get("data_shape"), "vars": sorted(r.data_vars),
                            "acc": float(r["step_accuracy"]) if "step_accuracy" in r.data_vars else None}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_trl_conversational_file_and_a_stepwise_prm_file_run_from_the_wheel(tmp_path):
    env_dir = _venv(tmp_path, _wheel(tmp_path))
    py, exe = env_dir / "bin" / "python", env_dir / "bin" / "reward-lens-spec"
    work = tmp_path / "empty"
    work.mkdir()
    (work / "conv.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CONV))
    (work / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STEPS))
    _run([exe, "dataset=trl", "dataset.path=conv.jsonl", "store.url=s.zarr"], cwd=work)
    _run([exe, "model=tiny_prm", "dataset=trl_stepwise", "dataset.path=steps.jsonl", "observable=prm_labels",
          "store.url=s.zarr"], cwd=work)
    got = json.loads(_run([py, "-c", READ, work / "s.zarr"], cwd=work).stdout)
    assert got["score"]["shape"] == {"shape": "conversational_implicit", "chat_template": "model",
                                     "step_separator": None}
    assert got["prm_labels"]["shape"] == {"shape": "stepwise", "chat_template": None, "step_separator": "\n"}
    assert {"step_accuracy", "step_auc", "first_error_accuracy"} <= set(got["prm_labels"]["vars"])
    assert 0.0 <= got["prm_labels"]["acc"] <= 1.0
