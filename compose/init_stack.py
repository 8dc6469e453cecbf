"""One-shot setup of the Compose deployment: topics, bucket, shared settings.

    python compose/init_stack.py --bootstrap kafka:9092 --stack-dir /stack \
        --s3-endpoint http://minio:9000 --bucket framespool

1. create the catalogue's topics with their partition counts (Kafka runs with
   auto-creation off; ``create_topics`` is idempotent), retrying until the
   broker answers;
2. create the artifact bucket if it is missing (credentials from ``AWS_*``);
3. write ``<stack-dir>/stack-secrets.json`` (what ``framespool.services``
   reads: hashed tenant keys, the signing secret, the S3 settings) unless it
   exists, and the plain keys once to ``<stack-dir>/tenant-keys.json``, both
   readable by the owner only. Keys are never printed (logs are collected).

Exit status 0 when everything is in place, 1 when a step kept failing.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

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
                   help="comma-separated name:tier pairs for the first start")
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


def tenant_config(spec: str) -> tuple[dict, dict, list[dict]]:
    """(tenants policy, auth keys config, plain keys) for ``name:tier,...``."""
    from framespool.producers.auth import new_key, record_to_config

    tenants, records, plain = {}, [], []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, tier = item.partition(":")
        tier = tier or "free"
        tenants[name] = {"tiers": [tier, "free"] if tier != "free" else ["free"],
                         "default_tier": tier}
        token, record = new_key(name, "admin")
        records.append(record_to_config(record))
        plain.append({"tenant": name, "tier": tier, "api_key": token})
    return tenants, {"tenants": tenants, "keys": records}, plain


def write_private(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out, indent=2)
    os.replace(tmp, path)


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
    secrets_path = args.stack_dir / "stack-secrets.json"
    if secrets_path.exists():
        print(f"init: {secrets_path} exists; keeping its keys", file=sys.stderr)
        return 0
    _, auth, plain = tenant_config(args.tenants)
    s3 = {"bucket": args.bucket}
    if args.s3_endpoint:
        s3["endpoint_url"] = args.s3_endpoint
    write_private(secrets_path, {"auth": auth, "signing_secret": secrets.token_hex(32), "s3": s3})
    write_private(args.stack_dir / "tenant-keys.json", {"tenants": plain})
    print(f"init: wrote {secrets_path}; the tenants' API keys are in "
          f"{args.stack_dir / 'tenant-keys.json'} (read it once, then delete it)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
