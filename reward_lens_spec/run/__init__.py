"""The one path of a run: composed (``compose``), its inputs loaded (``inputs``), identified
(``identity``), planned (``planning``) and executed (``execute`` → ``stream``) here, for every command.

``fit``, ``calibrate``, ``freeze``/``amend``, ``adjudicate``, frames, ``compare``, the report and the
benchmarks call these functions; none rebuilds a call by hand.
"""
from .compose import compose_run
from .execute import Outcome, compute, execute
from .inputs import Inputs, encode, load_dataset, load_inputs, load_lm

__all__ = ["compose_run", "compute", "execute", "Outcome", "Inputs", "encode", "load_dataset", "load_inputs",
           "load_lm"]
