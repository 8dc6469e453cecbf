"""The Compose deployment's configuration: every command runs a real module with flags
its argument parser accepts, images are pinned, ports and dependencies add up; and
``docker compose config`` accepts the file where a Compose CLI is installed.

Nothing here starts containers (CI has no Docker engine); the helper scripts the
file runs (``compose/init_stack.py``) are tested directly.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
FRAMESPOOL_IMAGE = "framespool:"
PINNED = re.compile(r"^[\w.\-/]+(:[\w][\w.\-]{0,127}|@sha256:[0-9a-f]{64})$")
BOOTSTRAP = "kafka:9092"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"compose_{name}", ROOT / "compose" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def ours(services: dict) -> dict:
    return {name: s for name, s in services.items() if s["image"].startswith(FRAMESPOOL_IMAGE)}


def flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


# ----------------------------------------------------------------------------
# Images and build
# ----------------------------------------------------------------------------
def test_images_are_pinned_and_ours_are_built_from_the_dockerfile(services):
    for name, service in services.items():
        image = service["image"]
        assert PINNED.match(image) and not image.endswith(":latest"), (name, image)
    for name, service in ours(services).items():
        build = service["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == ROOT, name
        assert build["dockerfile"] == "Dockerfile" and DOCKERFILE.is_file()
    images = {s["image"] for s in services.values()}
    assert any(i.startswith("apache/kafka:") for i in images)
    assert any("minio/minio:RELEASE." in i for i in images)


def test_dockerfile_pins_its_base_copies_every_package_and_drops_root():
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M).group(1)
    assert PINNED.match(base) and re.search(r":\d+\.\d+\.\d+", base), base
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
    for folder in set(folders):
        assert re.search(rf"^COPY {folder} \./{folder}$", text, re.M), folder
    assert re.search(r"^COPY compose \./compose$", text, re.M)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1] not in ("root", "0")
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


# ----------------------------------------------------------------------------
# Commands: real modules, real flags
# ----------------------------------------------------------------------------
def test_every_framespool_command_parses_with_the_real_argument_parsers(services):
    from framespool.bootstrap import processor_args as processors_args

    scripts = {"compose/init_stack.py": load_script("init_stack").parse_args}
    seen = set()
    for name, service in ours(services).items():
        cmd = service["command"]
        assert cmd[0] == "python", name
        if cmd[1:3] == ["-m", "framespool.processors"]:
            args = processors_args(cmd[3:])  # SystemExit on an unknown flag
            assert args.role in ("admission", "scheduler", "clock")
            seen.add(args.role)
        elif cmd[1:3] == ["-m", "framespool.services"]:
            seen.add(cmd[3])
        else:
            scripts[cmd[1]](cmd[2:])
            seen.add(cmd[1])
    assert {"admission", "scheduler", "clock", "api", "agent", "compose/init_stack.py"} <= seen


@pytest.mark.parametrize("service", ["api", "agent"])
def test_service_commands_use_flags_the_services_cli_has(services, service):
    """framespool.services parses and then runs, so its flags are read from --help."""
    out = subprocess.run(
        [sys.executable, "-m", "framespool.services", service, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    known = set(re.findall(r"--[a-z][a-z0-9-]*", out.stdout))
    commands = [
        s["command"]
        for s in ours(services).values()
        if s["command"][1:4] == ["-m", "framespool.services", service]
    ]
    assert commands
    for cmd in commands:
        assert set(flags(cmd)) <= known, (cmd, known)
        required = {"--stack-dir", "--bootstrap"} | ({"--port"} if service == "api" else {"--node"})
        assert required <= set(flags(cmd))


def test_processes_use_the_internal_bootstrap_and_distinct_state(services):
    # the broker's settings are kafka-start.sh's (tests/unit/test_compose_acls.py)
    start = (COMPOSE.parent / "kafka-start.sh").read_text()
    assert f"advertised.listeners=INTERNAL://{BOOTSTRAP}," in start
    assert "process.roles=broker,controller" in start  # KRaft, no ZooKeeper
    assert "auto.create.topics.enable=false" in start  # init creates the topics
    for name, service in ours(services).items():
        cmd = service["command"]
        if "--bootstrap" in cmd:
            assert cmd[cmd.index("--bootstrap") + 1] == BOOTSTRAP, name
        assert service["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == BOOTSTRAP
    schedulers = [s for s in ours(services).values() if s["command"][3:4] == ["scheduler"]]
    assert len(schedulers) == 2, "two scheduler instances share the cell partitions"
    instances = [s["command"][s["command"].index("--instance") + 1] for s in schedulers]
    assert len(set(instances)) == 2
    data_volumes = [v.split(":")[0] for s in schedulers for v in s["volumes"]]
    assert len(set(data_volumes)) == 2, "each scheduler instance keeps its own snapshots"
    nodes = [
        s["command"][s["command"].index("--node") + 1]
        for s in ours(services).values()
        if "--node" in s["command"]
    ]
    assert len(nodes) >= 2 and len(set(nodes)) == len(nodes)


def test_every_process_waits_long_on_kafka_fetches(services, monkeypatch):
    """Kafka answers a Fetch once a record arrives: a long wait costs no latency and
    spares the brokers idle Fetches (docs/broker-notes.md#fetch-wait). Every role's
    override is set, under the names the log adapter reads."""
    import inspect

    import framespool.log.kafka as kafka

    source = inspect.getsource(kafka.settings)
    for name, service in ours(services).items():
        env = service["environment"]
        for role in ("REQUEST_PATH", "FLEET", "BACKGROUND"):
            var = f"FRAMESPOOL_FETCH_WAIT_{role}_MS"
            assert f'env_ms("{var}"' in source, var
            monkeypatch.setenv(var, str(env[var]))
            assert kafka.settings.env_ms(var, 5) >= 500, (name, var)
        # with Kafka's long poll an idle reader costs nothing: none rests (a rest
        # would only delay an idle node's next instruction)
        for role in ("FLEET", "BACKGROUND"):
            var = f"FRAMESPOOL_IDLE_BACKOFF_{role}_MS"
            assert f'env_ms("{var}"' in source, var
            monkeypatch.setenv(var, str(env[var]))
            assert kafka.settings.env_ms(var, 100) == 0, (name, var)


def test_init_creates_topics_and_bucket_where_the_services_look(services):
    init = services["init"]["command"]
    assert init[1] == "compose/init_stack.py"
    assert init[init.index("--s3-endpoint") + 1] == "http://minio:9000"
    env = services["init"]["environment"]
    minio = services["minio"]["environment"]
    assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    stack_users = [n for n, s in ours(services).items() if "--stack-dir" in s["command"]]
    for name in stack_users + ["init"]:
        assert "stack:/stack" in services[name]["volumes"], name


# ----------------------------------------------------------------------------
# Ports and dependencies
# ----------------------------------------------------------------------------
def published(service: dict) -> list[tuple[str, int, int]]:
    out = []
    for spec in service.get("ports", []):
        parts = re.sub(r"\$\{\w+:-(\d+)\}", r"\1", spec).split(":")
        assert len(parts) == 3, f"{spec}: publish on an explicit host address"
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def test_ports_are_published_on_loopback_without_clashes(services):
    host_ports = []
    for name, service in services.items():
        for address, host, _ in published(service):
            assert address == "127.0.0.1", (name, address)
            host_ports.append(host)
    assert len(host_ports) == len(set(host_ports))
    command = services["api"]["command"]
    api_port = command[command.index("--port") + 1]
    # inside its container the API binds all interfaces; the host sees it on loopback only
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert ("127.0.0.1", 8080, int(api_port)) in published(services["api"])
    assert f"127.0.0.1:{api_port}/healthz" in " ".join(services["api"]["healthcheck"]["test"])


def test_dependencies_exist_and_wait_for_what_they_need(services):
    for name, service in services.items():
        for dep, cond in service.get("depends_on", {}).items():
            assert dep in services, (name, dep)
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)
    assert services["init"]["depends_on"] == {
        "kafka": {"condition": "service_healthy"},
        "minio": {"condition": "service_healthy"},
    }
    assert services["init"]["restart"] == "no"
    for name, service in ours(services).items():
        if name == "init":
            continue
        assert service["depends_on"] == {"init": {"condition": "service_completed_successfully"}}


def test_named_volumes_are_declared(compose):
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):  # a file of this folder, bind-mounted read-only
                assert (COMPOSE.parent / source).is_file() and volume.endswith(":ro"), volume
                continue
            assert source in declared, (name, source)


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        ok = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if ok.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_compose_cli_accepts_the_file():
    cli = _compose_cli()
    if cli is None:
        pytest.skip(
            "no Compose CLI: neither 'docker compose' (the plugin) nor 'docker-compose' "
            "is installed; the YAML checks above still ran"
        )
    out = subprocess.run(
        cli + ["-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=COMPOSE.parent,
    )
    assert out.returncode == 0, out.stderr


# ----------------------------------------------------------------------------
# The scripts Compose runs
# ----------------------------------------------------------------------------
def test_init_writes_settings_the_services_can_read(tmp_path):
    from framespool.producers.auth import ApiKeys

    init = load_script("init_stack")
    _, auth, plain = init.tenant_config("acme:enterprise,hobby:free")
    keys = ApiKeys.from_config(auth)
    for row in plain:
        principal = keys.authenticate(row["api_key"])
        assert principal is not None and principal.tenant == row["tenant"]
    assert keys.policy("acme").tiers == ("enterprise", "free")
    assert all(row["api_key"] not in json.dumps(auth) for row in plain), "only hashes stored"
    path = tmp_path / "secret.json"
    init.write_private(path, {"x": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(path.read_text()) == {"x": 1}


def test_cells_are_spread_and_every_config_file_exists(services):
    """Agents serve more than one cell, admission routes to exactly those cells, and
    each processor's --config names a file the image carries (compose/ is copied)."""
    from framespool.processors.config_file import load_admission_config

    agent_cells, configs = set(), set()
    for service in ours(services).values():
        cmd = service["command"]
        if "--cell" in cmd:
            agent_cells.add(cmd[cmd.index("--cell") + 1])
        if "--config" in cmd:
            configs.add(cmd[cmd.index("--config") + 1])
    assert len(agent_cells) >= 2
    assert configs == {"compose/framespool.toml"}
    assert set(load_admission_config(ROOT / "compose/framespool.toml").cells) == agent_cells


def test_every_service_reads_the_one_deployment_file_and_it_passes_ups_checks(services, tmp_path):
    """init (tenants), the API (its limits, the models), the agents (the models) and the
    processors all take --config compose/framespool.toml; it passes the checks
    `framespool up --config` makes, and its tenants reach every tier."""
    from framespool.processors.config_file import read_config_file, tenant_entries
    from framespool.processors.core.config import DEFAULT_TIERS
    from framespool.stack import Stack, StackConfig

    for name, service in ours(services).items():
        if name == "clock":
            continue
        cmd = service["command"]
        assert cmd[cmd.index("--config") + 1] == "compose/framespool.toml", name
    path = ROOT / "compose/framespool.toml"
    Stack(StackConfig(data_dir=tmp_path / "unused", cells=2, processor_config=path)).deployment()
    tiers = {t for e in tenant_entries(read_config_file(path)) for t in e.tiers}
    assert tiers == {t.name for t in DEFAULT_TIERS}


def test_init_issues_the_deployment_files_keys_and_adds_new_ones_on_a_later_start(tmp_path):
    from framespool.producers.auth import ApiKeys

    init = load_script("init_stack")
    path = tmp_path / "deploy.toml"
    path.write_text('[[tenants]]\nname = "acme"\ntiers = ["paid"]\nusers = ["ann"]\n')
    args = init.parse_args(["--stack-dir", str(tmp_path / "stack"), "--config", str(path)])
    assert [t.name for t in init.deployment_tenants(args)] == ["acme"]
    from framespool import stack_secrets

    doc, shown = stack_secrets.build(init.deployment_tenants(args), user="admin")
    (tmp_path / "stack").mkdir()
    stack_secrets.write_private(tmp_path / "stack" / "stack-secrets.json", doc)
    path.write_text(path.read_text() + '[[tenants]]\nname = "newco"\ntiers = ["batch"]\n')
    added = stack_secrets.update(
        tmp_path / "stack" / "stack-secrets.json",
        lambda d: stack_secrets.reconcile(d, init.deployment_tenants(args), user="admin"),
    )
    assert [(a["name"], a["user"]) for a in added] == [("newco", "admin")]
    keys = ApiKeys.from_config(
        json.loads((tmp_path / "stack" / "stack-secrets.json").read_text())["auth"]
    )
    assert keys.authenticate(shown[0]["api_key"]).user == "ann"
    assert keys.authenticate(added[0]["api_key"]).tenant == "newco"
