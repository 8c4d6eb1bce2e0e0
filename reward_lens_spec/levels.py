"""The trust ladder a result's ``trust`` attr takes, lowest first.

Computed by the gates of ``trust/`` from the evidence a run has, never set by hand; readers that combine runs
(``compare``) take the lowest of theirs. A module of its own, importing nothing, so that a reused run's JSON
route (``run.reuse`` → ``trust.evidence_chain``) reads the ladder without importing xarray.
"""

LEVELS = ("exploratory", "calibrated", "registered", "adjudicated")
