"""The Compose broker's principals and ACLs (issue 33, item 9), without Docker.

From ``compose/docker-compose.yml`` and ``compose/init_stack.py``: every
framespool service logs in as its own principal with its own secret and no
other's; init's ACL table grants each exactly the topics and groups its process
uses, found by running the code (the folds, the clock, the processors' wiring)
or reading it (the API's and the agent's topic parameters), never by copying a
list; nothing is granted on ``*``; and the broker's start script sets what
``init_stack.broker_security`` says (tests/integration/test_broker_acls.py runs
those settings on a real broker).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from framespool.log import Record
from framespool.log.kafka.settings import ANONYMOUS_GROUP_PREFIX
from framespool.schemas import topics as catalogue

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
TOPIC_NAMES = {
    t.name: attr
    for attr in dir(catalogue)
    if isinstance(t := getattr(catalogue, attr), catalogue.Topic)
}


def init_stack():
    spec = importlib.util.spec_from_file_location("compose_init_acls", COMPOSE / "init_stack.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


INIT = init_stack()


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def framespool_services(compose: dict) -> dict:
    return {
        n: s
        for n, s in compose["services"].items()
        if s["image"].startswith("framespool:") and n != "init"
    }


def role_of(service: dict) -> tuple[str, str | None]:
    """(role, node) from the service's command line."""
    cmd = service["command"]
    node = cmd[cmd.index("--node") + 1] if "--node" in cmd else None
    assert cmd[1] == "-m" and cmd[2] in ("framespool.processors", "framespool.services"), cmd
    return cmd[3], node


# ----------------------------------------------------------------------------
# Principals and secrets
# ----------------------------------------------------------------------------
def test_every_service_has_its_own_principal_and_only_its_own_secret(compose):
    ours = framespool_services(compose)
    assert set(ours) == set(INIT.PRINCIPALS), "a service without a principal, or one too many"
    declared = set(compose["secrets"])
    assert declared == {f"kafka-{p}" for p in INIT.PRINCIPALS} | {"kafka-admin"}
    holders: dict[str, list[str]] = {}
    for name, service in ours.items():
        env = service["environment"]
        assert env["FRAMESPOOL_KAFKA_SASL_USERNAME"] == name
        assert env["FRAMESPOOL_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
        assert env["FRAMESPOOL_KAFKA_SASL_MECHANISM"] == INIT.SERVICE_MECHANISM
        assert "FRAMESPOOL_KAFKA_SASL_PASSWORD" not in env, "passwords come from files"
        assert service["secrets"] == [f"kafka-{name}"], name
        password_file = env["FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE"]
        if role_of(service)[0] == "agent":  # moved by its entry script out of generators' reach
            assert service["entrypoint"] == ["/bin/sh", "compose/agent-entry.sh", f"kafka-{name}"]
            assert password_file == "/run/framespool/kafka-password"
        else:
            assert password_file == f"/run/secrets/kafka-{name}"
        assert INIT.PRINCIPALS[name] == role_of(service), name
        for secret in service["secrets"]:
            holders.setdefault(secret, []).append(name)
    for secret, names in holders.items():
        assert len(names) == 1, f"{secret} is mounted in {names}"
    # the super user's password: the broker's and init's alone
    kafka, init = compose["services"]["kafka"], compose["services"]["init"]
    assert kafka["secrets"] == ["kafka-admin"]
    assert set(init["secrets"]) == declared
    init_env = init["environment"]
    assert init_env["FRAMESPOOL_KAFKA_SASL_USERNAME"] == INIT.SUPER_USER
    assert init_env["FRAMESPOOL_KAFKA_SASL_MECHANISM"] == INIT.ADMIN_MECHANISM
    assert init_env["FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE"] == "/run/secrets/kafka-admin"
    cmd = init["command"]
    assert cmd[cmd.index("--secrets-dir") + 1] == "/run/secrets"


def test_agents_drop_generators_to_a_user_without_secrets(compose):
    for service in framespool_services(compose).values():
        if role_of(service)[0] != "agent":
            continue
        cmd = service["command"]
        assert service["user"] == "0:0"  # only root can drop a generator to another user
        generator = cmd[cmd.index("--generator-user") + 1]
        assert generator not in ("0", "root", "10001", "framespool")  # not the services' user
        work = cmd[cmd.index("--work-dir") + 1]
        assert not work.startswith("/stack") and any(
            v.endswith(f":{work}") for v in service["volumes"]
        )
    entry = (COMPOSE / "agent-entry.sh").read_text()
    assert "install -d -m 700 /run/framespool" in entry and "stat -c %a" in entry
    assert "args.stack_dir.chmod(0o700)" in (COMPOSE / "init_stack.py").read_text()


# ----------------------------------------------------------------------------
# The ACL table against the code
# ----------------------------------------------------------------------------
class Recorder:
    """A producer that keeps the topics it was given (clock, record_config)."""

    def __init__(self, *_a, **_k) -> None:
        self.topics: set[str] = set()

    def produce(self, topic, *_a, **_k) -> None:
        self.topics.add(topic)

    def flush(self, *_a, **_k) -> int:
        return 0

    def close(self, *_a, **_k) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def processor_topics(tmp_path, monkeypatch) -> dict[str, dict[str, set[str]]]:
    """What admission and the scheduler read (topic, group) and write, from the
    code: their wiring (``build_runner``), every output of both folds over a
    two-cell log where a cell drains (``tests/support/reroute.py``), their dead letters
    and their recorded configuration."""
    import framespool.log
    from framespool import bootstrap as main
    from framespool.processors.admission import AdmissionFold
    from framespool.processors.scheduler import SchedulerFold
    from tests.support import reroute as world

    out: dict[str, dict[str, set[str]]] = {}
    for role, fold in (("admission", AdmissionFold()), ("scheduler", SchedulerFold())):
        args = main.processor_args(
            [role, "--bootstrap", "unused:1", "--data-dir", str(tmp_path / role)]
        )
        runner = main.build_runner(args, catalogue)
        runner.processor.store.close()
        recorder = Recorder()
        monkeypatch.setattr(framespool.log, "LogProducer", lambda *_a, _r=recorder, **_k: _r)
        main.record_config(args, catalogue)
        junk = Record(runner.input_topic.name, 0, 0, b"k", b"not an event")
        writes = recorder.topics | {fold.dead_letter(junk, "r", "d").topic}
        out[role] = {
            "reads": {runner.input_topic.name},
            "groups": {runner.group_id},
            "writes": writes,
        }

    class Watched(world.TwoCells):
        def append(self, topic, partition, key, value):
            if self._writer:
                out[self._writer]["writes"].add(topic)
            super().append(topic, partition, key, value)

        def pump(self):
            # which fold is writing: admission reads commands, a cell the scheduler topic
            for (topic, p), records in list(self.topics.items()):
                start = self.read.get((topic, p), 0)
                if start == len(records) or (topic == catalogue.COMMANDS.name and self.paused):
                    continue
                self._writer = {
                    catalogue.COMMANDS.name: "admission",
                    catalogue.SCHEDULER.name: "scheduler",
                }.get(topic)
                folds = self.admission if topic == catalogue.COMMANDS.name else self.cells
                for record in records[start:]:
                    if self._writer:
                        for o in folds[p].step(record):
                            self.append(o.topic, o.partition, o.key.decode(), o.value)
                self.read[(topic, p)] = len(records)
                self._writer = None
                return self.pump()
            self._writer = None

    Watched._writer = None
    monkeypatch.setattr(world, "TwoCells", Watched)
    w = world.drained_world()
    assert w.events(catalogue.JOB_EVENTS.name)  # the scenario ran: jobs, offers, a drain
    return out


def clock_topics() -> set[str]:
    from framespool.processors.clock import Clock

    producer = Recorder()
    Clock(producer, catalogue).tick_once()  # type: ignore[arg-type]
    return producer.topics


def api_topics() -> dict[str, set[str]]:
    """The API process: its projections' inputs and dead letters (the topic
    parameters' defaults, which ``framespool.services`` leaves as they are) and
    the commands topic it submits to."""
    from framespool.producers.api import ApiConfig
    from framespool.projections import consumer, service

    params = inspect.signature(service.ProjectionService.open).parameters
    reads = {params["job_events"].default, params["progress"].default}
    commands = next(f.default for f in fields(ApiConfig) if f.name == "commands_topic")
    services_src = (ROOT / "framespool" / "services.py").read_text()
    assert "job_events=" not in services_src and "commands_topic=" not in services_src
    # its consumers name no group: anonymous ones
    assert "LogConsumer(bootstrap_servers, role=" in inspect.getsource(consumer)
    return {"reads": reads, "writes": {commands, params["dead_letter"].default}}


def agent_topics(node: str) -> dict[str, set[str]]:
    """The agent: every ``topics.X`` its modules name; its host reads one (the
    assignments partition it is keyed to) under the node's group."""
    from framespool.agents.host import host_group

    def named(path: Path) -> set[str]:
        found = set()
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute):
                if n.value.attr == "topics" and isinstance(
                    getattr(catalogue, n.attr, None), catalogue.Topic
                ):
                    found.add(getattr(catalogue, n.attr).name)
        return found

    agents = ROOT / "agents"
    used = set().union(*(named(p) for p in agents.glob("*.py")))
    reads = named(agents / "host.py")
    return {"reads": reads, "writes": used - reads, "groups": {host_group([node])}}


def test_the_acl_table_grants_each_process_exactly_what_its_code_uses(tmp_path, monkeypatch):
    table = INIT.acl_table()
    procs = processor_topics(tmp_path, monkeypatch)
    expected = {
        "admission": procs["admission"],
        "scheduler": procs["scheduler"],
        "clock": {"reads": set(), "writes": clock_topics(), "groups": set()},
        "api": {**api_topics(), "groups": set()},
    }
    for name, (role, node) in INIT.PRINCIPALS.items():
        grant = table[name]
        want = agent_topics(node) if role == "agent" else expected[role]
        got = {"reads": set(grant.reads), "writes": set(grant.writes), "groups": set(grant.groups)}
        assert got == want, f"{name} ({role})"
        assert set(grant.reads) | set(grant.writes) <= set(TOPIC_NAMES)
        assert grant.group_prefixes == ((ANONYMOUS_GROUP_PREFIX,) if role == "api" else ())
    # the draft in the issue had the scheduler write its own input and the clock
    # job-events: the code does neither
    assert catalogue.SCHEDULER.name not in table["scheduler-1"].writes
    assert table["clock"].writes == (catalogue.SCHEDULER.name,)


def test_no_wildcard_and_only_the_super_user_is_super():
    from confluent_kafka.admin import AclOperation, ResourcePatternType

    bindings = INIT.acl_bindings(INIT.acl_table())
    assert bindings
    for b in bindings:
        assert (
            b.name != "*" and b.principal != "User:*" and b.principal != f"User:{INIT.SUPER_USER}"
        )
        assert b.operation in (AclOperation.READ, AclOperation.WRITE), b
        if b.resource_pattern_type == ResourcePatternType.PREFIXED:
            assert b.name == ANONYMOUS_GROUP_PREFIX and len(b.name) > len("framespool-")
    # one principal per binding's principal name, all of them table entries
    assert {b.principal for b in bindings} == {f"User:{p}" for p in INIT.PRINCIPALS}


def test_the_broker_start_script_sets_init_stacks_security():
    script = (COMPOSE / "kafka-start.sh").read_text()
    settings = INIT.broker_security("$pw", ["INTERNAL", "EXTERNAL"], "CONTROLLER")
    props = dict(
        line.split("=", 1)
        for line in script.split("<<PROPS\n", 1)[1].split("\nPROPS", 1)[0].splitlines()
    )
    plain, scram = (re.search(rf'^{v}="(.*)"$', script, re.M).group(1) for v in ("plain", "scram"))
    expand = {"$plain": plain.replace('\\"', '"'), "$scram": scram}
    for key, value in settings.items():
        got = expand.get(props.get(key, ""), props.get(key))
        if key == "listener.security.protocol.map":
            assert set(got.split(",")) == set(value.split(",")), key
        else:
            assert got == value, key
    assert props["process.roles"] == "broker,controller"  # KRaft, no ZooKeeper
    assert props["auto.create.topics.enable"] == "false"  # init creates the topics
    assert "INTERNAL://kafka:9092" in props["advertised.listeners"]
    assert "--command-config /tmp/framespool-kafka/admin.properties" in str(
        yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"]["kafka"][
            "healthcheck"
        ]
    )


def test_init_reads_each_principals_secret_and_names_a_missing_one(tmp_path):
    (tmp_path / "kafka-api").write_text("s3cret\n")
    assert INIT.read_secret(tmp_path, "api") == "s3cret"
    with pytest.raises(RuntimeError, match="kafka-clock.*make"):
        INIT.read_secret(tmp_path, "clock")
