"""One-shot setup of the Compose deployment: topics, bucket, shared settings.

    python compose/init_stack.py --bootstrap kafka:9092 --stack-dir /stack \
        --s3-endpoint http://minio:9000 --bucket framespool --config compose/framespool.toml

1. create the catalogue's topics with their partition counts (Kafka runs with
   auto-creation off; ``create_topics`` is idempotent), retrying until the
   broker answers; then give each service its broker principal (a SCRAM-SHA-512
   credential with the password of its Docker secret, ``--secrets-dir``) and
   exactly the ACLs of :data:`PRINCIPALS` (the broker refuses everything else:
   ``allow.everyone.if.no.acl.found=false``). init itself logs in as the super
   user, ``admin`` (SASL/PLAIN, the broker's own principal);
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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import NamedTuple, TypeVar

from framespool.log.kafka.settings import ANONYMOUS_GROUP_PREFIX
from framespool.schemas import topics as catalogue
from framespool.stack_secrets import build as build_secrets
from framespool.stack_secrets import reconcile, record_issued, update, write_private

T = TypeVar("T")
DEFAULT_TENANTS = "acme:enterprise,studio:paid,hobby:free"

# ---------------------------------------------------------------------------
# Broker principals and ACLs
# ---------------------------------------------------------------------------
SUPER_USER = "admin"  # the broker's own principal (inter-broker, controller) and init's
ADMIN_MECHANISM = "PLAIN"  # static, in the broker's JAAS: works before any SCRAM exists
SERVICE_MECHANISM = "SCRAM-SHA-512"  # each service's, created by init
SCRAM_ITERATIONS = 8192


class Grant(NamedTuple):
    """What one process does on the broker: the topics it reads (READ) and writes
    (WRITE; an idempotent producer needs nothing more since KIP-679), the consumer
    groups it reads committed positions from and commits to (READ on the group),
    and the group-id prefixes of its anonymous consumers. No transactional ids:
    framespool uses none."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    group_prefixes: tuple[str, ...] = ()


def role_grant(role: str, node: str | None = None) -> Grant:
    """Least privilege per process, from the code's own constants:

    - admission folds commands (``ADMISSION_GROUP``) into the cells' scheduler
      partitions, job-events (``JobAdmitted``, rejections, its recorded config)
      and dead letters;
    - a scheduler folds its cells (``SCHEDULER_GROUP``) into assignments
      (``StartRun``..., a node's own state), job-events, commands (``CellOffer``
      to every admission partition, ``JobRerouted``) and dead letters;
    - the clock writes Ticks to the scheduler topic;
    - the API submits and cancels on commands, its projections read job-events
      and progress by manual assignment (anonymous groups) and dead-letter what
      they cannot decode;
    - an agent reads its assignments partition under its own group and writes
      registrations and heartbeats (scheduler), progress and dead letters.
    """
    t = catalogue
    if role == "admission":
        return Grant(
            (t.COMMANDS.name,),
            (t.SCHEDULER.name, t.JOB_EVENTS.name, t.DEAD_LETTER.name),
            (t.ADMISSION_GROUP,),
        )
    if role == "scheduler":
        return Grant(
            (t.SCHEDULER.name,),
            (t.ASSIGNMENTS.name, t.JOB_EVENTS.name, t.COMMANDS.name, t.DEAD_LETTER.name),
            (t.SCHEDULER_GROUP,),
        )
    if role == "clock":
        return Grant((), (t.SCHEDULER.name,))
    if role == "api":
        return Grant(
            (t.JOB_EVENTS.name, t.PROGRESS.name),
            (t.COMMANDS.name, t.DEAD_LETTER.name),
            group_prefixes=(ANONYMOUS_GROUP_PREFIX,),
        )
    if role == "agent" and node:
        return Grant(
            (t.ASSIGNMENTS.name,),
            (t.SCHEDULER.name, t.PROGRESS.name, t.DEAD_LETTER.name),
            (t.agent_group(node),),
        )
    raise ValueError(f"no grant for role {role!r} (node {node!r})")


# The Compose services with a broker principal: each its own, named as the service,
# with its own password (the Docker secret kafka-<service>): (role, node).
PRINCIPALS: dict[str, tuple[str, str | None]] = {
    "admission": ("admission", None),
    "scheduler-1": ("scheduler", None),
    "scheduler-2": ("scheduler", None),
    "clock": ("clock", None),
    "api": ("api", None),
    "agent-0": ("agent", "node-0"),
    "agent-1": ("agent", "node-1"),
}


def acl_table(principals: Mapping[str, tuple[str, str | None]] = PRINCIPALS) -> dict[str, Grant]:
    """Each principal's grant."""
    return {name: role_grant(role, node) for name, (role, node) in principals.items()}


def acl_bindings(table: Mapping[str, Grant]) -> list:
    """The ACLs of ``table`` as the admin client's bindings (all ALLOW, host ``*``)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    def allow(kind, name, pattern, who, op):
        return AclBinding(kind, name, pattern, f"User:{who}", "*", op, AclPermissionType.ALLOW)

    out = []
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    for who, g in table.items():
        out += [allow(ResourceType.TOPIC, n, lit, who, AclOperation.READ) for n in g.reads]
        out += [allow(ResourceType.TOPIC, n, lit, who, AclOperation.WRITE) for n in g.writes]
        out += [allow(ResourceType.GROUP, n, lit, who, AclOperation.READ) for n in g.groups]
        out += [allow(ResourceType.GROUP, n, pre, who, AclOperation.READ) for n in g.group_prefixes]
    return out


def broker_security(
    admin_password: str, listeners: Iterable[str], controller: str
) -> dict[str, str]:
    """The broker's SASL and ACL settings (the Compose broker's ``kafka-start.sh``
    writes the same; a test checks both): SASL_PLAINTEXT on every listener, the
    super user ``admin`` by PLAIN (between broker and controller too), the
    services by SCRAM-SHA-512 on the client listeners, StandardAuthorizer with
    no access where no ACL allows it."""
    plain = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{SUPER_USER}" password="{admin_password}" user_{SUPER_USER}="{admin_password}";'
    )
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    names = [n.lower() for n in listeners]
    out = {
        "listener.security.protocol.map": ",".join(
            f"{n.upper()}:SASL_PLAINTEXT" for n in (*names, controller.lower())
        ),
        "sasl.enabled.mechanisms": f"{ADMIN_MECHANISM},{SERVICE_MECHANISM}",
        "sasl.mechanism.inter.broker.protocol": ADMIN_MECHANISM,
        "sasl.mechanism.controller.protocol": ADMIN_MECHANISM,
        f"listener.name.{controller.lower()}.sasl.enabled.mechanisms": ADMIN_MECHANISM,
        f"listener.name.{controller.lower()}.plain.sasl.jaas.config": plain,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{SUPER_USER}",
    }
    for n in names:
        out[f"listener.name.{n}.plain.sasl.jaas.config"] = plain
        out[f"listener.name.{n}.scram-sha-512.sasl.jaas.config"] = scram
    return out


def read_secret(secrets_dir: Path, principal: str) -> str:
    """The password of ``principal`` (the Docker secret ``kafka-<principal>``)."""
    path = secrets_dir / f"kafka-{principal}"
    try:
        password = path.read_text().strip()
    except OSError as exc:
        raise RuntimeError(f"{path}: {exc.strerror}; compose/make_secrets.py makes it") from None
    if not password:
        raise RuntimeError(f"{path} is empty; compose/make_secrets.py makes it")
    return password


def apply_principals(
    bootstrap: str,
    table: Mapping[str, Grant],
    passwords: Mapping[str, str],
    timeout_s: float = 30.0,
) -> int:
    """Upsert each principal's SCRAM credential and create its ACLs (both idempotent:
    a later start sets the passwords of the secrets again). Returns the ACL count.
    The admin client logs in from ``FRAMESPOOL_KAFKA_*`` (the super user)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from framespool.log.kafka import security_settings

    admin = AdminClient({"bootstrap.servers": bootstrap, **security_settings()})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    upserts = [UserScramCredentialUpsertion(p, info, passwords[p].encode()) for p in table]
    for future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout_s).values():
        future.result()
    bindings = acl_bindings(table)
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result()
    return len(bindings)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python compose/init_stack.py", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "kafka:9092"))
    p.add_argument("--stack-dir", type=Path, required=True)
    p.add_argument(
        "--s3-endpoint",
        default=os.environ.get("AWS_ENDPOINT_URL"),
        help="S3 API endpoint (MinIO); omit for AWS S3",
    )
    p.add_argument("--bucket", default="framespool")
    p.add_argument(
        "--tenants",
        default=DEFAULT_TENANTS,
        help="comma-separated name:tier pairs, when --config has no [[tenants]]",
    )
    p.add_argument(
        "--config",
        type=Path,
        help="the deployment file: its [[tenants]] get keys (framespool up's format)",
    )
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument(
        "--secrets-dir",
        type=Path,
        help="where the services' broker passwords are (kafka-<service> each, the "
        "Docker secrets): give each its principal and ACLs (omit: no broker auth)",
    )
    return p.parse_args(argv)


def retry(what: str, action: Callable[[], T], timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    delay = 0.5
    while True:
        try:
            return action()
        except Exception as exc:  # the broker or S3 is still starting: anything may fail
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
        {
            "tenant": s["name"],
            "tier": s["tier"],
            "api_key": s["api_key"],
            "webhook_secret": s["webhook_secret"],
        }
        for s in shown
    ]
    return doc["auth"]["tenants"], doc["auth"], plain


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from framespool.agents.artifacts.s3 import S3Store
    from framespool.log import create_topics

    try:
        created = retry("creating topics", lambda: create_topics(args.bootstrap), args.timeout_s)
        print(f"init: topics ready ({len(created)} created)", file=sys.stderr)
        if args.secrets_dir is not None:
            table = acl_table()
            passwords = {p: read_secret(args.secrets_dir, p) for p in table}
            n = retry(
                "creating principals and ACLs",
                lambda: apply_principals(args.bootstrap, table, passwords),
                args.timeout_s,
            )
            print(f"init: {len(table)} broker principals, {n} ACLs", file=sys.stderr)
        store = S3Store(args.bucket, endpoint_url=args.s3_endpoint)
        retry(f"creating bucket {args.bucket}", store.create_bucket, args.timeout_s)
        print(f"init: bucket {args.bucket} ready", file=sys.stderr)
    except RuntimeError as exc:
        print(f"init: {exc}", file=sys.stderr)
        return 1
    args.stack_dir.mkdir(parents=True, exist_ok=True)
    # only its owner enters (the services that share the volume run as it; a root
    # agent's generators, another user, cannot reach the secrets file)
    args.stack_dir.chmod(0o700)
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
    print(
        f"init: wrote {secrets_path}; the tenants' API keys are in "
        f"{keys_path} (read it once, then delete it)",
        file=sys.stderr,
    )
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
