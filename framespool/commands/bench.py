"""``framespool bench core|pipeline|takeover|fetch|cluster``: the core, the pipeline, a cell
takeover, what idle consumers cost the broker, what the cluster map costs the API."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from framespool.commands import CommandError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmarks", description="Benchmarks of framespool's components."
    )
    targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    core = targets.add_parser(
        "core",
        help="events/s, placements/s and decision latency of the scheduling core",
        description="Time Cell.apply on a recorded mixed event stream and on placement passes "
        "over a large queue (inputs are built before timing).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    core.add_argument("--nodes", type=int, default=2000)
    core.add_argument("--gpus-per-node", type=int, default=8)
    core.add_argument(
        "--queued", type=int, default=50_000, help="jobs queued before the placement passes"
    )
    core.add_argument(
        "--events", type=int, default=200_000, help="timed events of the mixed stream"
    )
    core.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed events first (0 = min(events/3, 20 per node))",
    )
    core.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="completion rounds after the fill, each timed by one pass",
    )
    core.add_argument(
        "--load",
        type=float,
        default=0.9,
        help="offered load of the recorded mixed stream (queues build above ~0.95)",
    )
    core.add_argument("--seed", type=int, default=1)
    core.add_argument(
        "--scenarios",
        default="light,backlog",
        help="comma-separated: light (steady, 16 tenants), backlog (multitenant: thousands "
        "of tenants, Zipf-like volumes, 1-64 GPU gangs, a deep queue)",
    )
    core.add_argument(
        "--backlog-events",
        type=int,
        default=None,
        help="timed events of the backlog stream (default: --events / 2)",
    )
    core.add_argument(
        "--backlog-queued",
        type=int,
        default=None,
        help="queued jobs before the backlog stream is timed, and queued for its passes "
        "(default: 2.5 per node, 5,000 at 2,000 nodes)",
    )
    core.add_argument(
        "--backlog-tenants",
        type=int,
        default=None,
        help="tenants of the backlog scenario (default: one per node, 2,000 at 2,000 nodes)",
    )
    core.add_argument(
        "--backlog-load",
        type=float,
        default=3.0,
        help="offered load of the backlog stream (the queue must reach --backlog-queued)",
    )
    core.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each timed part (the mixed stream from one warm cell's copies, the "
        "placement passes from scratch); the best is reported, every run's figure beside it",
    )
    core.add_argument(
        "--hash",
        metavar="NAMES",
        help="instead of timing: the output hashes of light, backlog and/or mt "
        "(comma-separated) at their reference sizes, checked against the recorded ones "
        "(exit 1 when one differs)",
    )
    core.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    core.set_defaults(handler=handle_core)
    pipe = targets.add_parser(
        "pipeline",
        help="end-to-end jobs/s and submit->assigned latency on the embedded stack",
        description="Start an embedded stack whose agents run the zero-work 'noop' generator; "
        "measure sustained submit->COMPLETED jobs/s, then submit->assigned latency "
        "at a fixed offered rate.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    pipe.add_argument("--jobs", type=int, default=2000, help="jobs of the throughput phase")
    pipe.add_argument("--rate", type=float, default=200.0, help="offered submissions/s")
    pipe.add_argument("--seconds", type=float, default=10.0, help="length of the latency phase")
    pipe.add_argument("--concurrency", type=int, default=32, help="concurrent HTTP clients")
    pipe.add_argument("--nodes", type=int, default=8)
    pipe.add_argument("--gpus-per-node", type=int, default=8)
    pipe.add_argument(
        "--nodes-per-agent",
        type=int,
        default=1,
        help="simulated nodes per agent process (1 = a process per node)",
    )
    pipe.add_argument(
        "--broker",
        default="kafka",
        help="kafka, tansu, or both in one run (kafka,tansu): one stack after the other",
    )
    pipe.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    pipe.set_defaults(handler=handle_pipeline)
    soak = targets.add_parser(
        "soak",
        help="a steady load for minutes: submit->assigned per minute as the log grows",
        description="Offer the embedded stack (noop generator) a steady rate of jobs for some "
        "minutes; print each minute's submit->assigned p50/p99/max beside the records the log "
        "holds, and how many jobs were never assigned.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    soak.add_argument("--rate", type=float, default=60.0, help="offered submissions/s")
    soak.add_argument("--minutes", type=float, default=8.0)
    soak.add_argument("--nodes", type=int, default=8)
    soak.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    soak.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    soak.set_defaults(handler=handle_soak)
    take = targets.add_parser(
        "takeover",
        help="time for a new scheduler instance to take a cell over from its shared snapshot",
        description="Build a cell's log (Ticks, heartbeats, jobs) on a broker, publish the "
        "cell's snapshot before the last --suffix records, then time a new instance from "
        "partition assigned to its first decision delivered (target <= 5 s).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    take.add_argument(
        "--records",
        type=int,
        default=100_000,
        help="records in the cell's log (1000000: the 1 M case)",
    )
    take.add_argument("--suffix", type=int, default=500, help="records after the snapshot")
    take.add_argument("--nodes", type=int, default=16)
    take.add_argument("--bootstrap", help="an existing broker (default: start an embedded one)")
    take.add_argument(
        "--shared-snapshots",
        metavar="LOCATION",
        help="s3://BUCKET/PREFIX or a directory (default: a temporary directory)",
    )
    take.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    take.set_defaults(handler=handle_takeover)
    fetch = targets.add_parser(
        "fetch",
        help="the embedded broker's CPU under idle consumers, by fetch wait and partitions",
        description="Start the embedded broker; for each fetch wait and partition count, "
        "read empty partitions with --consumers request-path readers and report the "
        "broker's CPU (%% of one core) over --seconds.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    fetch.add_argument("--waits", default="3,10,30,100", help="fetch.wait.max.ms values (ms)")
    fetch.add_argument("--partitions", default="1,8", help="partitions each reader reads (1-8)")
    fetch.add_argument("--consumers", type=int, default=1, help="readers per case")
    fetch.add_argument("--seconds", type=float, default=8.0, help="measured time per case")
    fetch.add_argument("--settle", type=float, default=2.0, help="unmeasured time first")
    fetch.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    fetch.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    fetch.set_defaults(handler=handle_fetch)
    cluster = targets.add_parser(
        "cluster",
        help="what GET /v1/cluster costs the API at fleet scale",
        description="Fill a read model with --cells x --nodes x --gpus-per-node GPUs, each "
        "running a job of one of --tenants tenants, serve the API on a loopback port and "
        "time one tenant's calls: the first, repeats, repeats answered 304 with the ETag, "
        "and calls after a cell's new status (medians of --calls each).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cluster.add_argument("--cells", type=int, default=10)
    cluster.add_argument("--nodes", type=int, default=125, help="nodes per cell")
    cluster.add_argument("--gpus-per-node", type=int, default=8)
    cluster.add_argument("--tenants", type=int, default=2000)
    cluster.add_argument("--calls", type=int, default=20, help="calls of each kind")
    cluster.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    cluster.set_defaults(handler=handle_cluster)
    snap = targets.add_parser(
        "snapshot",
        help="what pickling a processor's state for a snapshot costs",
        description="CPU milliseconds (best of --repeat) to pickle, and to pickle and "
        "unpickle, an admission state holding --decisions decisions and a scheduler cell "
        "on --nodes nodes after --events events of bench core's light stream: the CPU a "
        "snapshot costs (a forked child's by default, the turn's with --snapshot-pickling "
        "inline), which the snapshot budget spaces them by.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    snap.add_argument("--decisions", type=int, default=60_000, help="admission decisions held")
    snap.add_argument("--nodes", type=int, default=2000, help="the cell's nodes")
    snap.add_argument("--events", type=int, default=40_000, help="events the cell folds first")
    snap.add_argument("--repeat", type=int, default=7)
    snap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    snap.set_defaults(handler=handle_snapshot)


def handle_hash(args: argparse.Namespace) -> int:
    """``bench core --hash``: did the core's outputs change? (a guard for speed work)"""
    from framespool.bench.core import REFERENCE_HASHES, output_hash

    names = [n.strip() for n in args.hash.split(",") if n.strip()]
    unknown = [n for n in names if n not in REFERENCE_HASHES]
    if unknown or not names:
        raise CommandError(f"--hash={args.hash!r}: give {', '.join(REFERENCE_HASHES)}")
    hashes = {}
    for name in names:
        hashes[name] = output_hash(name)
        same = hashes[name] == REFERENCE_HASHES[name]
        print(
            f"  {name:<8} {hashes[name]}  {'= reference' if same else 'DIFFERS from'} "
            f"{'' if same else REFERENCE_HASHES[name]}".rstrip()
        )
    write_json(args.json, {"hashes": hashes, "reference": REFERENCE_HASHES})
    return 0 if all(hashes[n] == REFERENCE_HASHES[n] for n in names) else 1


def handle_core(args: argparse.Namespace) -> int:
    if args.hash:
        return handle_hash(args)
    from framespool.bench.core import bench_core

    if args.backlog_events is None:
        args.backlog_events = max(1, args.events // 2)
    if args.backlog_queued is None:
        args.backlog_queued = max(1, round(args.nodes * 2.5))
    if args.backlog_tenants is None:
        args.backlog_tenants = args.nodes
    for flag, value in {
        "--nodes": args.nodes,
        "--gpus-per-node": args.gpus_per_node,
        "--queued": args.queued,
        "--events": args.events,
        "--load": args.load,
        "--backlog-events": args.backlog_events,
        "--backlog-queued": args.backlog_queued,
        "--backlog-tenants": args.backlog_tenants,
        "--backlog-load": args.backlog_load,
        "--repeat": args.repeat,
    }.items():
        if not 0 < value < math.inf:  # NaN too
            raise CommandError(f"{flag}={value} must be positive")
    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    unknown = [s for s in scenarios if s not in ("light", "backlog")]
    if unknown or not scenarios or len(set(scenarios)) != len(scenarios):
        raise CommandError(f"--scenarios={args.scenarios!r}: give light and/or backlog, each once")
    try:
        result = bench_core(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            queued=args.queued,
            events=args.events,
            warmup=args.warmup,
            rounds=args.rounds,
            seed=args.seed,
            load=args.load,
            scenarios=scenarios,
            backlog_events=args.backlog_events,
            backlog_queued=args.backlog_queued,
            backlog_tenants=args.backlog_tenants,
            backlog_load=args.backlog_load,
            repeat=args.repeat,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    print(f"core on {args.nodes:,} nodes x {args.gpus_per_node} GPUs")
    for name, scenario in result["scenarios"].items():
        _print_scenario(name, scenario)
    if len(result["scenarios"]) > 1:
        print(_side_by_side(result["scenarios"]))
        if result.get("backlog_vs_light") is not None:
            print(f"  backlog events/s = {result['backlog_vs_light']:.2f} x light (target >= 0.5)")
    print(f"  wall {result['wall_s']} s")
    return write_json(args.json, result)


def _side_by_side(scenarios: dict[str, dict[str, Any]]) -> str:
    names = list(scenarios)
    rows = [
        ("events/s", lambda s: f"{s['events_per_s'] or 0:,}"),
        ("placements/s", lambda s: f"{s['placements_per_s'] or 0:,}"),
        ("decision p50 ms", lambda s: str(s["decision_latency_ms"]["p50"])),
        ("decision p99 ms", lambda s: str(s["decision_latency_ms"]["p99"])),
        ("queued at timing", lambda s: f"{s['placement']['queued']:,}"),
    ]
    lines = ["  " + f"{'':<18}" + "".join(f"{n:>14}" for n in names)]
    for label, cell in rows:
        lines.append("  " + f"{label:<18}" + "".join(f"{cell(scenarios[n]):>14}" for n in names))
    return "\n".join(lines)


def _print_scenario(name: str, result: dict[str, Any]) -> None:
    mixed, placement = result["mixed"], result["placement"]
    latency = result["decision_latency_ms"]
    ok = result["meets_targets"]
    print(f" {name}:")
    print(
        f"  events/s      {result['events_per_s']:>10,}  (target {result['targets']['events_per_s']:,}:"
        f" {'met' if ok['events_per_s'] else 'MISSED'}) over {mixed['events']:,} mixed events"
        f" {mixed['event_mix']}"
    )
    print(
        f"  placements/s  {result['placements_per_s']:>10,}  (target "
        f"{result['targets']['placements_per_s']:,}: {'met' if ok['placements_per_s'] else 'MISSED'})"
        f"; fill {placement['fill']['placements']:,} in {placement['fill']['passes']} passes "
        f"({placement['fill']['placements_per_s']:,}/s), after completions "
        f"{placement['after_completions']['placements']:,} "
        f"({placement['after_completions']['placements_per_s'] or 0:,}/s), "
        f"{placement['queued']:,} queued at start"
    )
    print(
        f"  decision latency p50 {latency['p50']} ms, p99 {latency['p99']} ms, max "
        f"{latency['max']} ms over {latency['n']:,} deciding applies"
    )
    runs, passes = mixed["runs_events_per_s"], placement["runs_placements_per_s"]
    if len(runs) > 1:
        print(
            f"  best of {len(runs)} runs: events/s {', '.join(f'{r:,}' for r in runs)}; "
            f"placements/s {', '.join(f'{p:,}' for p in passes)}"
        )
    print(f"  replay matches recording: {mixed['replay_matches']}; wall {result['wall_s']} s")


def handle_pipeline(args: argparse.Namespace) -> int:
    from framespool.bench.pipeline import bench_pipeline

    for flag, value in {
        "--jobs": args.jobs,
        "--rate": args.rate,
        "--seconds": args.seconds,
        "--concurrency": args.concurrency,
        "--nodes": args.nodes,
        "--nodes-per-agent": args.nodes_per_agent,
    }.items():
        if not 0 < value < math.inf:  # NaN too
            raise CommandError(f"{flag}={value} must be positive")
    brokers = [b.strip() for b in str(args.broker).split(",") if b.strip()]
    if not brokers or any(b not in ("kafka", "tansu") for b in brokers):
        raise CommandError(f"--broker={args.broker!r}: kafka, tansu or kafka,tansu")
    results = {}
    for broker in brokers:
        result = bench_pipeline(
            jobs=args.jobs,
            rate=args.rate,
            seconds=args.seconds,
            concurrency=args.concurrency,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            nodes_per_agent=args.nodes_per_agent,
            broker=broker,
        ).as_dict()
        result["broker"] = broker
        _print_pipeline(result, args.gpus_per_node)
        results[broker] = result
    return write_json(args.json, results[brokers[0]] if len(brokers) == 1 else results)


def _print_pipeline(result: dict, gpus_per_node: int) -> None:
    lat, done = result["submit_to_assigned_ms"], result["submit_to_completed_ms"]
    print(
        f"pipeline on the embedded stack ({result['broker']}), {result['nodes']} nodes x "
        f"{gpus_per_node} GPUs in {result['agent_processes']} agent process(es), noop generator"
    )
    print(
        f"  jobs/s        {result['jobs_per_s']:>8}  ({result['completed']}/{result['jobs']} "
        f"completed, {result['failed']} failed; target 500)"
    )
    print(
        f"  submit->assigned  p50 {lat['p50']} ms  p99 {lat['p99']} ms  max {lat['max']} ms "
        f"at {result['offered_rate']:g}/s offered ({result['achieved_submit_rate']}/s "
        f"achieved; target p99 <= 50 ms)"
    )
    print(f"  submit->completed p50 {done['p50']} ms  p99 {done['p99']} ms")
    print("  submit->assigned by hop (p50 / p99 ms):")
    for hop, q in (result.get("hops_ms") or {}).items():
        print(f"    {hop:<10} {q['p50']:>8} {q['p99']:>8}")
    for phase, key in (("idle", "cpu_idle_pct"), ("latency phase", "cpu_latency_pct")):
        if result.get(key):
            row = ", ".join(f"{k} {v}" for k, v in result[key].items())
            print(f"  CPU % of one core, {phase}: {row}")
    if result.get("cpu_ms_per_job"):
        row = ", ".join(f"{k} {v}" for k, v in result["cpu_ms_per_job"].items())
        print(f"  CPU ms per job, throughput phase: {row}")


def handle_soak(args: argparse.Namespace) -> int:
    from framespool.bench.soak import bench_soak

    for flag, value in {
        "--rate": args.rate,
        "--minutes": args.minutes,
        "--nodes": args.nodes,
    }.items():
        if not 0 < value < math.inf:  # NaN too
            raise CommandError(f"{flag}={value} must be positive")
    r = bench_soak(
        rate=args.rate,
        minutes=args.minutes,
        nodes=args.nodes,
        broker=args.broker,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(
        f"soak on the embedded stack ({r['broker']}), {r['rate']:g} jobs/s for {r['minutes']} min"
    )
    print("  minute  assigned/submitted   p50 ms   p99 ms   max ms   log records")
    for row in r["per_minute"]:
        q = row["submit_to_assigned_ms"]
        print(
            f"  {row['minute']:>6}  {row['assigned']:>8}/{row['submitted']:<9} "
            f"{q['p50']:>8} {q['p99']:>8} {q['max']:>8}   {row['log_records']:>11,}"
        )
    print("  p99 ms by hop (framespool bench pipeline's hops)")
    print("  minute  " + "".join(f"{hop:>11}" for hop in r["hops"]))
    for row in r["per_minute"]:
        hops = row["hops_ms"]
        cells = "".join(f"{hops.get(hop, {}).get('p99', '-'):>11}" for hop in r["hops"])
        print(f"  {row['minute']:>6}  {cells}")
    print(
        f"  last minute / first: p50 {r['last_over_first_p50']}x, p99 "
        f"{r['last_over_first_p99']}x (target within 3x); never assigned: {r['unassigned']}; "
        f"log {r['log_records']:,} records"
    )
    return write_json(args.json, r)


def handle_takeover(args: argparse.Namespace) -> int:
    from framespool.bench.takeover import bench_takeover
    from framespool.commands import end_progress, progress_bar

    if args.suffix < 1 or args.records <= args.suffix + args.nodes:
        raise CommandError(
            f"--records={args.records} must exceed --suffix={args.suffix} + --nodes={args.nodes}"
        )
    bar = progress_bar(True)
    try:
        r = bench_takeover(
            records=args.records,
            suffix=args.suffix,
            nodes=args.nodes,
            bootstrap=args.bootstrap,
            shared_location=args.shared_snapshots,
            progress=bar,
        )
    finally:
        end_progress(bar)
    print(
        f"takeover of a cell with {r['records']:,} records ({r['jobs']:,} jobs, {r['nodes']} "
        f"nodes), snapshot at offset {r['snapshot_offset']:,} ({r['snapshot_bytes']:,} bytes, "
        f"{r['shared_store']})"
    )
    print(
        f"  assigned -> first decision  {r['takeover_s']} s  (target {r['target_s']} s: "
        f"{'met' if r['meets_target'] else 'MISSED'}); claim+load {r['load_s']} s, then "
        f"{r['first_decision_after_load_s']} s to fold and deliver"
    )
    print(
        f"  suffix decisions match an uninterrupted run: {r['decisions_match']} "
        f"({r['decisions']:,} outputs); folding the whole log instead: {r['replay_s']} s of CPU"
    )
    return write_json(args.json, r)


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise CommandError(f"{flag}={text!r}: expected comma-separated whole numbers >= 0")
    return values


def handle_fetch(args: argparse.Namespace) -> int:
    from framespool.bench.fetch import TOPIC, bench_fetch

    waits, parts = _ints("--waits", args.waits), _ints("--partitions", args.partitions)
    if min(parts) < 1 or max(parts) > TOPIC.partitions:
        raise CommandError(f"--partitions={args.partitions!r}: each 1..{TOPIC.partitions}")
    if args.consumers < 1 or args.seconds <= 0 or args.settle < 0:
        raise CommandError("--consumers must be >= 1, --seconds > 0 and --settle >= 0")
    r = bench_fetch(waits, parts, args.consumers, args.settle, args.seconds, args.broker)
    print(f"{args.broker} broker CPU, % of one core, over {r['seconds']:g} s per case")
    print(f"  no consumer                         {r['broker_idle_cpu_pct']}")
    for c in r["cases"]:
        print(
            f"  wait {c['wait_ms']:>4} ms, {c['partitions']} partition(s), "
            f"{c['consumers']} consumer(s)  {c['broker_cpu_pct']}"
        )
    return write_json(args.json, r)


def handle_cluster(args: argparse.Namespace) -> int:
    from framespool.bench.cluster import bench_cluster

    if min(args.cells, args.nodes, args.gpus_per_node, args.tenants, args.calls) < 1:
        raise CommandError(
            "--cells, --nodes, --gpus-per-node, --tenants and --calls must each be >= 1"
        )
    r = bench_cluster(args.cells, args.nodes, args.gpus_per_node, args.tenants, args.calls)
    print(f"GET /v1/cluster, {r['gpus']:,} GPUs ({r['bytes']:,} bytes), one tenant")
    print(f"  first call (owners read)     {r['first_ms']} ms")
    print(f"  repeat, same generation      {r['repeat_ms']} ms (median of {r['calls']})")
    print(f"  with its ETag back (304)     {r['not_modified_ms']} ms")
    print(f"  after a cell's new status    {r['new_generation_ms']} ms")
    return write_json(args.json, r)


def handle_snapshot(args: argparse.Namespace) -> int:
    from framespool.bench.snapshot import bench_snapshot

    if min(args.decisions, args.nodes, args.events, args.repeat) < 1:
        raise CommandError("--decisions, --nodes, --events and --repeat must each be >= 1")
    r = bench_snapshot(args.decisions, args.nodes, args.events, args.repeat)
    a, c = r["admission"], r["cell"]
    print(f"snapshot cost, CPU ms, best of {r['repeat']}")
    print(
        f"  admission, {a['decisions']:,} decisions: pickle {a['pickle_ms']} ms, "
        f"round trip {a['round_trip_ms']} ms, {a['bytes']:,} bytes"
    )
    print(
        f"  cell, {c['nodes']:,} nodes, {c['jobs']:,} jobs: pickle {c['pickle_ms']} ms, "
        f"round trip {c['round_trip_ms']} ms, {c['bytes']:,} bytes"
    )
    return write_json(args.json, r)


def write_json(target: str | None, result: dict) -> int:
    """``--json FILE``: the results as JSON, beside what was printed."""
    if target:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0
