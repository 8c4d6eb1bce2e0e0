"""``model.kind=implicit``: the DPO-implicit reward β·Σ_t [log π − log π_ref] over the response tokens.

``settings``: checks, what changes the numbers, the refused linear instruments; ``model``: ``ImplicitModel`` and its
own capture pass; ``patch``: patching on the implicit reward; ``organism``: ``implicit_planted``. The settings
resolve the reference model through ``models.door`` (which builds a ``ModelSpec``), so they are lazy references too.
"""
from ..base import Kind, Lazy

KIND = Kind("implicit", "DPO-implicit reward: β·Σ_t [log π − log π_ref] over the response tokens", __name__,
            other_checkpoints=True, load=Lazy(__name__ + ".model", "load_implicit"),
            check=Lazy(__name__ + ".settings", "check_implicit"),
            encode=Lazy(__name__ + ".model", "with_response_starts"), encode_reads_pairs=True,
            refuses=Lazy(__name__ + ".settings", "refused_ops"),
            settings=Lazy(__name__ + ".settings", "implicit_settings"),
            organisms={"implicit_planted": Lazy(__name__ + ".organism", "implicit_organism")},
            criteria=("implicit_log_ratio",), identities=("per-token reward: Σ over position = reward per side",))
