"""Fitting: configs from real captures, costs from harness replays, and how well they agree.

From a Kineto capture (opened by :func:`simwar.capture.open.open_capture`):

- :mod:`.from_capture`: the whole overlap loop as a runnable config (``simwar import
  --fit``), from :mod:`.layout` (which host call is which in each step of a Trace),
  :mod:`.policy` (which stream is which, the barrier policy, from the record
  each wait binds to or its event ids) and :mod:`.samples` (per step: device times, host
  costs, CPU work), each key fitted against the step's size where the batch changes
  (:mod:`.affine`), the profiler's stalls left out and its device time rescaled
  (:mod:`.profiler`);
- :mod:`.durations`: per-phase duration distributions and host costs only
  (``simwar import --fit-costs``), and the distribution fit every fitted value goes
  through;
- :mod:`.check`: the capture against the simulation of a fitted config (``simwar
  import --check``: :func:`~simwar.fit.check.check_fit`), with the acceptance bounds.

The checkers of the project's own GPU data (the probe's captures, the mini-server's loads
and prefill cases) fit through these modules and are the lab's (``lab/`` in a source
checkout, not installed: ``python -m lab.probe_check``, ``lab.server_check``,
``lab.prefill_check``).

From measured harness replays (:mod:`simwar.harness`'s traces and summaries):

- :mod:`.replays`: measured summaries, the host-cost calibration (``simwar
  calibrate``) and the error table of every case (``simwar compare``).

Both comparisons are :mod:`.compare`'s: one measured summary against one simulated.
This package sits above the simulator (it simulates fitted configs) and below the CLI;
the CLI imports its modules inside its commands.
"""
