"""``model.kind=prm``: a process reward model, the head read at every step boundary.

``settings``: checks and what changes the numbers (light); ``steps``: step boundaries, the readout cut
(``cut_at_step``, the kind's ``encode``), the loader and the aggregates; ``organism``: ``prm_planted``.
"""
from ..base import Kind, Lazy
from .settings import check_prm, prm_settings

KIND = Kind("prm", "process reward model: the head at every step boundary", __name__,
            load=Lazy(__name__ + ".steps", "load_prm"), check=check_prm,
            encode=Lazy(__name__ + ".steps", "cut_at_step"), encode_reads_pairs=True, settings=prm_settings,
            organisms={"prm_planted": Lazy(__name__ + ".organism", "prm_planted")},
            criteria=("prm_bad_step", "prm_step_reward", "prm_step_margin"),
            identities=("PRM aggregate = the declared rule over σ(step rewards)",
                        "PRM step reward at the readout step = the head's own reward"))
