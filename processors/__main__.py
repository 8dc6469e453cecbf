"""``python -m framespool.processors {admission,scheduler,clock} --bootstrap HOST:PORT --data-dir DIR``.

Exit status: 0 after SIGTERM/SIGINT (batch finished, state snapshotted, group
left), 2 for a bad configuration or missing topics, 3 when outputs could not
be delivered or state not saved (restart it: the batch is replayed).
Logs are JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from framespool.log import LogError, LogProducer
from framespool.processors.app import (
    ProcessorFailed,
    ProcessorRunner,
    SetupError,
    topics_with_suffix,
)
from framespool.processors.config_file import (
    ConfigError,
    admission_config,
    cell_config,
    describe,
    read_config_file,
)
from framespool.processors.routing import RoutingError
from framespool.processors.snapshots import SnapshotStore, StatefulProcessor
from framespool.schemas import topics as catalogue
from framespool.schemas.topics import Topics
from framespool.telemetry.jsonlog import setup_logging

log = logging.getLogger("processors")

EXIT_CONFIG = 2
EXIT_FAILED = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m framespool.processors",
        description="Run a framespool stream processor (admission, scheduler) or the clock.",
        epilog="Exit status: 0 after SIGTERM/SIGINT, 2 bad configuration or missing topics, "
        "3 outputs not delivered or state not saved (restart it).",
    )
    parser.add_argument("role", choices=("admission", "scheduler", "clock"))
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--data-dir", type=Path, help="this instance's own directory for state")
    parser.add_argument("--config", type=Path, help="JSON or TOML with [admission]/[scheduler]")
    parser.add_argument("--instance", default="", help="instance name (client id, logs)")
    parser.add_argument(
        "--topic-suffix",
        default="",
        help="read and write '<catalogue name>.<suffix>' topics (tests)",
    )
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=1000)
    parser.add_argument("--max-batch", type=int, default=500)
    parser.add_argument(
        "--snapshot-interval",
        type=float,
        default=0.0,
        help="seconds between snapshots of a partition (0: every batch)",
    )
    parser.add_argument(
        "--shared-snapshots",
        default=os.environ.get("FRAMESPOOL_SHARED_SNAPSHOTS", ""),
        metavar="LOCATION",
        help="where every instance publishes and finds snapshots, so any instance takes over a "
        "partition from its latest state: s3://BUCKET/PREFIX (endpoint from AWS_ENDPOINT_URL) or "
        "a directory all instances share (default: none; a partition that moves is rebuilt from "
        "the new instance's own snapshot or from offset 0)",
    )
    parser.add_argument(
        "--publish-interval",
        type=float,
        default=5.0,
        help="seconds between shared snapshots of a partition (always on revoke and shutdown)",
    )
    parser.add_argument("--interval", type=float, default=0.25, help="clock: seconds between Ticks")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics on 127.0.0.1:PORT/metrics (0 = off)",
    )
    parser.add_argument("--log-level", default=os.environ.get("FRAMESPOOL_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


def build_runner(args: argparse.Namespace, topics: Topics) -> ProcessorRunner:
    """Wire one stateful processor instance (raises ConfigError/RoutingError when it can't)."""
    from framespool.processors.admission import AdmissionFold
    from framespool.processors.scheduler import SchedulerFold

    doc = read_config_file(args.config) if args.config else {}
    if args.data_dir is None:
        raise ConfigError(f"{args.role} needs --data-dir (one directory per instance)")
    if args.role == "admission":
        fold: Any = AdmissionFold(admission_config(doc), topics)
        input_topic, group, store_name = (
            topics.COMMANDS,
            catalogue.ADMISSION_GROUP,
            catalogue.ADMISSION_STORE,
        )
    else:
        fold = SchedulerFold(cell_config(doc), topics)
        input_topic, group, store_name = (
            topics.SCHEDULER,
            catalogue.SCHEDULER_GROUP,
            catalogue.SCHEDULER_STORE,
        )
    if args.topic_suffix:
        group = f"{group}.{args.topic_suffix}"
    log.info("%s config: %s", args.role, describe(fold.config))
    try:
        store = SnapshotStore(args.data_dir / store_name, input_topic.name)
    except Exception as exc:  # rocksdb: locked by another process, unwritable...
        raise ConfigError(
            f"cannot open the state store in {args.data_dir / store_name}: {exc}"
        ) from None
    shared = None
    if args.shared_snapshots:
        from framespool.processors.shared_snapshots import open_shared_snapshots

        shared = open_shared_snapshots(args.shared_snapshots)
        log.info("shared snapshots: %s", shared.describe())
    processor = StatefulProcessor(
        fold,
        store,
        input_topic.name,
        snapshot_interval_s=args.snapshot_interval,
        shared=shared,
        instance=args.instance or f"{socket.gethostname()}-{os.getpid()}",
        publish_interval_s=args.publish_interval,
        # nobody can take a partition over sooner than a session timeout after our
        # last heartbeat: checking twice per timeout catches a pause longer than that
        verify_after_s=args.session_timeout_ms / 2000,
    )
    return ProcessorRunner(
        processor,
        args.bootstrap,
        group,
        input_topic=input_topic,
        instance=args.instance,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_batch=args.max_batch,
    )


def record_config(args: argparse.Namespace, topics: Topics) -> None:
    """Write the configuration this instance folds with to job-events
    (``ProcessorConfigured``, keyed by its role), so that replay and audit read it
    from the log instead of guessing. A failure is logged, not fatal: the fold
    does not depend on it."""
    import time

    from framespool.processors.config_file import recorded_document
    from framespool.schemas import codec
    from framespool.schemas.events import ProcessorConfigured

    doc = read_config_file(args.config) if args.config else {}
    text, digest = recorded_document(doc)
    instance = args.instance or f"{socket.gethostname()}-{os.getpid()}"
    now_ms = int(time.time() * 1000)
    event = ProcessorConfigured(
        event_id=f"{instance}/configured@{now_ms}",
        ts_ms=now_ms,
        processor=args.role,
        instance=instance,
        document=text,
        sha256=digest,
    )
    try:
        with LogProducer(args.bootstrap) as producer:
            producer.produce(topics.JOB_EVENTS.name, args.role, codec.encode(event))
            producer.flush(10.0)
        log.info("%s config recorded (sha256 %s)", args.role, digest[:12])
    except (LogError, OSError) as exc:
        log.warning("%s config not recorded in the log: %s", args.role, exc)


# seconds a SIGTERM/SIGINT waits for the current batch before the process exits hard
SHUTDOWN_BOUND_S = 20.0
EXIT_SHUTDOWN_TIMEOUT = 4  # a graceful stop that did not finish within SHUTDOWN_BOUND_S


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level, role=args.role, instance=args.instance or "default")
    topics = topics_with_suffix(args.topic_suffix)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %s: finishing the current batch", signal.Signals(signum).name)
        stop.set()
        # A graceful stop that cannot finish (the broker died with the launcher,
        # so a flush or commit waits on it) ends hard after SHUTDOWN_BOUND_S:
        # nothing is lost, state and offsets commit only after delivery
        bound = threading.Timer(SHUTDOWN_BOUND_S, os._exit, args=(EXIT_SHUTDOWN_TIMEOUT,))
        bound.daemon = True
        bound.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.role == "clock":
        from framespool.processors.clock import Clock

        producer = LogProducer(args.bootstrap, **{"client.id": f"framespool-clock-{args.instance}"})
        try:
            Clock(producer, topics, args.interval).run(stop)
        except ValueError as exc:
            print(f"processors clock: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        finally:
            producer.close(timeout=5.0)
        return 0
    try:
        runner = build_runner(args, topics)
    except (ConfigError, RoutingError, ValueError) as exc:
        log.error("bad configuration: %s", exc)
        print(f"processors {args.role}: bad configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    record_config(args, topics)
    if args.metrics_port:
        from framespool.processors.metrics import RunnerCollector, serve

        serve(RunnerCollector(runner, args.role), args.metrics_port)
    try:
        runner.run(stop)
    except SetupError as exc:  # topics missing or with the wrong partition count
        log.error("%s", exc)
        print(f"processors {args.role}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (ProcessorFailed, LogError) as exc:
        log.critical("%s", exc)
        return EXIT_FAILED
    finally:
        runner.processor.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
