"""The one path of a run: composed (``compose``), its inputs loaded (``reward_lens_spec.inputs``), identified
(``identity``), planned (``planning``) and executed (``execute`` → ``stream``) here, for every command.

``fit``, ``calibrate``, ``freeze``/``amend``, ``adjudicate``, frames, ``compare``, the report and the
benchmarks call these functions; none rebuilds a call by hand. Names are imported on first use, so
composing a command line (``run.compose``) does not import torch.

The package is also callable: ``reward_lens_spec.run([...])`` is ``api.run`` (a study from Python).
"""
import sys
import types
from importlib import import_module

_WHERE = {"compose_run": ".compose", "compute": ".executor", "execute": ".executor", "Outcome": ".executor",
          "Inputs": "..inputs", "encode": "..inputs", "load_dataset": "..inputs", "load_inputs": "..inputs",
          "load_lm": "..inputs"}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'reward_lens_spec.run' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name], __name__), name)


class _Callable(types.ModuleType):
    def __call__(self, overrides=None, **kw):
        """``reward_lens_spec.api.run``: compose and execute one run from Python, on the one path."""
        return import_module("reward_lens_spec.api").run(overrides, **kw)


sys.modules[__name__].__class__ = _Callable
