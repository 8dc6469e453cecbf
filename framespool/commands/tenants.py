"""``framespool tenants list|add|rotate-key --data-dir DIR``: tenants and keys of a stack.

They change the secrets file of a stack's data dir (``stack-secrets.json``,
under its lock: the running API writes it too), whether the stack runs or not;
the running API notices the new file within a second and reloads it
(``framespool.bootstrap.watch_secrets``), so no process restarts. A new key is
printed once and kept in ``tenant-keys.json`` (0600) beside it.

A tenant added here has its tiers, models, API limits and users at once; the
cells schedule it by the deployment's default tenant policy (weight 1, the
``scheduler.default_tenant`` quotas) until it has a ``[[tenants]]`` entry in the
deployment file, which the processors read when they start.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from framespool.commands import CommandError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tenants",
        help="list tenants, add one, rotate a key (no restart needed)",
        description="Tenants and API keys of a stack's data dir. Changes take effect in "
        "the running API within a second; keys are shown once and kept in "
        "<data-dir>/tenant-keys.json (0600).",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = sub.add_parser("list", help="tenants, their tiers, users and key ids")
    add = sub.add_parser("add", help="a new tenant, with one key per user")
    add.add_argument("name")
    add.add_argument(
        "--tiers",
        required=True,
        help="comma-separated tiers it may submit to (e.g. paid,batch,free)",
    )
    add.add_argument("--default-tier", help="the tier of a job that names none (first of --tiers)")
    add.add_argument(
        "--user",
        action="append",
        dest="users",
        default=[],
        help="a user with a key of its own (repeat; default: one user, dev)",
    )
    add.add_argument("--models", help="comma-separated models it may run (default: every one)")
    add.add_argument("--rate-per-s", type=float, help="its API requests/s (default: its tier's)")
    add.add_argument("--burst", type=int, help="requests at once (default: its tier's)")
    add.add_argument("--queue-cap", type=int, help="jobs waiting at once (default: its tier's)")
    rotate = sub.add_parser(
        "rotate-key", help="a new key for a user; its old keys stop working at once"
    )
    rotate.add_argument("name")
    rotate.add_argument("--user", help="whose key (needed when the tenant has several users)")
    for q in (listing, add, rotate):
        q.add_argument("--data-dir", default=".framespool", type=Path)
        q.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from framespool import stack_secrets

    path = Path(args.data_dir) / stack_secrets.SECRETS_FILE
    if not path.is_file():
        raise CommandError(
            f"no {path}: start the stack once with 'framespool up --data-dir {args.data_dir}'"
        )
    if args.action == "list":
        return show(args, listing(json.loads(path.read_text())))
    if args.action == "add":
        tenant = entry(args)
        change = lambda doc: stack_secrets.add_tenant(doc, tenant)
    else:
        change = lambda doc: [stack_secrets.rotate_key(doc, args.name, args.user)]
    try:
        shown = stack_secrets.update(path, change)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    keys_path = Path(args.data_dir) / stack_secrets.KEYS_FILE
    stack_secrets.record_issued(keys_path, shown, replaced=args.action == "rotate-key")
    if args.json:
        print(json.dumps({"keys": shown}, indent=2))
        return 0
    verb = "added" if args.action == "add" else "new key for"
    for s in shown:
        print(
            f"{verb} {s['name']}/{s['user']}: key {s['api_key']}  (shown once; also in {keys_path})"
        )
    if args.action == "add":
        print(
            f"  scheduled by the default tenant policy until {args.name!r} has a [[tenants]] "
            "entry in the deployment file (read when the processors start)"
        )
    return 0


def entry(args: argparse.Namespace) -> Any:
    """The ``[[tenants]]`` entry the options describe, checked against the stack's tiers."""
    from framespool.configfile import ConfigError, build
    from framespool.processors.config_file import TenantEntry, cell_config, read_config_file

    table: dict[str, Any] = {
        "name": args.name,
        "tiers": [t.strip() for t in args.tiers.split(",") if t.strip()],
        "users": [{"name": u} for u in args.users],
    }
    for name in ("default_tier", "rate_per_s", "burst", "queue_cap"):
        if getattr(args, name) is not None:
            table[name] = getattr(args, name)
    if args.models:
        table["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        tenant = build(TenantEntry, table, "tenant")
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    deployment = Path(args.data_dir) / "processors-config.json"
    if deployment.is_file():
        known = [t.name for t in cell_config(read_config_file(deployment)).tiers]
        unknown = [t for t in tenant.tiers if t not in known]
        if unknown:
            raise CommandError(f"--tiers: {unknown} not among the stack's tiers {known}")
    return tenant


def listing(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tenant with its policy and its users' key ids (never a secret)."""
    auth = doc.get("auth", {})
    policies = auth.get("tenants", {})
    keys = auth.get("keys", [])
    names = list(policies) + [k["tenant"] for k in keys if k["tenant"] not in policies]
    out = []
    for name in dict.fromkeys(names):
        policy = {k: v for k, v in policies.get(name, {}).items() if k != "webhook_secret"}
        users = [
            {"user": k.get("user", ""), "key_id": k["id"], "disabled": k.get("disabled", False)}
            for k in keys
            if k["tenant"] == name and "id" in k
        ]
        out.append({"name": name, **policy, "users": users})
    return out


def show(args: argparse.Namespace, tenants: list[dict[str, Any]]) -> int:
    if args.json:
        print(json.dumps({"tenants": tenants}, indent=2))
        return 0
    for t in tenants:
        tiers = ",".join(t.get("tiers", [])) or "free"
        users = ", ".join(f"{u['user'] or '-'} ({u['key_id']})" for u in t["users"]) or "no keys"
        extra = "".join(
            f"  {k} {t[k]}" for k in ("models", "rate_per_s", "burst", "queue_cap") if k in t
        )
        print(f"{t['name']:<12} tiers {tiers:<28} default {t.get('default_tier', '-')}{extra}")
        print(f"{'':<12} users {users}")
    return 0
