"""Shared fixtures: tiny models of every family and a few deterministic pairs; the two test tiers.

Tiers: ``pytest -m "not slow"`` is the fast tier, run after every change; the slow tier is every test
that starts another process (subprocess CLI, wheel, browser, launchers, S3 server), found here from the
test's source and its fixtures' (``pytest_collection_modifyitems``), the real-model tests, and the
in-process tests a measured fast-tier run found slow (``slow_in_process.txt``, written by
``benchmarks/split_tiers.py``; each test file keeps its fastest test in the fast tier).
"""
from __future__ import annotations

import inspect
import os
import re

import pytest
import torch

from reward_lens_spec.data import Pair
from reward_lens_spec.models.formatting import encode_pairs
from reward_lens_spec.models.loading import wrap_model
from reward_lens_spec.models.tiny import TINY_CONFIGS, build_tiny

FAMILIES = [n for n in TINY_CONFIGS if n != "tiny"]

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):     # pytest -n K: the cores shared among the K workers
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture(autouse=True)
def _fresh_fingerprint_cache(tmp_path_factory, monkeypatch):
    """Each test remembers model fingerprints in a cache of its own (``models.fingerprint_cache``)."""
    monkeypatch.setenv("REWARD_LENS_SPEC_CACHE", str(tmp_path_factory.mktemp("rls_cache")))


@pytest.fixture(autouse=True)
def _no_reader_trust_file(monkeypatch):
    """No lab trust file from the developer's environment; one a test names (``store.trust_file=``, which
    sets ``REWARD_LENS_SPEC_TRUST_FILE`` in-process) is gone after it. (``monkeypatch.delenv`` of an absent
    variable records nothing to undo, so the variable is set here first: its teardown then removes whatever
    the test left, and the next test on this worker does not read that trust file.)"""
    monkeypatch.setenv("REWARD_LENS_SPEC_TRUST_FILE", "")
    monkeypatch.delenv("REWARD_LENS_SPEC_TRUST_FILE")


@pytest.fixture(autouse=True)
def _user_config_folders_do_not_leak():
    """An in-process ``main([... --config-dir D])`` adds ``D`` to the environment (``paths.add_user_dirs``,
    for launcher workers); restore it so a later test's help and search order are its own."""
    old = os.environ.get("REWARD_LENS_SPEC_CONFIG_PATH")
    yield
    if old is None:
        os.environ.pop("REWARD_LENS_SPEC_CONFIG_PATH", None)
    else:
        os.environ["REWARD_LENS_SPEC_CONFIG_PATH"] = old


def make_pairs(n: int = 5) -> list[Pair]:
    out = []
    for i in range(n):
        out.append(Pair(id=f"p{i}", prompt=f"Question {i}: what is {i} plus {i}?" + " pad" * i,
                        chosen=f"It is {2 * i}." + " Indeed." * (i % 3), rejected=f"Maybe {i + 7}?",
                        dimension="math" if i % 2 else "helpfulness"))
    return out


def assert_identical_results(a, b) -> None:
    """Two ``Result``s hold the same variables, each identical (values, coords, attrs) and of one dtype."""
    import xarray as xr

    assert list(a) == list(b) and a.attrs == b.attrs
    for k in a:
        xr.testing.assert_identical(a[k], b[k])
        assert a[k].dtype == b[k].dtype, k


def tiny_lm(name: str = "tiny", **kw):
    model, tok = build_tiny(name, **{k: v for k, v in kw.items() if k in ("seed", "num_labels", "pad_token",
                                                                        "padding_side")})
    return wrap_model(name, model, tok, dtype=kw.get("dtype", "float32"))


@pytest.fixture(scope="session")
def pairs():
    return make_pairs()


@pytest.fixture(scope="session", params=FAMILIES)
def family_lm(request):
    return tiny_lm(request.param)


@pytest.fixture(scope="session")
def encoded_for():
    def _enc(lm, ps=None, **kw):
        return encode_pairs(lm.tokenizer, ps or make_pairs(), **kw)
    return _enc


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny
    matmuls run faster on one thread than on two contended OpenMP threads of a shared 2-core box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def planted():
    """The planted-DLA organism family (6 pairs each), built once per module."""
    from reward_lens_spec.organisms.kind_organisms import organism_family
    return organism_family("planted", n_pairs=6)


@pytest.fixture(scope="module")
def dla_card(planted):
    """``observable=dla`` graded on ``planted``."""
    from reward_lens_spec.trust.scorecard import grade
    return grade("dla", organisms=planted)


SLOW_MODULES = {"test_wheel", "test_user_configs", "test_store_s3", "test_real_smollm2"}
_STARTS_PROCESS = re.compile(r"subprocess\.|Popen\(|webdriver|multiprocessing|hydra/launcher=")


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


_starts: dict = {}


def _starts_process(fn, seen=frozenset()) -> bool:
    """``fn``'s source starts a process, or calls (by name) a test-suite function that does, followed
    through the functions its module imported from other test modules (``spawn_writer`` of test_store)."""
    if fn in _starts:
        return _starts[fn]
    src = _source(fn)
    found = bool(_STARTS_PROCESS.search(src))
    if not found and fn not in seen:
        for name, g in getattr(fn, "__globals__", {}).items():
            if (inspect.isfunction(g) and g is not fn and _is_test_code(g)
                    and re.search(rf"\b{re.escape(name)}\(", src) and _starts_process(g, seen | {fn})):
                found = True
                break
    if not seen:
        _starts[fn] = found
    return found


def _is_test_code(fn) -> bool:
    mod = getattr(fn, "__module__", "") or ""
    return mod == "conftest" or mod.startswith(("tests.", "test_")) or mod.rpartition(".")[2].startswith("test_")


def _measured_slow() -> frozenset:
    """Node ids listed in ``slow_in_process.txt`` (one per line, then its measured seconds; ``#`` comments)."""
    path = os.path.join(os.path.dirname(__file__), "slow_in_process.txt")
    if not os.path.exists(path):
        return frozenset()
    with open(path, encoding="utf-8") as fh:
        return frozenset(line.rsplit(" ", 1)[0] for line in fh if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(config, items):
    """Mark slow every test that starts a process, directly, through a fixture or through a helper it
    calls (its own module's or one imported from another test module, followed transitively), every
    test of ``SLOW_MODULES``, and every test ``slow_in_process.txt`` lists."""
    measured = _measured_slow()
    for item in items:
        if item.get_closest_marker("slow"):
            continue
        if item.nodeid in measured:
            item.add_marker(pytest.mark.slow)
            continue
        mod = item.module
        fns = [item.function] + [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        if mod.__name__.rpartition(".")[2] in SLOW_MODULES or any(_starts_process(f) for f in fns):
            item.add_marker(pytest.mark.slow)


def needs_plugin(module: str, package: str):
    """Skip (saying which extra) when a Hydra launcher plugin is not installed."""
    import importlib.util
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return pytest.mark.skipif(not found, reason=f"needs {package} (pip install 'reward_lens_spec[full]')")


JOBLIB = needs_plugin("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher")
SUBMITIT = needs_plugin("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher")
