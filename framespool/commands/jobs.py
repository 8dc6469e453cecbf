"""Client commands: ``submit``, ``status``, ``watch``, ``cancel``, ``jobs``, ``result``.

They talk to the API of a running stack: ``--url``/``--api-key``, or the
stack.json that ``framespool up`` wrote (``--data-dir``, first tenant unless
``--tenant``). Every command has ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from framespool.commands import CommandError
from framespool.schemas.states import JobState

NAMES = ("submit", "status", "watch", "cancel", "jobs", "result")


def connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="API base URL (default: from stack.json)")
    parser.add_argument("--api-key", help="API key (default: from stack.json)")
    parser.add_argument(
        "--tenant", help="which tenant of stack.json to act as (TENANT or TENANT/USER)"
    )
    parser.add_argument("--data-dir", default=".framespool", type=Path)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("submit", help="submit a generation job")
    p.add_argument("--prompt", required=True)
    p.add_argument("--model", help="default: the deployment's default model (GET /v1/models)")
    p.add_argument("--tier")
    p.add_argument("--gpus", type=int, help="default: the model's")
    p.add_argument("--estimate-s", type=float, help="run-time estimate (default: the model's)")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a generator parameter besides duration, fps, resolution and seed (repeat)",
    )
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--duration-s", type=float, default=2.0, help="video length")
    p.add_argument("--fps", type=int, default=8)
    p.add_argument("--resolution", default="160x90")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preemptible", action="store_true")
    p.add_argument(
        "--checkpoint-interval-s",
        type=float,
        help="checkpoint this often (a preemptible job must, to be preempted and resume)",
    )
    p.add_argument("--callback-url")
    p.add_argument("--idempotency-key")
    connection(p)
    p.set_defaults(handler=submit)
    for name, helptext in (
        ("status", "show a job"),
        ("watch", "follow a job's progress"),
        ("cancel", "cancel a queued or running job"),
        ("result", "print a signed URL of a completed job's video"),
    ):
        q = subparsers.add_parser(name, help=helptext)
        q.add_argument("job_id")
        connection(q)
        q.set_defaults(handler=globals()[name])
    q = subparsers.add_parser("jobs", help="list your jobs")
    q.add_argument("--state")
    q.add_argument("--limit", type=int, default=50)
    connection(q)
    q.set_defaults(handler=jobs)


def client_for(args: argparse.Namespace):
    from framespool.producers.client import Client

    url, key = args.url, args.api_key
    if not (url and key):
        path = args.data_dir / "stack.json"
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError:
            raise CommandError(
                f"no {path}: start the stack with 'framespool up' or pass --url and --api-key"
            ) from None
        tenants = info["tenants"]
        if args.tenant:
            name, _, user = args.tenant.partition("/")
            tenants = [
                t
                for t in tenants
                if t["name"] == name and (not user or t.get("user", "dev") == user)
            ]
            if not tenants:
                raise CommandError(f"tenant {args.tenant!r} is not in {path}")
        url = url or info["api_url"]
        key = key or tenants[0]["api_key"]
    return Client(url, key)


def call(args: argparse.Namespace, fn, *a: Any, **kw: Any) -> Any:
    from framespool.producers.client import ApiError

    try:
        return fn(*a, **kw)
    except ApiError as exc:
        where = f" (field {exc.field})" if exc.field else ""
        raise CommandError(f"{exc.message}{where} [HTTP {exc.status} {exc.code}]") from None
    except OSError as exc:
        raise CommandError(f"cannot reach the API: {exc}; is 'framespool up' running?") from None


def show(args: argparse.Namespace, data: Any, line: str) -> int:
    print(json.dumps(data, indent=2) if args.json else line)
    return 0


def submit(args: argparse.Namespace) -> int:
    client = client_for(args)
    params: dict[str, Any] = {
        "duration_s": args.duration_s,
        "fps": args.fps,
        "resolution": args.resolution,
        "seed": args.seed,
    }
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--param {item!r}: write KEY=VALUE")
        params[key] = value
    body: dict[str, Any] = {
        "prompt": args.prompt,
        "params": params,
        "preemptible": args.preemptible,
    }
    for field, value in (
        ("model", args.model),
        ("gpus", args.gpus),
        ("estimate_s", args.estimate_s),
        ("checkpoint_interval_s", args.checkpoint_interval_s),
        ("tier", args.tier),
        ("gpus_per_node", args.gpus_per_node),
        ("callback_url", args.callback_url),
    ):
        if value is not None:
            body[field] = value
    job = call(args, client.submit, idempotency_key=args.idempotency_key, **body)
    return show(args, job, f"{job['job_id']}  {job['state']}")


def status(args: argparse.Namespace) -> int:
    job = call(args, client_for(args).status, args.job_id)
    return show(args, job, status_line(job))


def status_line(job: dict[str, Any]) -> str:
    """One line: state and run, and while the job waits why (code and words), its
    position in its cell's order and its P50/P90 wait; else its progress."""
    line = f"{job['job_id']}  {job['state']}"
    if job.get("phase"):
        line += f" ({job['phase']})"
    if job["state"] in ("SUBMITTED", "QUEUED"):
        if job.get("position"):
            line += f"  position {job['position']}"
        if job.get("wait_p50_s") is not None and job.get("wait_p90_s") is not None:
            line += f"  wait P50 ~{job['wait_p50_s']:.0f}s, P90 ~{job['wait_p90_s']:.0f}s"
        if job.get("reason_code"):
            line += f"  [{job['reason_code']}]"
        return line + (f"  {job['reason']}" if job.get("reason") else "")
    line += f"  run {job.get('run', 0)}  progress {100 * (job.get('progress') or 0):.0f}%"
    return line + (f"  {job['reason']}" if job.get("reason") else "")


def watch(args: argparse.Namespace) -> int:
    from framespool.commands import end_progress, progress_bar

    client = client_for(args)
    bar = None if args.json else progress_bar(True)
    last: dict = {}
    for event in call(args, client.watch, args.job_id):
        last = event
        data = event.get("data", {})
        if args.json:
            print(json.dumps(event), flush=True)
        elif bar is not None and data.get("progress") is not None:
            bar(float(data["progress"]), str(data.get("state", "")))
        else:
            print(f"{event.get('event')}: {data.get('summary', data)}", flush=True)
    end_progress(bar)
    state = last.get("data", {}).get("state", "")
    if not args.json:
        print(f"{args.job_id} ended {state}")
    return 0 if state in (JobState.COMPLETED, "") else 1


def cancel(args: argparse.Namespace) -> int:
    job = call(args, client_for(args).cancel, args.job_id)
    return show(args, job, f"{args.job_id}  cancel requested")


def result(args: argparse.Namespace) -> int:
    res = call(args, client_for(args).result, args.job_id)
    return show(args, res, res.get("url", ""))


def jobs(args: argparse.Namespace) -> int:
    page = call(args, client_for(args).jobs, state=args.state, limit=args.limit)
    items = page.get("jobs", page) if isinstance(page, dict) else page
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    for job in items:
        print(
            f"{job['job_id']}  {job['state']:<10} {job.get('tier', ''):<11} "
            f"{(job.get('prompt') or '')[:40]}"
        )
    if not items:
        print("no jobs", file=sys.stderr)
    return 0
