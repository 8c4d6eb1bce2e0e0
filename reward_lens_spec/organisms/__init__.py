"""Model organisms: small models with a planted, known answer, built in code, that a scorecard grades an
observable against (``trust.scorecard``, ``reward-lens-spec calibrate``) — one module per family of plants
(``organisms``: the classifier's planted units, heads and paths; ``preference_organisms``, ``repr_organisms``,
``sae_organism``), on ``organism_base``; each kind of reward signal keeps its own in its folder
(``kinds/<kind>/organism.py``, named by its ``Kind``). Each family is one ``OrganismFamily`` in
``registries.ORGANISMS``; ``kind_organisms.organism_family`` builds any of them. They are calibration fixtures, so they stand above the models, inputs and frames they are built from.
"""
