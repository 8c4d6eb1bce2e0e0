"""``model.kind=ensemble``: member rewards reduced per side (mean | min | quantile).

``settings``: checks, what changes the numbers, the reduce, the refused instruments; ``model``: ``EnsembleModel``;
``organism``: ``ensemble_planted``. The settings resolve members through ``models.door`` (which builds a
``ModelSpec``), so they are lazy references too.
"""
from ..base import Kind, Lazy

KIND = Kind("ensemble", "ensemble: member rewards reduced per side (mean | min | quantile)", __name__,
            other_checkpoints=True, load=Lazy(__name__ + ".model", "load_ensemble"),
            check=Lazy(__name__ + ".settings", "check_ensemble"),
            refuses=Lazy(__name__ + ".settings", "refused_ops"),
            settings=Lazy(__name__ + ".settings", "ensemble_settings"),
            organisms={"ensemble_planted": Lazy(__name__ + ".organism", "ensemble_organism")},
            criteria=("ensemble_reward", "ensemble_member_margin"), identities=("reward / margin = the reduce of "
                                                                                "the members' own",))
