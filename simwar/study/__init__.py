"""Studies of many simulated runs: sweeps over configs and the policy advisor.

- :mod:`.sweeps`: factorial sweeps from YAML, resumable, locally or on Ray;
- :mod:`.advise`: the fastest race-free barrier and publish point for a workload.

Imports: simwar.api and the layers below.
"""
