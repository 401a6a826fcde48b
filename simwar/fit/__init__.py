"""Fitting and calibration: configs from captures, costs from replays, and their checks.

Imports: simwar.api, simwar.capture and the layers below.
"""
