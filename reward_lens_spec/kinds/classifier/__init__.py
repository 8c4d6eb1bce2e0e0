"""``model.kind=classifier`` (the default): a sequence classifier, a linear (or gated) head at the last token.

Its loader is the one guarded loader, ``models.loading.load_model``; its settings are ``model.*`` itself (no
``model.classifier`` node), so ``settings`` is None and its run ids are as before. Its organisms are the shared
planted and trained families of ``organisms.organisms`` (every other kind's organisms build on them).
"""
from ..base import Kind, Lazy

KIND = Kind("classifier", "sequence classifier: a linear (or gated) head at the last token", __name__,
            load=Lazy("reward_lens_spec.models.loading", "load_model"),
            identities=("sum of dla = margin", "lens at the last layer = margin", "reward / margin = the head's own"))
