"""Config → Program: the durations drawn, the per-step sizes, and SGLang's overlap loop.

- :mod:`.draws`: every duration of a run drawn up front (one generator call per
  distribution), symbolic draws for iteration templates, affine durations evaluated per use;
- :mod:`.sizes`: the per-step batch, graph bucket and accepted tokens, and the arrivals model;
- :mod:`.loop`: the builder of the overlap loop (docs/design.md, "SGLang's overlap loop"),
  which takes the sizes as an argument and never fetches them;
- :mod:`.moves`: the iterations of configs that differ only in where read-done is
  published, built once, each one's record moved (``advise``'s families).

Imports: numpy, simwar.core and simwar.config; never an executor (``simwar.api`` orders
sizes → arrivals → build → execute).
"""
