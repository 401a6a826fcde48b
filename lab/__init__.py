"""The lab: the GPU scripts that measure real kernels, and the checkers of what they measured.

Not part of the installed package (``pyproject.toml`` installs ``simwar*`` only) and
reachable from neither the ``simwar`` command nor :mod:`simwar.api`: run its modules from a
source checkout's root, ``python -m lab.<module>`` (lab/README.md lists them). The lab
imports simwar; simwar never imports the lab (tests/test_layers.py).

Importing this package imports nothing: the GPU scripts (:mod:`lab.server`, :mod:`lab.probe`)
run on a machine with torch and numpy but none of simwar's other dependencies.
"""
