"""GPU probes: the port an agent reads GPU health through, and its adapters.

``NvmlProbe`` reads real GPUs through NVML (nvidia-ml-py); every field is read
on its own so a field a GPU does not support (ECC on consumer cards, say)
keeps its neutral default instead of hiding the rest. An idle GPU clocks
down (an idle H200 reads 345 of 1980 MHz), which the scheduler would take
for throttling; so when NVML's clock-event reasons name no slowdown (thermal,
power brake, hardware slowdown, power cap), ``sm_clock_mhz`` reports the
clock the GPU can run at, its maximum. ``SimulatedProbe`` is
the fake: deterministic per seed, with faults a test or chaos drill injects
(thermal throttling, ECC errors) and heals. Warm models are not the probe's
business: the agent knows which model last ran on each GPU and adds them.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from framespool.schemas.events import GpuHealth

log = logging.getLogger(__name__)


@runtime_checkable
class GpuProbe(Protocol):
    count: int
    gpu_type: str

    def sample(self) -> tuple[GpuHealth, ...]:
        """One health sample per GPU, in index order."""
        ...


# Clock-event reasons that mean the GPU cannot run at full speed (nvml.h).
SLOWDOWN_REASONS = (
    0x4 | 0x8 | 0x20 | 0x40 | 0x80
)  # SwPowerCap, HwSlowdown, Sw/HwThermal, HwPowerBrake


class NvmlProbe:
    """Real GPUs via NVML. Construct with :meth:`open` (raises if no NVML)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]
        self.count = len(self._handles)
        name = nvml.nvmlDeviceGetName(self._handles[0]) if self._handles else "none"
        self.gpu_type = gpu_type_from_name(name.decode() if isinstance(name, bytes) else name)
        self._unsupported: set[tuple[int, str]] = set()

    @classmethod
    def open(cls) -> NvmlProbe:
        import pynvml

        pynvml.nvmlInit()
        return cls(pynvml)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # shutting down: nothing useful to do with the error
            pass

    def sample(self) -> tuple[GpuHealth, ...]:
        n = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            default = GpuHealth(index=i)
            temp = self._read(
                i, "temperature", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
            )
            sm = self._read(i, "sm_clock", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
            max_sm = self._read(
                i, "max_sm_clock", lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)
            )
            corrected = self._read(
                i,
                "ecc_corrected",
                lambda: n.nvmlDeviceGetTotalEccErrors(
                    h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
                ),
            )
            uncorrected = self._read(
                i,
                "ecc_uncorrected",
                lambda: n.nvmlDeviceGetTotalEccErrors(
                    h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
                ),
            )
            util = self._read(i, "utilization", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu)
            reasons = self._read(i, "clock_reasons", lambda: self._clock_reasons(h))
            if sm is not None and max_sm and reasons is not None and not reasons & SLOWDOWN_REASONS:
                sm = max(int(sm), int(max_sm))  # idle or app-clock setting: not a health signal
            out.append(
                GpuHealth(
                    index=i,
                    temperature_c=float(temp) if temp is not None else default.temperature_c,
                    sm_clock_mhz=int(sm) if sm is not None else default.sm_clock_mhz,
                    max_sm_clock_mhz=int(max_sm)
                    if max_sm
                    else (int(sm) if sm else default.max_sm_clock_mhz),
                    ecc_corrected=int(corrected or 0),
                    ecc_uncorrected=int(uncorrected or 0),
                    utilization=float(util) / 100.0 if util is not None else 0.0,
                )
            )
        return tuple(out)

    def _clock_reasons(self, handle: Any) -> int:
        n = self._nvml
        getter = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(getter(handle))

    def _read(self, index: int, field_name: str, fn: Callable[[], Any]) -> Any | None:
        if (index, field_name) in self._unsupported:
            return None
        try:
            return fn()
        except self._nvml.NVMLError as e:
            if isinstance(e, getattr(self._nvml, "NVMLError_NotSupported", ())):
                self._unsupported.add((index, field_name))  # stop asking every heartbeat
            else:
                log.warning("NVML: GPU %d %s unreadable: %s", index, field_name, e)
            return None


def gpu_type_from_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; unknown names pass through squashed."""
    for token in name.replace("-", " ").split():
        if token[:1] in "ABHLTV" and any(c.isdigit() for c in token) and token.upper() != "NVIDIA":
            return token.upper()
    return name.strip().replace(" ", "_") or "unknown"


class SimulatedProbe:
    """Simulated GPUs with injectable faults; deterministic for a given seed."""

    NORMAL_TEMP_C = 45.0
    HOT_TEMP_C = 92.0
    MAX_CLOCK = 1980
    THROTTLED_CLOCK = 900

    def __init__(self, count: int = 8, gpu_type: str = "H100", seed: int = 0) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        self.count = count
        self.gpu_type = gpu_type
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._throttled: set[int] = set()
        self._ecc: dict[int, tuple[int, int]] = {}
        self._busy: set[int] = set()

    def _check(self, gpu: int) -> None:
        if not 0 <= gpu < self.count:
            raise IndexError(f"GPU {gpu} out of range 0..{self.count - 1}")

    def throttle(self, gpu: int) -> None:
        """Thermal throttling: high temperature, SM clock well below max."""
        self._check(gpu)
        with self._lock:
            self._throttled.add(gpu)

    def ecc(self, gpu: int, uncorrected: int = 1, corrected: int = 0) -> None:
        """Add ECC errors to a GPU's volatile counters."""
        self._check(gpu)
        with self._lock:
            c, u = self._ecc.get(gpu, (0, 0))
            self._ecc[gpu] = (c + corrected, u + uncorrected)

    def heal(self, gpu: int) -> None:
        """Clear injected faults (as a reset or a GPU swap would)."""
        self._check(gpu)
        with self._lock:
            self._throttled.discard(gpu)
            self._ecc.pop(gpu, None)

    def set_busy(self, gpus: set[int]) -> None:
        """Which GPUs the agent has work on (drives simulated utilization)."""
        with self._lock:
            self._busy = set(gpus)

    def sample(self) -> tuple[GpuHealth, ...]:
        with self._lock:
            out = []
            for i in range(self.count):
                jitter = self._rng.uniform(-1.5, 1.5)
                busy = i in self._busy
                hot = i in self._throttled
                corrected, uncorrected = self._ecc.get(i, (0, 0))
                out.append(
                    GpuHealth(
                        index=i,
                        temperature_c=round(
                            (self.HOT_TEMP_C if hot else self.NORMAL_TEMP_C + 20 * busy) + jitter, 1
                        ),
                        sm_clock_mhz=self.THROTTLED_CLOCK if hot else self.MAX_CLOCK,
                        max_sm_clock_mhz=self.MAX_CLOCK,
                        ecc_corrected=corrected,
                        ecc_uncorrected=uncorrected,
                        utilization=round(0.95 + self._rng.uniform(0, 0.04), 3) if busy else 0.0,
                    )
                )
            return tuple(out)


def with_warm_models(sample: tuple[GpuHealth, ...], warm: dict[int, str]) -> tuple[GpuHealth, ...]:
    """Attach the model last run on each GPU (the agent tracks it)."""
    return tuple(
        replace(g, warm_models=(warm[g.index],)) if warm.get(g.index) else g for g in sample
    )


def detect_probe(
    simulated_gpus: int = 8, gpu_type: str = "H100", seed: int = 0, prefer_simulated: bool = False
) -> GpuProbe:
    """NVML when a GPU answers, else a simulated node of ``simulated_gpus``."""
    if not prefer_simulated:
        try:
            probe = NvmlProbe.open()
            if probe.count > 0:
                return probe
            probe.close()
        except Exception as e:  # no library, no driver, no device: all mean "simulate"
            log.info(
                "NVML unavailable (%s): using %d simulated %s GPUs", e, simulated_gpus, gpu_type
            )
    return SimulatedProbe(simulated_gpus, gpu_type, seed)
