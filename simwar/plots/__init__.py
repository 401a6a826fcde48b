"""Figures (interim: re-exports simwar.plots.figures while the package is split)."""

from simwar.plots import figures as _figures

globals().update({k: v for k, v in vars(_figures).items() if not k.startswith("__")})
