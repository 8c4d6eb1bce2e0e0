"""``model.kind=judge``: a generative judge, logit(yes) − logit(no) at the judgment position.

``settings``: checks and what changes the numbers (light); ``loader``: the causal LM wrapped with its verdict row;
``organism``: ``judge_planted``. See ``kinds.judge.loader`` for the math and the modes.
"""
from ..base import Kind, Lazy
from .settings import check_judge, judge_settings, refused_ops

KIND = Kind("judge", "generative judge: logit(yes) − logit(no) at the judgment position", __name__,
            load=Lazy(__name__ + ".loader", "load_judge"), check=check_judge, refuses=refused_ops,
            settings=judge_settings, organisms={"judge_planted": Lazy(__name__ + ".organism", "judge_planted")},
            criteria=("verdict_margin",), identities=("sum of dla = verdict margin",))
