"""Gray-failure rules: what a GPU's health sample says about it.

A GPU is ``failed`` after any uncorrectable ECC error (it stays failed until
the node re-registers), ``degraded`` while it throttles (too hot, or its SM
clock well below its maximum) or after too many corrected ECC errors, and
``ok`` again only after several healthy samples in a row (hysteresis, so a
flapping GPU does not take and drop work).
"""

from __future__ import annotations

from framespool.schemas.causes import RunCause
from framespool.schemas.events import GpuHealth
from framespool.schemas.states import GpuState

from .config import CellConfig


def classify(sample: GpuHealth, config: CellConfig) -> tuple[GpuState, str, RunCause]:
    """The state this one sample points to, why, and the cause code a run moved
    off this GPU carries."""
    if sample.ecc_uncorrected > 0:
        return (
            GpuState.FAILED,
            f"uncorrectable ECC errors: {sample.ecc_uncorrected}",
            RunCause.GPU_ECC,
        )
    if sample.ecc_corrected > config.ecc_corrected_limit:
        return (
            GpuState.DEGRADED,
            f"corrected ECC errors {sample.ecc_corrected} > {config.ecc_corrected_limit}",
            RunCause.GPU_ECC,
        )
    if sample.temperature_c >= config.throttle_temp_c:
        return (
            GpuState.DEGRADED,
            f"thermal: {sample.temperature_c:.0f}C >= {config.throttle_temp_c:.0f}C",
            RunCause.GPU_THROTTLED,
        )
    if (
        sample.max_sm_clock_mhz > 0
        and sample.sm_clock_mhz < config.throttle_clock_ratio * sample.max_sm_clock_mhz
    ):
        return (
            GpuState.DEGRADED,
            f"clock throttled: {sample.sm_clock_mhz}/{sample.max_sm_clock_mhz} MHz",
            RunCause.GPU_THROTTLED,
        )
    return GpuState.OK, "healthy", RunCause.UNRECORDED


def next_gpu_state(
    current: GpuState, sample_state: GpuState, healthy_streak: int, config: CellConfig
) -> GpuState:
    """Apply hysteresis: failure is sticky, degradation clears only after
    ``healthy_samples_to_recover`` healthy samples."""
    if current == GpuState.FAILED:
        return GpuState.FAILED
    if sample_state != GpuState.OK:
        return sample_state
    if current == GpuState.DEGRADED and healthy_streak < config.healthy_samples_to_recover:
        return GpuState.DEGRADED
    return GpuState.OK


def is_straggler(step_rate: float, median_rate: float, config: CellConfig) -> bool:
    """A run far slower than its model's median across the cell."""
    return median_rate > 0 and 0 < step_rate < config.straggler_ratio * median_rate
