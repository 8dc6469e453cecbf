"""GPU probes: the simulated fake with faults, and NVML read field by field."""

from __future__ import annotations

import types

import pytest

from framespool.agents.gpus import (
    GpuProbe,
    NvmlProbe,
    SimulatedProbe,
    detect_probe,
    gpu_type_from_name,
    with_warm_models,
)


def test_simulated_probe_is_healthy_by_default_and_deterministic():
    a, b = SimulatedProbe(4, "H100", seed=1), SimulatedProbe(4, "H100", seed=1)
    assert isinstance(a, GpuProbe)
    sa, sb = a.sample(), b.sample()
    assert sa == sb and [g.index for g in sa] == [0, 1, 2, 3]
    for g in sa:
        assert g.temperature_c < 60 and g.sm_clock_mhz == g.max_sm_clock_mhz
        assert g.ecc_corrected == g.ecc_uncorrected == 0 and g.utilization == 0.0


def test_throttle_ecc_and_heal():
    p = SimulatedProbe(2, "A100", seed=0)
    p.throttle(1)
    p.ecc(0, uncorrected=2, corrected=5)
    p.ecc(0, uncorrected=1)
    g0, g1 = p.sample()
    assert g1.temperature_c > 85 and g1.sm_clock_mhz < g1.max_sm_clock_mhz / 2
    assert (g0.ecc_corrected, g0.ecc_uncorrected) == (
        5,
        3,
    ) and g0.sm_clock_mhz == g0.max_sm_clock_mhz
    p.heal(0)
    p.heal(1)
    g0, g1 = p.sample()
    assert g0.ecc_uncorrected == 0 and g1.temperature_c < 60
    with pytest.raises(IndexError):
        p.throttle(2)


def test_busy_gpus_show_utilization():
    p = SimulatedProbe(3)
    p.set_busy({2})
    assert [g.utilization > 0.9 for g in p.sample()] == [False, False, True]


def test_warm_models_attached_per_gpu():
    sample = with_warm_models(SimulatedProbe(3).sample(), {0: "demo", 2: "vidgen"})
    assert [g.warm_models for g in sample] == [("demo",), (), ("vidgen",)]


class FakeNvml(types.SimpleNamespace):
    """Just enough of pynvml: two GPUs, the second without ECC support."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def __init__(self):
        super().__init__(ecc_calls=0, broken_temp=False, reasons=0x8)  # HwSlowdown: clocks are real

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetTemperature(self, h, kind):
        if self.broken_temp:
            raise self.NVMLError("GPU is lost")
        return 71

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1755

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        self.ecc_calls += 1
        if h == 1:
            raise self.NVMLError_NotSupported("no ECC")
        return 4 if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=87)


def test_nvml_probe_reads_each_field_and_survives_unsupported_ones():
    nvml = FakeNvml()
    probe = NvmlProbe(nvml)
    assert probe.count == 2 and probe.gpu_type == "H100"
    g0, g1 = probe.sample()
    assert (g0.temperature_c, g0.sm_clock_mhz, g0.max_sm_clock_mhz) == (71.0, 1755, 1980)
    assert (g0.ecc_corrected, g0.ecc_uncorrected, g0.utilization) == (4, 1, 0.87)
    assert (g1.ecc_corrected, g1.ecc_uncorrected, g1.temperature_c) == (0, 0, 71.0)
    calls = nvml.ecc_calls
    probe.sample()
    assert nvml.ecc_calls == calls + 2  # unsupported fields are not asked again
    nvml.broken_temp = True
    g0, _ = probe.sample()
    assert (
        g0.temperature_c == 40.0 and g0.sm_clock_mhz == 1755
    )  # one bad field, the rest still read


@pytest.mark.parametrize(
    "reasons, clock",
    [
        (0x1, 1980),  # GpuIdle: an idle GPU clocks down; that is not throttling
        (0x2 | 0x10, 1980),  # application clocks, sync boost
        (0x0, 1980),
        (0x1 | 0x40, 1755),  # HwThermalSlowdown: report the real clock
        (0x4, 1755),  # SwPowerCap
    ],
)
def test_low_clock_counts_only_when_nvml_names_a_slowdown(reasons, clock):
    nvml = FakeNvml()
    nvml.reasons = reasons
    assert NvmlProbe(nvml).sample()[0].sm_clock_mhz == clock


@pytest.mark.parametrize(
    "name, kind",
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "NVIDIA_GeForce_RTX_4090"),
    ],
)
def test_gpu_type_from_name(name, kind):
    assert gpu_type_from_name(name) == kind


def test_detect_probe_falls_back_to_simulated_without_nvml():
    probe = detect_probe(simulated_gpus=4, gpu_type="H100", prefer_simulated=True)
    assert isinstance(probe, SimulatedProbe) and probe.count == 4
    auto = detect_probe(simulated_gpus=2)
    assert auto.count >= 1  # NVML on a GPU machine, else the 2 simulated GPUs
