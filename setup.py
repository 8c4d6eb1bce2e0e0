"""Package list derived from the tree: every ``reward_lens_spec*`` package, plus the config tree.

``conf/`` lives at the top level and ships as ``reward_lens_spec.conf`` (``package-dir`` in
pyproject.toml), its folders as namespace packages of YAML files; ``find_packages`` cannot see
it under that name, so it is found where it is and renamed. Everything else is in pyproject.toml.
"""
from setuptools import find_namespace_packages, find_packages, setup

conf = ["reward_lens_spec." + p for p in find_namespace_packages(include=["conf", "conf.*"])]
setup(packages=find_packages(include=["reward_lens_spec", "reward_lens_spec.*"]) + conf)
