"""framespool, an event-sourced GPU job scheduler on a Kafka log.

The design's folders install as subpackages (``schemas/`` is
:mod:`framespool.schemas`; ``processors/``, ``producers/``, ``projections/``,
``agents/`` likewise: pyproject's package-dir). What lives in ``framespool/``
itself, by what it is (the layers are pyproject's import-linter contract):

The composition root (the top layer: it may import everything, nothing imports it)
    - ``bootstrap.py``: where every process is built from its settings
      (admission, scheduler, clock, api, agent) and the command lines that start them;
    - ``cli.py`` and ``commands/``: the ``framespool`` command, one module per command;
    - ``services.py``: ``python -m framespool.services {api,agent}``, the entry point
      Compose starts (the processors' is ``processors/__main__.py``);
    - ``stack.py``: the embedded stack behind ``framespool up``, which starts and
      supervises every process; ``stack_secrets.py``: the one builder of its
      secrets file (the Compose init uses it too); ``broker/``: the embedded
      Kafka and Tansu brokers;
    - ``bench/``: the benchmarks behind ``framespool bench``; ``chaos/``: the
      drill behind ``framespool chaos``.

Leaves every process package may import (none imports another)
    - ``log/``: the log port, its Kafka adapter and the in-memory fake;
    - ``configfile.py``: the one loader of configuration files;
    - ``private_files.py``: owner-only modes for directories holding tenants' data;
    - ``callbacks/``, ``telemetry/``: the callback-target policy, the JSON log format.
"""
