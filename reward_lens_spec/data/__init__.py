"""Preference pairs: the ``Pair``/``PairSet`` schema, loaders, the built-in diagnostic set,
content checksums and effective sample size."""
from .checksum import dataset_checksum, effective_sample_size
from .loaders import load_pairs
from .pairs import Pair, PairSet

__all__ = ["Pair", "PairSet", "load_pairs", "dataset_checksum", "effective_sample_size"]
