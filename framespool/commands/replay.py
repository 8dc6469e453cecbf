"""``framespool replay``: re-fold the scheduler and commands topics and compare with
what was emitted.

Also the log-reading options ``audit`` and ``verify`` share (:func:`log_arguments`,
:func:`read_log_for`, :func:`cell_config_for`).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from framespool.commands import CommandError


def log_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the log is, which scheduler policy folded it, and ``--json``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else "
        "the stack.json of --data-dir)",
    )
    where.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="a 'framespool up' data dir: read its stack.json (default: .framespool)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the processors' JSON/TOML config (its [scheduler] and [admission] "
        "sections); must be the one the processors ran with (default: the one "
        "'framespool up' wrote in --data-dir, if any)",
    )
    parser.add_argument("--topic-suffix", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to read each topic to its end",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def bootstrap_for(args: argparse.Namespace) -> str:
    if args.bootstrap:
        return args.bootstrap
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env and args.data_dir is None:
        return env
    path = Path(args.data_dir or ".framespool") / "stack.json"
    try:
        return json.loads(path.read_text())["bootstrap_servers"]
    except FileNotFoundError:
        raise CommandError(
            f"no {path}: start the stack with 'framespool up', or pass --bootstrap HOST:PORT"
        ) from None
    except (ValueError, KeyError) as exc:
        raise CommandError(f"{path} has no bootstrap_servers ({exc}); pass --bootstrap") from None


def config_path_for(args: argparse.Namespace) -> Path | None:
    """``--config``; else, when the log is found through a data dir (as in
    :func:`bootstrap_for`), the processors' config ``framespool up`` wrote there."""
    if args.config is not None:
        return args.config
    if args.bootstrap or (os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and args.data_dir is None):
        return None
    path = Path(args.data_dir or ".framespool") / "processors-config.json"
    return path if path.is_file() else None


def recorded_config(log: Any, processor: str) -> dict | None:
    """The config document ``processor`` last recorded in the log
    (``ProcessorConfigured`` on job-events), or None. When the log holds several
    different ones, says on stderr that decisions folded under an earlier one may
    differ from the re-fold."""
    import sys

    from framespool.schemas import codec
    from framespool.schemas.events import ProcessorConfigured

    found = []
    for record in log.job_events:
        if record.key != processor.encode():
            continue
        try:
            event = codec.decode(record.value)
        except codec.DecodeError:
            continue
        if isinstance(event, ProcessorConfigured) and event.processor == processor:
            found.append(event)
    if not found:
        return None
    latest = found[-1]
    if len({e.sha256 for e in found}) > 1:
        print(
            f"note: the {processor} ran with {len({e.sha256 for e in found})} configurations "
            f"in this log; using the latest (sha256 {latest.sha256[:12]}, recorded by "
            f"{latest.instance}): inputs folded under an earlier one may diverge",
            file=sys.stderr,
        )
    return json.loads(latest.document)


def cell_config_for(args: argparse.Namespace, log: Any = None) -> Any:
    """``--config``; else the scheduler's configuration recorded in ``log``; else the
    file ``framespool up`` wrote in the data dir; else the defaults."""
    from framespool.processors.config_file import ConfigError, cell_config, load_cell_config
    from framespool.processors.core import CellConfig

    recorded = (
        recorded_config(log, "scheduler") if log is not None and args.config is None else None
    )
    try:
        if recorded is not None:
            return cell_config(recorded)
        path = config_path_for(args)
        return CellConfig() if path is None else load_cell_config(path)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def admission_config_for(args: argparse.Namespace, log: Any = None) -> Any:
    """As :func:`cell_config_for`, for admission."""
    from framespool.processors.config_file import (
        ConfigError,
        admission_config,
        load_admission_config,
    )
    from framespool.processors.core.admission import AdmissionConfig

    recorded = (
        recorded_config(log, "admission") if log is not None and args.config is None else None
    )
    try:
        if recorded is not None:
            return admission_config(recorded)
        path = config_path_for(args)
        return AdmissionConfig() if path is None else load_admission_config(path)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None


def read_log_for(
    args: argparse.Namespace, cells: list[int] | None = None, commands: bool = True
) -> Any:
    from framespool.log import LogError
    from framespool.processors.app import topics_with_suffix
    from framespool.processors.tools.reader import read_log

    bootstrap = bootstrap_for(args)
    try:
        return read_log(
            bootstrap,
            topics_with_suffix(args.topic_suffix),
            cells=cells,
            commands=commands,
            group_suffix=args.topic_suffix,
            timeout_s=args.timeout,
        )
    except (LogError, TimeoutError) as exc:
        raise CommandError(
            f"cannot read the log at {bootstrap}: {exc}; is the broker running?"
        ) from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay",
        help="re-fold the scheduler and commands log with the cores and compare with their outputs",
        description="Re-fold the scheduler topic from offset 0 with the scheduler core, and "
        "the commands topic with the admission core, and compare every output with "
        "what was emitted on job-events, assignments and the scheduler topic (same "
        "event id -> same bytes). Reports the first divergence exactly. Exit status "
        "1 on divergence, 2 on a usage error.",
    )
    p.add_argument(
        "--cell", metavar="CELL", help="replay only this cell (e.g. cell-0; admission is left out)"
    )
    p.add_argument(
        "--until",
        metavar="OFFSET|TIME",
        help="stop after input OFFSET (inclusive), or before the first Tick past "
        "TIME (epoch ms or ISO-8601, e.g. 2026-05-01T12:00:00Z)",
    )
    snapshot_arguments(p)
    log_arguments(p)
    p.set_defaults(handler=handle)


def snapshot_arguments(p: argparse.ArgumentParser) -> None:
    """Where the processors' shared snapshots are, for cells whose log head expired."""
    p.add_argument(
        "--snapshots",
        metavar="LOCATION",
        help="the processors' shared snapshots (a directory or s3://BUCKET/PREFIX; default: "
        "<data-dir>/processors/shared-snapshots): a cell whose log head expired is replayed "
        "from its snapshot",
    )
    p.add_argument(
        "--from-snapshot",
        action="store_true",
        help="start every cell from its shared snapshot even where the whole log is there "
        "(faster; proves only what follows it)",
    )


def snapshot_starts(
    args: argparse.Namespace, log: Any, cells: list[int] | None
) -> dict[int, tuple[Any, int]]:
    """The cells to start from a shared snapshot: those whose log head expired (or
    every cell with ``--from-snapshot``), each with ``(cell state, offset)``."""
    import pickle

    from framespool.processors.shared_snapshots import SharedStoreError, open_shared_snapshots

    partitions = log.scheduler_partitions()
    wanted = [
        p
        for p, records in partitions.items()
        if (cells is None or p in cells)
        and (args.from_snapshot or (records and records[0].offset > 0))
    ]
    if not wanted:
        return {}
    location = args.snapshots or str(
        Path(args.data_dir or ".framespool") / "processors" / "shared-snapshots"
    )
    if not args.snapshots and not Path(location).is_dir():
        return {}  # nothing to start from: those cells are reported unprovable
    store = open_shared_snapshots(location)
    starts = {}
    for p in wanted:
        try:
            found = store.load(log.topics.SCHEDULER.name, p)
        except SharedStoreError as exc:
            raise CommandError(f"--snapshots {location}: {exc}") from None
        if found is not None:
            meta, payload = found
            starts[p] = (pickle.loads(payload), meta.offset)
    return starts


def handle(args: argparse.Namespace) -> int:
    from framespool.processors.tools.history import parse_until
    from framespool.processors.tools.replay import replay
    from framespool.schemas.topics import SCHEDULER, partition_of_cell

    cells = None
    if args.cell:
        try:
            cells = [partition_of_cell(args.cell)]
        except ValueError as exc:
            raise CommandError(f"--cell: {exc}") from None
        if cells[0] >= SCHEDULER.partitions:
            raise CommandError(
                f"--cell {args.cell}: the scheduler topic has cells cell-0 to "
                f"cell-{SCHEDULER.partitions - 1}"
            )
    try:
        until = parse_until(args.until) if args.until else None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    log = read_log_for(args, cells=cells, commands=cells is None)
    config = cell_config_for(args, log)
    admission = admission_config_for(args, log) if cells is None else None
    starts = snapshot_starts(args, log, cells)
    report = replay(
        log, config, cells=cells, until=until, admission_config=admission, starts=starts
    )
    print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else report.render())
    return 0 if report.ok else 1
