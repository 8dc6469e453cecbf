"""Fault injection into a node agent and its generators, for tests and chaos drills.

Theory of operation
-------------------
Two channels, neither of which needs the agent to cooperate beyond reading a file:

1. **GPU faults** go through a file. :class:`FaultFileProbe` wraps a
   :class:`~framespool.agents.gpus.SimulatedProbe`; before every sample (one per
   heartbeat) it re-reads ``<agent data dir>/faults.json`` when the file has
   changed and makes the simulated GPUs match it::

       {"throttle": [3], "ecc": {"5": [0, 1]}}      # GPU 3 hot, GPU 5: 1 uncorrected

   The file is the whole desired fault state: a GPU it does not name is healed.
   :func:`write_gpu_faults` replaces it atomically, so the probe never reads
   half a file; an unreadable file is logged and leaves the GPUs as they were.
2. **Process faults** are signals from outside, scoped to one agent's process
   tree (the agent and the generators it started, each in its own session):
   :func:`crash_node` SIGKILLs the agent and every generator's process group (a
   node losing power), :func:`pause`/:func:`resume` SIGSTOP/SIGCONT the agent
   alone (a node that stalls and comes back: its generators keep running), and
   :func:`wedge` SIGSTOPs one generator's group (a generator that hangs: alive,
   silent). Processes are found through ``/proc`` (Linux).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framespool.schemas.events import GpuHealth

log = logging.getLogger(__name__)

FAULTS_FILE = "faults.json"
GENERATOR_MARK = "framespool.agents.demo_generator"


# --------------------------------------------------------------------------
# GPU faults through a file
# --------------------------------------------------------------------------
def gpu_faults_doc(throttle: Any = (), ecc: Mapping[int, tuple[int, int]] | None = None) -> dict:
    """The file's content: throttled GPUs, and ECC ``(corrected, uncorrected)`` per GPU."""
    return {
        "throttle": sorted(int(g) for g in throttle),
        "ecc": {str(g): [int(c), int(u)] for g, (c, u) in sorted((ecc or {}).items())},
    }


def write_gpu_faults(
    agent_dir: Path | str, throttle: Any = (), ecc: Mapping[int, tuple[int, int]] | None = None
) -> Path:
    """Atomically replace ``<agent_dir>/faults.json``; the next heartbeat applies it."""
    agent_dir = Path(agent_dir)
    agent_dir.mkdir(parents=True, exist_ok=True)
    path = agent_dir / FAULTS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(gpu_faults_doc(throttle, ecc)))
    os.replace(tmp, path)
    return path


class FaultFileProbe:
    """A simulated probe whose faults follow ``path`` (see the module docstring)."""

    def __init__(self, probe: Any, path: Path | str) -> None:
        self._probe = probe
        self.path = Path(path)
        self.count = probe.count
        self.gpu_type = probe.gpu_type
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) last applied

    def set_busy(self, gpus: set[int]) -> None:
        self._probe.set_busy(gpus)

    def sample(self) -> tuple[GpuHealth, ...]:
        self._apply_file()
        return self._probe.sample()

    def _apply_file(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            if self._seen is not None:  # removed: heal everything
                self._seen = None
                self._apply({"throttle": [], "ecc": {}})
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._seen:
            return
        try:
            doc = json.loads(self.path.read_text())
            throttle = [int(g) for g in doc.get("throttle", ())]
            ecc = {int(g): (int(c), int(u)) for g, (c, u) in dict(doc.get("ecc", {})).items()}
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("fault file %s unreadable (%s); GPU faults unchanged", self.path, e)
            return
        self._seen = stamp
        self._apply({"throttle": throttle, "ecc": ecc})

    def _apply(self, faults: dict) -> None:
        for gpu in range(self.count):
            self._probe.heal(gpu)
        for gpu in faults["throttle"]:
            if 0 <= gpu < self.count:
                self._probe.throttle(gpu)
        for gpu, (corrected, uncorrected) in faults["ecc"].items():
            if 0 <= gpu < self.count:
                self._probe.ecc(gpu, uncorrected=uncorrected, corrected=corrected)
        if faults["throttle"] or faults["ecc"]:
            log.warning("injected GPU faults from %s: %s", self.path, faults)


# --------------------------------------------------------------------------
# Process faults
# --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GeneratorProcess:
    """A generator started by an agent: its pid (= its process group) and run."""

    pid: int
    job_id: str
    run: int


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def children(pid: int) -> list[int]:
    """Direct children of ``pid``, from ``/proc``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isascii() and entry.isdigit() and _ppid(int(entry)) == pid:
            out.append(int(entry))
    return sorted(out)


def generators(agent_pid: int) -> list[GeneratorProcess]:
    """The generators an agent runs now (children that carry a run in their environment)."""
    out = []
    for pid in children(agent_pid):
        env = _environ(pid)
        job_id = env.get("FRAMESPOOL_JOB_ID")
        if job_id:
            with contextlib.suppress(ValueError):
                out.append(GeneratorProcess(pid, job_id, int(env.get("FRAMESPOOL_RUN", "0"))))
    return out


def _signal_group(pid: int, sig: int) -> bool:
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def crash_node(agent_pid: int) -> list[GeneratorProcess]:
    """SIGKILL an agent and every generator group it started, as a power loss would.

    The agent is frozen first so that it cannot start a generator between the
    listing and the kill. Returns the generators killed."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(agent_pid, signal.SIGSTOP)
    found = generators(agent_pid)
    others = [p for p in children(agent_pid) if p not in {g.pid for g in found}]
    with contextlib.suppress(ProcessLookupError):
        os.kill(agent_pid, signal.SIGKILL)
    for pid in [g.pid for g in found] + others:
        _signal_group(pid, signal.SIGKILL)
    return found


def pause(agent_pid: int) -> None:
    """SIGSTOP the agent process only: no heartbeats, no reports; its generators run on."""
    os.kill(agent_pid, signal.SIGSTOP)


def resume(agent_pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(agent_pid, signal.SIGCONT)


def wedge(generator: GeneratorProcess) -> bool:
    """SIGSTOP one generator's process group: it stays alive and says nothing."""
    return _signal_group(generator.pid, signal.SIGSTOP)
