"""Tools that reuse the core on the log: ``replay``, ``audit``, ``verify``
(docs/design.md#tools-that-reuse-the-core).

Each tool is logic over records and decoded events (``history``,
``replay``, ``audit``, ``verify``, ``ledger``; the ones without IO are on the
purity list in pyproject.toml) plus one thin reader
(``reader``) that fetches the topics and the processors' committed positions.
The scheduler's own fold (``framespool.processors.scheduler.SchedulerFold``: decode,
``Cell.apply`` at position ``cell-<p>@<offset>``, route) is what re-folds the
log, so a tool can never disagree with the processor about what an input means.
"""
