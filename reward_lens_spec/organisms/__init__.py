"""Model organisms: small models with a planted, known answer, built in code, that a scorecard grades an
observable against (``trust.scorecard``, ``reward-lens-spec calibrate``) — one module per family of plants
(``organisms``: the classifier's planted units, heads and paths; ``kind_organisms``: one per kind of reward
signal; ``preference_organisms``, ``repr_organisms``, ``sae_organism``, ``prm_organism``, ``judge_organism``,
``implicit_organism``, ``ensemble_organism``), on ``organism_base``. They are calibration fixtures, so they
stand above the models, inputs and frames they are built from.
"""
