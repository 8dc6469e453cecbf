"""``framespool simulate``: drive the real scheduling core with a virtual clock."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from framespool.commands import CommandError, end_progress, progress_bar


def register(subparsers: Any) -> None:
    from framespool.processors.sim.workload import SYNTHETIC

    synthetic_names = tuple(SYNTHETIC)
    p = subparsers.add_parser(
        "simulate",
        help="simulate a workload on a virtual fleet with the real scheduler core",
        description="Run the scheduler core on a simulated fleet (virtual clock, simulated "
        "agents) and report utilization, waits, fairness and invariant checks. "
        "Exit status 1 when an invariant was violated.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_argument_group("workload (one of)")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument(
        "--trace",
        metavar="FILE.csv",
        help="CSV with header submit_s,tenant,tier,gpus,duration_s (optional: "
        "gpus_per_node, estimate_s, preemptible, checkpoint_s, weight, model, "
        "model_version, fail_prob)",
    )
    one.add_argument(
        "--synthetic",
        metavar="NAME",
        choices=synthetic_names,
        help="built-in workload: " + ", ".join(synthetic_names),
    )
    src.add_argument("--jobs", type=int, default=10_000, help="jobs in a synthetic workload")
    src.add_argument(
        "--load",
        type=float,
        default=None,
        help="offered load of a synthetic workload, as a fraction of the GPUs "
        "(default: 0.9; 1.3 for multitenant and genai, 3.2 for shapes)",
    )
    src.add_argument(
        "--jobs-per-day",
        type=int,
        default=0,
        metavar="N",
        help="multitenant only: arrivals at N jobs a day (N / 86,400 per second, diurnal "
        "period one day; tenant mix, tiers, shapes and swing kept) and every run time "
        "scaled by one factor so the offered load stays --load: the mean job is "
        "load x GPUs x 86,400 / N GPU-s (276 at 5 M a day on 16,000 GPUs, load 1.0), "
        "run times clipped to 1 s - 4 h. --jobs still counts the jobs generated "
        "(--jobs N is one day); 0 = rate from --load and the mix's own run times",
    )
    src.add_argument("--seed", type=int, default=1)
    fleet = p.add_argument_group("fleet")
    fleet.add_argument("--nodes", type=int, default=250)
    fleet.add_argument("--gpus-per-node", type=int, default=8)
    fleet.add_argument("--nodes-per-rail", type=int, default=32)
    fleet.add_argument("--gpu-type", default="H100")
    fleet.add_argument(
        "--cells",
        type=int,
        default=1,
        help="cells the fleet is split into (--nodes in all), their jobs routed as --routing says",
    )
    fleet.add_argument(
        "--routing",
        choices=("admission", "hash"),
        default="admission",
        help="with --cells: 'admission' routes each job at its submit time with the real "
        "admission fold on the cells' offers (lowest predicted wait, tenant stickiness, "
        "quota homes), the cells advancing together in one process: production's "
        "routing, costing the sum of the cells' folds; 'hash' routes by the rendezvous "
        "hash of the job id (admission's rule with no offers), blind to load, so the "
        "cells share nothing and fold in parallel processes: for top-scale runs",
    )
    fleet.add_argument(
        "--node-failures",
        type=float,
        default=None,
        metavar="RATE",
        help="node failures per node-hour (default: 0, or the workload's own rate for 'failures')",
    )
    fleet.add_argument(
        "--repair-s", type=float, default=900.0, help="seconds until a failed node re-registers"
    )
    fleet.add_argument(
        "--cold-start-s",
        type=float,
        default=20.0,
        help="model load time on a GPU whose warm model differs",
    )
    sched = p.add_argument_group("scheduler")
    sched.add_argument(
        "--policy",
        default="framespool",
        help="comma-separated: framespool, fifo, backfill (several = comparison)",
    )
    sched.add_argument(
        "--tiers",
        metavar="FILE.json",
        help="JSON list of tiers: name, weight, rank, sla_wait_s, may_preempt, "
        "max_predicted_wait_s, reserved_gpus",
    )
    sched.add_argument("--tick-s", type=float, default=1.0, help="virtual seconds between Ticks")
    sched.add_argument(
        "--heartbeat-s",
        type=float,
        default=None,
        help="heartbeat period; leases are 3.5x (node) and 2.5x (run report) "
        "(default: 30, or 10 with --production-cadences)",
    )
    sched.add_argument(
        "--production-cadences",
        action="store_true",
        help="fold what a production cell folds: 1 s Ticks, a heartbeat per node every "
        "10 s (unless --heartbeat-s), CellStatus every 5 s and wait estimates every 30 s",
    )
    sched.add_argument(
        "--estimates",
        action="store_true",
        help="let the cell publish CellStatus and wait estimates (slower)",
    )
    run = p.add_argument_group("run")
    run.add_argument(
        "--max-sim-s",
        type=float,
        default=0.0,
        help="hard stop after this much virtual time (0 = run until drained)",
    )
    run.add_argument(
        "--stall-s",
        type=float,
        default=86_400.0,
        help="stop when no run existed and nothing started for this long",
    )
    run.add_argument("--out", default="sim-out", metavar="DIR", help="output directory")
    run.add_argument("--no-plot", action="store_true", help="skip report.png")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=handle)


def _check(args: argparse.Namespace) -> None:
    from framespool.processors.sim.engine import PRODUCTION_HEARTBEAT_S, PRODUCTION_TICK_S

    if args.production_cadences:
        args.tick_s = PRODUCTION_TICK_S
        args.estimates = True
        if args.heartbeat_s is None:
            args.heartbeat_s = PRODUCTION_HEARTBEAT_S
    if args.heartbeat_s is None:
        args.heartbeat_s = 30.0
    positive = {
        "--cells": args.cells,
        "--nodes": args.nodes,
        "--gpus-per-node": args.gpus_per_node,
        "--nodes-per-rail": args.nodes_per_rail,
        "--tick-s": args.tick_s,
        "--heartbeat-s": args.heartbeat_s,
        "--jobs": args.jobs,
        "--load": 1.0 if args.load is None else args.load,
        "--repair-s": args.repair_s,
    }
    for flag, value in positive.items():
        if not 0 < value < math.inf:  # NaN too
            raise CommandError(f"{flag}={value} must be positive")
    if args.jobs_per_day and not args.synthetic:
        raise CommandError("--jobs-per-day is for --synthetic multitenant, not --trace")
    if args.nodes % args.cells:
        raise CommandError(
            f"--nodes={args.nodes} must divide evenly into --cells={args.cells} cells"
        )
    for flag, value in {
        "--cold-start-s": args.cold_start_s,
        "--max-sim-s": args.max_sim_s,
        "--jobs-per-day": args.jobs_per_day,
        "--node-failures": args.node_failures or 0.0,
    }.items():
        if not 0 <= value < math.inf:  # NaN too
            raise CommandError(f"{flag}={value} must not be negative")
    if args.tick_s > args.heartbeat_s:
        raise CommandError(
            f"--tick-s={args.tick_s} must not exceed --heartbeat-s="
            f"{args.heartbeat_s}: leases are checked on Ticks"
        )


def handle(args: argparse.Namespace) -> int:
    from framespool.processors import sim
    from framespool.processors.core import CellConfig

    _check(args)
    try:
        policies = sim.parse_policies(args.policy)
        base = CellConfig(tiers=sim.load_tiers(args.tiers)) if args.tiers else CellConfig()
        opts = sim.SimOptions(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            nodes_per_rail=args.nodes_per_rail,
            gpu_type=args.gpu_type,
            tick_s=args.tick_s,
            heartbeat_s=args.heartbeat_s,
            cold_start_s=args.cold_start_s,
            repair_s=args.repair_s,
            estimates=args.estimates,
            seed=args.seed,
            max_sim_s=args.max_sim_s,
            stall_s=args.stall_s,
        )
        if args.trace:
            workload = sim.read_trace(args.trace)
        else:
            workload = sim.synthetic(
                args.synthetic,
                args.jobs,
                args.seed,
                opts.capacity_gpus,
                args.load,
                jobs_per_day=args.jobs_per_day,
            )
    except (ValueError, sim.TraceError) as exc:
        raise CommandError(str(exc)) from None
    opts = sim.with_workload_defaults(opts, workload, args.node_failures)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cells > 1:
        return _fleet(args, workload, policies, opts, base, out)
    bar = progress_bar(not args.quiet)
    try:
        summaries = sim.simulate(
            workload, policies, opts, base, out, make_plot=not args.no_plot, progress=bar
        )
    finally:
        end_progress(bar)
    from framespool.processors.sim.quality import format_tables

    for summary in summaries:
        print(_headline(summary))
    for summary in summaries:
        print()
        print(format_tables(summary))
    if len(summaries) > 1:
        print()
        print(sim.comparison_table(summaries))
        print(
            f"\nwrote {out}/<policy>/ for {', '.join(s['policy'] for s in summaries)} "
            f"and {out}/comparison.txt"
        )
    else:
        print(
            f"wrote {out}/summary.json, jobs.csv, runs.csv"
            + ("" if args.no_plot else ", report.png")
        )
    violations = sum(s["invariant_violations"] for s in summaries)
    if violations:
        for summary in summaries:
            for example in summary["violation_examples"][:5]:
                print(f"  violation ({summary['policy']}): {example}")
    return 1 if violations else 0


def _fleet(args: argparse.Namespace, workload, policies, opts, base, out: Path) -> int:
    from framespool.processors.sim.cells import simulate_cells

    if len(policies) != 1:
        raise CommandError("--cells folds one policy; give a single --policy")
    bar = progress_bar(not args.quiet)
    try:
        summary = simulate_cells(
            workload, policies[0], opts, base, out, args.cells, routing=args.routing, progress=bar
        )
    finally:
        end_progress(bar)
    fmt = lambda v: "-" if v is None else f"{v:,.0f}"
    print(
        f"fleet: {summary['cells']} cells x {summary['cluster']['nodes_per_cell']} nodes, "
        f"routing {summary['routing']}, in {summary['processes']} processes; "
        f"{summary['jobs_submitted']:,} jobs "
        f"({summary['jobs_completed']:,} completed, {summary['jobs_unfinished']:,} unfinished) "
        f"in {summary['virtual_s'] / 3600:.2f} h virtual; utilization "
        f"{summary['gpu_utilization']:.3f}; violations {summary['invariant_violations']}; "
        f"{summary['events']:,} events in {summary['wall_s']:.1f} s wall "
        f"({summary['events_per_s'] or 0:,} events/s)"
    )
    headroom = summary["headroom"] or {"min": 0, "median": 0, "max": 0}
    print(
        "  headroom min / median / max over the cells (virtual_s / core_s): "
        + " / ".join(f"{headroom[k] or 0:,.0f}x" for k in ("min", "median", "max"))
    )
    decided = summary.get("admission")
    if decided is not None:
        print(
            f"  admission: {decided['admitted']:,} admitted ("
            + ", ".join(f"{c} {n:,}" for c, n in decided["admitted_per_cell"].items())
            + f"), {decided['rerouted']:,} rerouted, {decided['rejected_no_cell_can_run']:,} "
            f"rejected no_cell_can_run, {decided['refused_predicted_wait']:,} refused at the "
            f"edge, {decided['offers']:,} offers folded"
        )
    if args.max_sim_s > 0:
        print(
            f"  horizon {args.max_sim_s:,.0f} s: {summary['jobs_inside_horizon']:,} of "
            f"{summary['jobs_in_workload']:,} jobs submitted at or before it "
            f"({summary['jobs_past_horizon']:,} after it, never generated)"
        )
    for tier, wait in summary["wait_s_by_tier"].items():
        print(f"  wait {tier:<12} p50 {fmt(wait['p50'])} s  p99 {fmt(wait['p99'])} s")
    for name, cell in summary["per_cell"].items():
        print(
            f"  {name}: {cell['events']:,} events, {cell['events_per_s'] or 0:,} events/s, "
            f"headroom {cell['headroom'] or 0:,.0f}x, util {cell['gpu_utilization']:.3f}"
        )
    print(f"wrote {out}/summary.json, jobs.csv, runs.csv and {out}/cell-XX/")
    for example in summary["violation_examples"][:5]:
        print(f"  violation: {example}")
    return 1 if summary["invariant_violations"] else 0


def _headline(s: dict[str, Any]) -> str:
    wait = s["wait_s"]
    fmt = lambda v: "-" if v is None else f"{v:,.0f}"
    jain = s["jain_fairness"]
    return (
        f"{s['policy']}: {s['jobs_submitted']:,} jobs ({s['jobs_completed']:,} completed, "
        f"{s['jobs_failed']:,} failed, {s['jobs_rejected']:,} rejected, "
        f"{s['jobs_unfinished']:,} unfinished) in {s['makespan_s'] / 3600:.2f} h virtual; "
        f"utilization {s['gpu_utilization']:.3f} "
        f"(under backlog {json.dumps(s['utilization_under_backlog'])}); "
        f"wait p50/p99/max {fmt(wait['p50'])}/{fmt(wait['p99'])}/{fmt(wait['max'])} s; "
        f"jain {'-' if jain is None else f'{jain:.3f}'}; "
        f"violations {s['invariant_violations']}; {s['events']:,} events in "
        f"{s['wall_s']:.1f} s wall ({s['events_per_s'] or 0:,} events/s, headroom "
        f"{s['headroom'] or 0:,.0f}x real time) ({s['stop_reason']})"
    )
