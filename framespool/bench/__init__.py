"""The benchmarks, one module per ``framespool bench`` target (the command line,
its flags and its report: :mod:`framespool.commands.bench`).

- :mod:`~framespool.bench.core`: events/s, placements/s and decision latency of
  the scheduler core (``Cell.apply`` on recorded streams; no broker);
- :mod:`~framespool.bench.pipeline`: the whole embedded stack end to end, jobs/s
  and submit -> assigned latency split by hop;
- :mod:`~framespool.bench.soak`: a steady rate for minutes, latency per minute as
  the log grows;
- :mod:`~framespool.bench.takeover`: a new scheduler instance takes a cell over
  from its shared snapshot;
- :mod:`~framespool.bench.fetch`: the broker's CPU under idle readers, by fetch wait;
- :mod:`~framespool.bench.cluster`: what ``GET /v1/cluster`` costs the API at
  fleet scale;
- :mod:`~framespool.bench.snapshot`: what pickling a processor's state for a
  snapshot costs its turn.

They start the embedded broker or stack and wire processes, so they sit in the
composition root (pyproject's import-linter layers).
"""
