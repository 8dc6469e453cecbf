"""One-shot setup of the Compose deployment: topics, bucket, shared settings.

    python compose/init_stack.py --bootstrap kafka:9092 --stack-dir /stack \
        --s3-endpoint http://minio:9000 --bucket framespool --config compose/framespool.toml

1. create the catalogue's topics with their partition counts (Kafka runs with
   auto-creation off; ``create_topics`` is idempotent), retrying until the
   broker answers;
2. create the artifact bucket if it is missing (credentials from ``AWS_*``);
3. write ``<stack-dir>/stack-secrets.json`` (what ``framespool.services``
   reads: hashed tenant keys, per-tenant webhook secrets, the server-only URL
   signing key, the S3 settings; built by ``framespool.stack_secrets``, the
   builder ``framespool up`` uses) for the deployment file's ``[[tenants]]``
   (``--config``; without it, ``--tenants``), and each user's API key and its
   tenant's webhook secret once to ``<stack-dir>/tenant-keys.json``, both
   readable by the owner only. On a later start the file is kept and brought up
   to the deployment's tenants (a new tenant or user gets a key; nothing is
   taken away). Keys are never printed (logs are collected).

Exit status 0 when everything is in place, 1 when a step kept failing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

from framespool.stack_secrets import build as build_secrets
from framespool.stack_secrets import reconcile, record_issued, update, write_private

T = TypeVar("T")
DEFAULT_TENANTS = "acme:enterprise,studio:paid,hobby:free"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python compose/init_stack.py", description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092"))
    p.add_argument("--stack-dir", type=Path, required=True)
    p.add_argument("--s3-endpoint", default=os.environ.get("AWS_ENDPOINT_URL"),
                   help="S3 API endpoint (MinIO); omit for AWS S3")
    p.add_argument("--bucket", default="framespool")
    p.add_argument("--tenants", default=DEFAULT_TENANTS,
                   help="comma-separated name:tier pairs, when --config has no [[tenants]]")
    p.add_argument("--config", type=Path,
                   help="the deployment file: its [[tenants]] get keys (framespool up's format)")
    p.add_argument("--timeout-s", type=float, default=120.0)
    return p.parse_args(argv)


def retry(what: str, action: Callable[[], T], timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    delay = 0.5
    while True:
        try:
            return action()
        except Exception as exc:   # the broker or S3 is still starting: anything may fail
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} kept failing for {timeout_s:.0f} s: {exc}") from exc
            print(f"init: {what} not ready ({type(exc).__name__}); retrying", file=sys.stderr)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def parse_tenants(spec: str) -> list[tuple[str, str]]:
    """``name:tier,...`` as (name, tier) pairs (tier ``free`` when omitted)."""
    pairs = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, tier = item.partition(":")
        pairs.append((name, tier or "free"))
    return pairs


def tenant_config(spec: str) -> tuple[dict, dict, list[dict]]:
    """(tenants policy, auth keys config, what to show each tenant once) for ``name:tier,...``."""
    doc, shown = build_secrets(parse_tenants(spec), user="admin")
    plain = [
        {"tenant": s["name"], "tier": s["tier"], "api_key": s["api_key"],
         "webhook_secret": s["webhook_secret"]}
        for s in shown
    ]
    return doc["auth"]["tenants"], doc["auth"], plain


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from framespool.agents.artifacts import S3Store
    from framespool.log import create_topics

    try:
        created = retry("creating topics", lambda: create_topics(args.bootstrap), args.timeout_s)
        print(f"init: topics ready ({len(created)} created)", file=sys.stderr)
        store = S3Store(args.bucket, endpoint_url=args.s3_endpoint)
        retry(f"creating bucket {args.bucket}", store.create_bucket, args.timeout_s)
        print(f"init: bucket {args.bucket} ready", file=sys.stderr)
    except RuntimeError as exc:
        print(f"init: {exc}", file=sys.stderr)
        return 1
    args.stack_dir.mkdir(parents=True, exist_ok=True)
    try:
        tenants = deployment_tenants(args)
    except ValueError as exc:  # ConfigError: names the file, the key and what was expected
        print(f"init: {exc}", file=sys.stderr)
        return 1
    secrets_path = args.stack_dir / "stack-secrets.json"
    keys_path = args.stack_dir / "tenant-keys.json"
    if secrets_path.exists():
        shown = update(secrets_path, lambda doc: reconcile(doc, tenants, user="admin"))
        if shown:
            record_issued(keys_path, shown)
        print(f"init: {secrets_path} exists; kept its keys, {len(shown)} new", file=sys.stderr)
        return 0
    s3 = {"bucket": args.bucket}
    if args.s3_endpoint:
        s3["endpoint_url"] = args.s3_endpoint
    doc, shown = build_secrets(tenants, user="admin", s3=s3)
    write_private(secrets_path, doc)
    write_private(keys_path, {"tenants": shown})
    print(f"init: wrote {secrets_path}; the tenants' API keys are in "
          f"{keys_path} (read it once, then delete it)", file=sys.stderr)
    return 0


def deployment_tenants(args: argparse.Namespace) -> list:
    """The deployment file's [[tenants]], else --tenants' name:tier pairs."""
    if args.config is not None:
        from framespool.processors.config_file import read_config_file, tenant_entries

        entries = tenant_entries(read_config_file(args.config))
        if entries:
            return list(entries)
    return parse_tenants(args.tenants)


if __name__ == "__main__":
    sys.exit(main())
