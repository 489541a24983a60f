"""The GPU sampler, phase rule and collector against a fake NVML (tests/fake_nvml.py) that raises
pynvml's own exception classes; the real pynvml where it can run here (no driver: the failure path);
the exposition through the real promtool. Polls are driven by hand with a fake clock: no sleeps."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pynvml
import pytest
import yaml
from conftest import REPO, require_binary
from fake_nvml import FakeGpu, FakeNvml, h100s
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.gpu import GpuCollector, GpuSampler, PhaseConfig, PhaseTracker, SamplerConfig
from exporter.gpu.sampler import error_kind
from exporter.gpu.service import GpuService
from exporter.gpu.sources import GpuSourceCollector
from exporter.gpu.visibility import parse_visibility, select_devices, visibility_from_env

LOGGER = "exporter.gpu.sampler"


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(fake: FakeNvml, clock: Clock | None = None, env: dict[str, str] | None = None, **cfg) -> GpuSampler:
    return GpuSampler(fake, SamplerConfig(**cfg), env=env or {}, clock=clock or Clock(), wall_clock=lambda: 1.7e9)


def scrape(sampler: GpuSampler) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(sampler))
    return generate_latest(reg).decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(text: str, name: str, **labels: str) -> float | None:
    for (n, lbls), v in samples(text).items():
        if n == name and all((k, v2) in lbls for k, v2 in labels.items()):
            return v
    return None


def gpus_of(text: str, name: str) -> set[str]:
    return {dict(lbls)["gpu"] for n, lbls in samples(text) if n == name}


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def infos(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


# --- the fake is faithful where the sampler can tell ----------------------------------------------


def test_fake_has_pynvml_signatures_and_exception_classes() -> None:
    fake = FakeNvml(h100s(1))
    names = [n for n in dir(FakeNvml) if n.startswith("nvml") and callable(getattr(FakeNvml, n))]
    assert len(names) >= 18
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        assert inspect.signature(getattr(fake, name)) == real, name
    with pytest.raises(pynvml.NVMLError_Uninitialized) as e:
        fake.nvmlDeviceGetCount()
    assert e.value.value == pynvml.NVML_ERROR_UNINITIALIZED
    fake.nvmlInit()
    fake.gpus[0].lost = True
    h = FakeNvml.nvmlDeviceGetHandleByUUID  # the handle of a lost GPU cannot be had either
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        h(fake, fake.gpus[0].uuid)
    assert fake.NVMLError is pynvml.NVMLError and fake.NVMLError_Timeout is pynvml.NVMLError_Timeout


def test_error_kinds_are_snake_case_class_names() -> None:
    assert error_kind(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "gpu_is_lost"
    assert error_kind(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) == "library_not_found"
    assert error_kind(pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)) == "lib_rm_version_mismatch"
    assert error_kind(pynvml.NVMLError_Timeout()) == "timeout"
    assert error_kind(pynvml.NVMLError(12345)) == "nvml_error_12345"
    assert error_kind(OSError("x")) == "os_error"
    assert error_kind(ModuleNotFoundError("x")) == "module_not_found_error"


# --- several GPUs, every family --------------------------------------------------------------------


def test_several_gpus_every_field_in_prometheus_units() -> None:
    gpus = h100s(4, utilization=50, power_mw=350_500)
    gpus[2] = FakeGpu(uuid="GPU-22222222-aaaa-bbbb-cccc-000000000002", name="NVIDIA A100-SXM4-40GB",
                      memory_total=40 * 2**30, memory_used=30 * 2**30, utilization=97, power_mw=398_250,
                      power_limit_mw=400_000, temperature=71, sm_clock_mhz=1410, energy_mj=5_000_000,
                      throttle_reasons=0x4 | 0x20, ecc={(0, 0): 3, (0, 1): 12, (1, 1): 1},
                      retired_pages={0: [0x1000, 0x2000], 1: [0x3000]}, remapped_rows=(2, 1, 1, 0))
    fake = FakeNvml(gpus)
    s = make(fake)
    snap = s.poll_once()
    assert snap.nvml_up and snap.visible_devices == 4 and [g.index for g in snap.gpus] == [0, 1, 2, 3]
    text = scrape(s)
    a100 = {"gpu": "2", "UUID": gpus[2].uuid, "model_name": "NVIDIA A100-SXM4-40GB"}
    assert value(text, "posttrain_gpu_nvml_up") == 1
    assert value(text, "posttrain_gpu_visible_devices") == 4
    assert value(text, "posttrain_gpu_up", **a100) == 1
    assert value(text, "posttrain_gpu_utilization_ratio", **a100) == pytest.approx(0.97)
    assert value(text, "posttrain_gpu_memory_used_bytes", **a100) == 30 * 2**30
    assert value(text, "posttrain_gpu_memory_total_bytes", **a100) == 40 * 2**30
    assert value(text, "posttrain_gpu_power_watts", **a100) == pytest.approx(398.25)
    assert value(text, "posttrain_gpu_power_limit_watts", **a100) == 400
    assert value(text, "posttrain_gpu_temperature_celsius", **a100) == 71
    assert value(text, "posttrain_gpu_sm_clock_hertz", **a100) == 1.41e9
    assert value(text, "posttrain_gpu_energy_joules_total", **a100) == 5000
    assert value(text, "posttrain_gpu_throttle_reason", **a100, reason="sw_power_cap") == 1
    assert value(text, "posttrain_gpu_throttle_reason", **a100, reason="sw_thermal_slowdown") == 1
    assert value(text, "posttrain_gpu_throttle_reason", **a100, reason="hw_slowdown") == 0
    assert value(text, "posttrain_gpu_ecc_errors_total", **a100, type="corrected", scope="volatile") == 3
    assert value(text, "posttrain_gpu_ecc_errors_total", **a100, type="corrected", scope="aggregate") == 12
    assert value(text, "posttrain_gpu_ecc_errors_total", **a100, type="uncorrected", scope="aggregate") == 1
    assert value(text, "posttrain_gpu_retired_pages_total", **a100, cause="multiple_single_bit_ecc") == 2
    assert value(text, "posttrain_gpu_retired_pages_total", **a100, cause="double_bit_ecc") == 1
    assert value(text, "posttrain_gpu_remapped_rows_total", **a100, cause="correctable_error") == 2
    assert value(text, "posttrain_gpu_remapped_rows_total", **a100, cause="uncorrectable_error") == 1
    assert value(text, "posttrain_gpu_row_remap_pending", **a100) == 1
    assert value(text, "posttrain_gpu_row_remap_failure", **a100) == 0
    assert value(text, "posttrain_gpu_power_watts", gpu="0") == pytest.approx(350.5)
    # dcgm-exporter's label names for the join keys (gpu, UUID): the two exporters' series join on(UUID)
    assert {frozenset(k for k, _ in lbls) for n, lbls in samples(text) if n == "posttrain_gpu_power_watts"} \
        == {frozenset({"gpu", "UUID", "model_name"})}
    assert gpus_of(text, "posttrain_gpu_utilization_ratio") == {"0", "1", "2", "3"}
    assert value(text, "posttrain_gpu_nvml_errors_total") is None  # nothing failed
    fake.advance(10)
    s.poll_once()
    assert value(scrape(s), "posttrain_gpu_energy_joules_total", **a100) == pytest.approx(5000 + 10 * 398.25)


def test_a_scrape_only_reads_the_snapshot() -> None:
    fake = FakeNvml(h100s(2, utilization=90, power_mw=500_000))
    s = make(fake)
    s.poll_once()
    calls = sum(fake.calls.values())
    texts = {scrape(s) for _ in range(3)}
    assert sum(fake.calls.values()) == calls and len(texts) == 1


def test_not_supported_fields_are_absent_not_errors_and_not_asked_again() -> None:
    gpu = h100s(1)[0]
    gpu.unsupported = {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors",
                       "nvmlDeviceGetRetiredPages", "nvmlDeviceGetRemappedRows"}
    fake = FakeNvml([gpu])
    s = make(fake, slow_interval_seconds=0)
    for _ in range(3):
        s.poll_once()
    text = scrape(s)
    for name in ("posttrain_gpu_energy_joules_total", "posttrain_gpu_ecc_errors_total",
                 "posttrain_gpu_retired_pages_total", "posttrain_gpu_remapped_rows_total",
                 "posttrain_gpu_row_remap_pending"):
        assert value(text, name) is None, name
    assert value(text, "posttrain_gpu_power_watts") == 70
    assert value(text, "posttrain_gpu_nvml_errors_total") is None
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 4  # each type x scope asked once, then off
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3


def test_a_field_never_supported_is_said_once_at_info_naming_the_gpu_and_field(caplog) -> None:
    """A MIG-enabled parent GPU has no utilization: the panel is empty, so the log says why (not at DEBUG)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = h100s(2)
    gpus[1].unsupported = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTotalEnergyConsumption"}
    fake = FakeNvml(gpus)
    s = make(fake)
    for _ in range(20):
        s.poll_once()
    said = [m for m in infos(caplog) if "does not support" in m]
    assert said == [f"GPU sampler: GPU 1 ({gpus[1].uuid}) does not support utilization, energy (NVML NotSupported); "
                    "not exported, not asked again until NVML is re-initialized"]
    assert gpus_of(scrape(s), "posttrain_gpu_utilization_ratio") == {"0"}
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 20 + 1
    assert warnings(caplog) == []


def test_a_field_that_answered_then_says_not_supported_is_an_error_for_that_poll_and_asked_again(caplog) -> None:
    """One transient NotSupported (a mode change, a driver hiccup) must not remove a field for the rest of the run."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = h100s(2, power_mw=600_000)
    fake = FakeNvml(gpus)
    s = make(fake)
    s.poll_once()
    gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    s.poll_once()
    text = scrape(s)
    assert gpus_of(text, "posttrain_gpu_power_watts") == {"1"}
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="not_supported") == 1
    assert any("GPU 0 power unreadable (not_supported" in m for m in warnings(caplog))
    del gpus[0].errors["nvmlDeviceGetPowerUsage"]
    for _ in range(3):
        s.poll_once()
    assert gpus_of(scrape(s), "posttrain_gpu_power_watts") == {"0", "1"}
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 2 * 5
    assert "GPU sampler: GPU 0 power readable again" in infos(caplog)
    assert not [m for m in infos(caplog) if "does not support" in m]


def test_slow_fields_are_read_every_slow_interval_and_carried() -> None:
    clock = Clock()
    gpu = h100s(1)[0]
    gpu.ecc = {(1, 0): 4}
    fake = FakeNvml([gpu])
    s = make(fake, clock, slow_interval_seconds=30)
    for t in range(31):
        clock.t = t
        s.poll_once()
        assert value(scrape(s), "posttrain_gpu_ecc_errors_total", type="uncorrected", scope="volatile") == 4
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 4
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 31


def test_old_pynvml_or_driver_falls_back_to_throttle_reasons() -> None:
    for fake in (FakeNvml(h100s(1, throttle_reasons=0x5), missing=["nvmlDeviceGetCurrentClocksEventReasons"]),
                 FakeNvml(h100s(1, throttle_reasons=0x5))):
        if not hasattr(fake, "nvmlDeviceGetCurrentClocksEventReasons"):
            assert getattr(fake, "nvmlDeviceGetCurrentClocksEventReasons", None) is None
        else:  # a driver older than the function: FunctionNotFound
            fake.gpus[0].errors["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        s = make(fake)
        s.poll_once()
        s.poll_once()
        text = scrape(s)
        assert value(text, "posttrain_gpu_throttle_reason", reason="gpu_idle") == 1
        assert value(text, "posttrain_gpu_throttle_reason", reason="sw_power_cap") == 1
        assert value(text, "posttrain_gpu_throttle_reason", reason="hw_slowdown") == 0
        assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2
        assert value(text, "posttrain_gpu_nvml_errors_total") is None


# --- per-field errors, timeouts -------------------------------------------------------------------


def test_an_error_on_one_field_leaves_the_other_fields(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = h100s(2, utilization=95, power_mw=600_000)
    gpus[1].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NO_PERMISSION
    fake = FakeNvml(gpus)
    s = make(fake)
    for _ in range(5):
        s.poll_once()
    text = scrape(s)
    assert gpus_of(text, "posttrain_gpu_power_watts") == {"0"}
    for name in ("posttrain_gpu_utilization_ratio", "posttrain_gpu_memory_used_bytes", "posttrain_gpu_sm_clock_hertz",
                 "posttrain_gpu_temperature_celsius", "posttrain_gpu_power_limit_watts"):
        assert gpus_of(text, name) == {"0", "1"}, name
    assert gpus_of(text, "posttrain_gpu_phase") == {"0"}  # the phase needs the power
    assert value(text, "posttrain_gpu_up", gpu="1") == 1
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="no_permission") == 5
    assert len(warnings(caplog)) == 1 and "GPU 1 power unreadable (no_permission" in warnings(caplog)[0]
    del gpus[1].errors["nvmlDeviceGetPowerUsage"]
    s.poll_once()
    s.poll_once()
    assert gpus_of(scrape(s), "posttrain_gpu_power_watts") == {"0", "1"}
    assert [m for m in infos(caplog) if "readable again" in m] == ["GPU sampler: GPU 1 power readable again"]


def test_values_no_gpu_can_have_are_not_exported_but_counted_and_said_once(caplog) -> None:
    """Utilization 255 %, NVML's 0xFFFFFFFF mW "no value" as power, memory used above total: not a reading of the GPU
    (a false line on the board, a false phase). The other GPU and the plausible fields are served."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = [FakeGpu(uuid="GPU-bad", utilization=255, memory_used=90 * 2**30, power_mw=0xFFFFFFFF),
            FakeGpu(uuid="GPU-good", utilization=90, power_mw=600_000)]
    s = make(FakeNvml(gpus))
    for _ in range(3):
        s.poll_once()
    text = scrape(s)
    for name in ("posttrain_gpu_utilization_ratio", "posttrain_gpu_power_watts", "posttrain_gpu_memory_used_bytes",
                 "posttrain_gpu_memory_total_bytes", "posttrain_gpu_phase"):
        assert gpus_of(text, name) == {"1"}, name
    assert gpus_of(text, "posttrain_gpu_temperature_celsius") == {"0", "1"}
    assert value(text, "posttrain_gpu_up", gpu="0") == 1
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="out_of_range") == 4 * 3  # 4 values, 3 polls
    said = [m for m in warnings(caplog) if "out of range" in m]
    assert len(said) == 4 and any("utilization_ratio out of range (2.55 > 1)" in m for m in said)
    gpus[0].utilization, gpus[0].power_mw = 50, 300_000
    s.poll_once()
    text = scrape(s)
    assert gpus_of(text, "posttrain_gpu_utilization_ratio") == gpus_of(text, "posttrain_gpu_power_watts") == {"0", "1"}
    assert "GPU sampler: GPU 0 power_watts in range again" in infos(caplog)
    assert len([m for m in warnings(caplog) if "out of range" in m]) == 4


def test_a_field_that_times_out_is_skipped_for_that_poll() -> None:
    gpus = h100s(2, utilization=95)
    gpus[0].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_TIMEOUT
    fake = FakeNvml(gpus, timeout_seconds=0.05)
    s = make(fake)
    t0 = time.perf_counter()
    snap = s.poll_once()
    assert time.perf_counter() - t0 >= 0.05 and snap.poll_seconds >= 0.05  # the slow call shows in poll_seconds
    text = scrape(s)
    assert gpus_of(text, "posttrain_gpu_temperature_celsius") == {"1"}
    assert gpus_of(text, "posttrain_gpu_power_watts") == {"0", "1"}
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="timeout") == 1
    assert value(text, "posttrain_gpu_nvml_up") == 1


def test_nvml_init_that_times_out_is_retried() -> None:
    clock = Clock()
    fake = FakeNvml(h100s(1), init_error=pynvml.NVML_ERROR_TIMEOUT)
    s = make(fake, clock)
    assert not s.poll_once().nvml_up
    assert value(scrape(s), "posttrain_gpu_nvml_errors_total", kind="timeout") == 1
    fake.init_error = None
    clock.t = 1.0
    assert s.poll_once().nvml_up


# --- lost GPUs, NVML missing or failing -----------------------------------------------------------


def test_a_gpu_lost_mid_run_drops_its_series_and_keeps_the_others(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    gpus = h100s(3, utilization=95, power_mw=600_000)
    fake = FakeNvml(gpus)
    s = make(fake, clock, backoff_initial_seconds=1, backoff_max_seconds=4)
    s.poll_once()
    gpus[1].lost = True
    for t in range(1, 8):
        clock.t = t
        snap = s.poll_once()
        assert snap.nvml_up and [g.up for g in snap.gpus] == [True, False, True]
    text = scrape(s)
    assert value(text, "posttrain_gpu_up", gpu="1", UUID=gpus[1].uuid) == 0
    for name in ("posttrain_gpu_utilization_ratio", "posttrain_gpu_power_watts", "posttrain_gpu_phase",
                 "posttrain_gpu_throttle_reason", "posttrain_gpu_energy_joules_total"):
        assert gpus_of(text, name) == {"0", "2"}, name
    # lost at t=1, probed again at 2, 4 (backoff 1, 2, then capped at 4): 3 errors
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="gpu_is_lost") == 3
    assert fake.calls["nvmlDeviceGetHandleByUUID"] == 2
    assert len(warnings(caplog)) == 1 and "GPU 1" in warnings(caplog)[0] and "lost (gpu_is_lost" in warnings(caplog)[0]
    gpus[1].lost = False  # reset: the GPU answers again, under a new handle
    clock.t = 8
    s.poll_once()
    text = scrape(s)
    assert value(text, "posttrain_gpu_up", gpu="1") == 1
    assert gpus_of(text, "posttrain_gpu_power_watts") == {"0", "1", "2"}
    assert any("GPU 1" in m and "is back" in m for m in infos(caplog))


def test_a_gpu_unreadable_at_init_is_a_lost_gpu_probed_with_backoff_not_dropped(caplog) -> None:
    """GpuIsLost for one GPU while NVML starts: reported lost (up 0, counted in the visible GPUs), probed again by its
    index with the same backoff as a GPU lost mid-run, sampled under its UUID once it answers."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    gpus = h100s(2, utilization=95, power_mw=600_000)
    gpus[1].lost = True
    fake = FakeNvml(gpus)
    s = make(fake, clock, env={"CUDA_VISIBLE_DEVICES": "0,1"}, backoff_initial_seconds=1, backoff_max_seconds=4)
    for t in range(8):
        clock.t = t
        snap = s.poll_once()
        assert snap.nvml_up and snap.visible_devices == 2 and [g.up for g in snap.gpus] == [True, False]
    text = scrape(s)
    assert value(text, "posttrain_gpu_up", gpu="1") == 0
    assert gpus_of(text, "posttrain_gpu_power_watts") == {"0"}
    assert s.active()
    # unreadable at init (t=0), probed again at 1, 3, 7 (backoff 1, 2, 4): 4 errors, 1 line
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="gpu_is_lost") == 4
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2 + 3
    said = [m for m in warnings(caplog) if "GPU 1" in m]
    assert len(said) == 1 and "unreadable at NVML init (gpu_is_lost" in said[0] and "probing again" in said[0]
    gpus[1].lost = False
    clock.t = 11
    s.poll_once()
    text = scrape(s)
    assert value(text, "posttrain_gpu_up", gpu="1", UUID=gpus[1].uuid, model_name=gpus[1].name) == 1
    assert gpus_of(text, "posttrain_gpu_power_watts") == {"0", "1"}
    assert any(f"GPU 1 ({gpus[1].uuid}) is back" in m for m in infos(caplog))
    assert fake.calls["nvmlInit"] == 1


def test_a_gpu_unreadable_at_init_under_uuid_visibility_is_kept_until_its_uuid_says_whose_it_is(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    gpus = h100s(3, utilization=95)
    gpus[1].lost = gpus[2].lost = True
    fake = FakeNvml(gpus)
    clock = Clock()
    # GPU 2 is this process's, GPU 1 is not: neither can tell at init
    s = make(fake, clock, env={"CUDA_VISIBLE_DEVICES": gpus[2].uuid}, backoff_initial_seconds=1)
    snap = s.poll_once()
    assert snap.visible_devices == 2 and [(g.index, g.up) for g in snap.gpus] == [(1, False), (2, False)]
    gpus[1].lost = gpus[2].lost = False
    clock.t = 2
    snap = s.poll_once()
    assert snap.visible_devices == 1 and [(g.index, g.uuid, g.up) for g in snap.gpus] == [(2, gpus[2].uuid, True)]
    assert any("GPU 1" in m and "not one of CUDA_VISIBLE_DEVICES's" in m for m in infos(caplog))
    clock.t = 3
    assert [g.index for g in s.poll_once().gpus] == [2]


def test_nvml_library_missing_exports_up_zero_and_backs_off(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    fake = FakeNvml(h100s(2), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    s = make(fake, clock, env={"CUDA_VISIBLE_DEVICES": "0,1"})  # GPUs were given: their absence is a fault
    for i in range(5):
        clock.t = i * 0.25
        snap = s.poll_once()
        assert not snap.nvml_up and snap.gpus == () and snap.polls == i + 1
    assert fake.calls["nvmlInit"] == 2  # at 0 and at 1 s; the polls between wait for the backoff
    text = scrape(s)
    assert value(text, "posttrain_gpu_nvml_up") == 0
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="library_not_found") == 2
    assert value(text, "posttrain_gpu_visible_devices") is None  # unknown while NVML is down
    assert value(text, "posttrain_gpu_sampler_polls_total") == 5
    assert not any(n.startswith("posttrain_gpu_") and "gpu" in dict(lb) for n, lb in samples(text))
    assert len(warnings(caplog)) == 1
    assert "NVML unavailable (library_not_found: NVML Shared Library Not Found)" in warnings(caplog)[0]


@pytest.mark.parametrize("threaded", [False, True])
def test_a_cpu_machine_without_nvml_is_said_once_at_info_and_no_retry_is_promised_by_one_poll(caplog,
                                                                                              threaded) -> None:
    """No GPU given and no NVML library: a CPU machine, not a fault (info, once). `dump` polls once, so it promises
    no retry; the serving sampler's thread does retry and says so."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FakeNvml(h100s(1), init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    s = make(fake, Clock())
    if threaded:
        s.start()
        deadline = time.monotonic() + 10
        while not fake.calls["nvmlInit"] and time.monotonic() < deadline:
            time.sleep(0.01)
        s.stop()
    else:
        s.poll_once()
        s.poll_once()
    assert warnings(caplog) == []
    lines = [m for m in infos(caplog) if "NVML unavailable" in m]
    assert len(lines) == 1, infos(caplog)
    assert ("retrying" in lines[0]) == threaded


def test_real_pynvml_here_never_raises() -> None:
    """The installed pynvml against whatever this machine has: no driver gives the failure path."""
    s = GpuSampler(pynvml, SamplerConfig(), env={})
    snap = s.poll_once()
    try:
        if snap.nvml_up:  # a GPU machine
            assert snap.visible_devices == len(snap.gpus) and all(g.uuid.startswith("GPU-") for g in snap.gpus)
        else:
            assert dict(snap.errors).keys() & {"library_not_found", "driver_not_loaded", "no_permission", "unknown"}
            assert value(scrape(s), "posttrain_gpu_nvml_up") == 0
    finally:
        s.stop()


def test_backoff_doubles_to_its_cap_then_nvml_comes_back(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    fake = FakeNvml(h100s(2), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    s = make(fake, clock, env={"NVIDIA_VISIBLE_DEVICES": "all"}, backoff_initial_seconds=1, backoff_max_seconds=8)
    attempts = []
    for step in range(420):  # 42 s at 0.1 s
        clock.t = step / 10
        before = fake.calls["nvmlInit"]
        s.poll_once()
        if fake.calls["nvmlInit"] > before:
            attempts.append(clock.t)
    assert attempts == [0, 1, 3, 7, 15, 23, 31, 39]
    assert value(scrape(s), "posttrain_gpu_nvml_up") == 0
    fake.init_error = None  # the driver is loaded
    clock.t = 47
    s.poll_once()
    text = scrape(s)
    assert value(text, "posttrain_gpu_nvml_up") == 1
    assert gpus_of(text, "posttrain_gpu_up") == {"0", "1"}
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="driver_not_loaded") == 8
    assert len(warnings(caplog)) == 1 and "driver_not_loaded" in warnings(caplog)[0]
    assert [m for m in infos(caplog) if "NVML up" in m] == [
        "GPU sampler: NVML up, sampling 2 GPU(s) (0:NVIDIA H100 80GB HBM3, 1:NVIDIA H100 80GB HBM3) every 1s"]
    # after a recovery the backoff starts again from its initial delay
    fake.broken = pynvml.NVML_ERROR_UNINITIALIZED
    s.poll_once()
    fake.broken = None
    clock.t = 48
    assert s.poll_once().nvml_up


def test_nvml_failing_mid_run_goes_down_then_recovers(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    fake = FakeNvml(h100s(2, utilization=90))
    s = make(fake, clock)
    assert s.poll_once().nvml_up
    fake.broken = pynvml.NVML_ERROR_DRIVER_NOT_LOADED  # every call, nvmlShutdown included
    for t in range(1, 4):
        clock.t = t
        snap = s.poll_once()
        assert not snap.nvml_up and snap.gpus == ()
    fake.broken = None
    clock.t = 10
    snap = s.poll_once()
    assert snap.nvml_up and len(snap.gpus) == 2
    assert len(warnings(caplog)) == 1 and "driver_not_loaded" in warnings(caplog)[0]
    assert len([m for m in infos(caplog) if "NVML up" in m]) == 2


def test_an_unexpected_exception_in_a_call_is_contained_to_its_field(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FakeNvml(h100s(2, utilization=50))

    def broken(handle):
        if handle.gpu is fake.gpus[1]:
            raise ValueError("a ctypes surprise")
        return 123_000

    fake.nvmlDeviceGetPowerUsage = broken
    s = make(fake)
    for _ in range(3):
        assert s.poll_once().nvml_up
    text = scrape(s)
    assert gpus_of(text, "posttrain_gpu_power_watts") == {"0"}
    assert gpus_of(text, "posttrain_gpu_temperature_celsius") == {"0", "1"}
    assert value(text, "posttrain_gpu_nvml_errors_total", kind="value_error") == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None and "GPU 1 power" in errors[0].getMessage()


def test_an_unexpected_exception_in_a_poll_backs_off_and_logs_once(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    fake = FakeNvml(h100s(1))
    s = make(fake, clock)
    s.poll_once()
    fake.nvmlDeviceGetUtilizationRates = lambda handle: object()  # no .gpu: the sampler's own code fails
    attempts = []
    for step in range(80):  # init succeeds each retry and the read fails: still one line, still backing off
        clock.t = 1 + step / 10
        before = fake.calls["nvmlInit"]
        assert not s.poll_once().nvml_up
        if fake.calls["nvmlInit"] > before:
            attempts.append(clock.t)
    assert attempts == [2, 4, 8]  # failed at 1: retried after 1 s, 2 s, 4 s
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "unexpected AttributeError" in errors[0].getMessage()
    assert len([m for m in infos(caplog) if "NVML up" in m]) == 1
    assert value(scrape(s), "posttrain_gpu_nvml_errors_total", kind="attribute_error") == 4
    del fake.nvmlDeviceGetUtilizationRates
    clock.t = 16
    assert s.poll_once().nvml_up
    assert fake.refcount == 1  # each failed poll shut NVML down before the next init


def test_one_log_line_per_state_change_over_many_polls(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = Clock()
    gpus = h100s(2)
    gpus[0].unsupported.add("nvmlDeviceGetRemappedRows")
    fake = FakeNvml(gpus)
    s = make(fake, clock, backoff_initial_seconds=1, backoff_max_seconds=1)
    for t in range(50):
        clock.t = t
        if t == 10:
            gpus[0].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
        if t == 20:
            del gpus[0].errors["nvmlDeviceGetTemperature"]
        if t == 30:
            fake.broken = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        if t == 40:
            fake.broken = None
        s.poll_once()
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]
    # the field GPU 0 does not have: said once, not again after NVML's re-init at t=40
    assert "GPU 0" in msgs[0] and "does not support remapped_rows" in msgs[0], msgs
    msgs = msgs[1:]
    assert len(msgs) == 5, msgs
    assert "NVML up" in msgs[0] and "temperature unreadable (unknown" in msgs[1]
    assert "temperature readable again" in msgs[2] and "lib_rm_version_mismatch" in msgs[3] and "NVML up" in msgs[4]


def test_the_thread_polls_at_its_interval_and_stops_cleanly() -> None:
    fake = FakeNvml(h100s(2, utilization=80))
    s = GpuSampler(fake, SamplerConfig(interval_seconds=0.02), env={})
    s.start()
    deadline = time.monotonic() + 0.5
    while s.snapshot().polls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    s.stop()
    snap = s.snapshot()
    assert snap.polls >= 3 and snap.nvml_up and snap.cpu_seconds > 0
    assert fake.refcount == 0  # nvmlShutdown matched nvmlInit
    assert not s._loop.running


# --- a hung NVML call; GPUs that give nothing -------------------------------------------------------------------


def sidecar_scrape(sampler: GpuSampler) -> str:
    """The GPU side of a sidecar with gpu.source nvml: the sampler's families and the source series, wired as
    exporter/gpu/service.py wires them."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(sampler))
    reg.register(GpuSourceCollector("nvml", False, active=sampler.active, assigned=lambda: sampler.expected))
    return generate_latest(reg).decode()


def wait_for(cond, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@contextlib.contextmanager
def hung_sampler() -> Iterator[tuple[GpuSampler, Clock, threading.Event]]:
    """A sampler thread (interval 10 ms, a fake clock standing still at 0) whose NVML power call blocks from its
    third poll on, until the test leaves (or sets the event it is given); stopped at the end."""
    clock, gate, hung = Clock(), threading.Event(), threading.Event()
    fake = FakeNvml(h100s(1, utilization=90, power_mw=600_000))
    power, calls = fake.nvmlDeviceGetPowerUsage, [0]

    def hanging(handle):  # the driver does not answer, not even with NVML_ERROR_TIMEOUT
        calls[0] += 1
        if calls[0] >= 3 and not gate.is_set():
            hung.set()
            gate.wait(30)
        return power(handle)

    fake.nvmlDeviceGetPowerUsage = hanging
    s = GpuSampler(fake, SamplerConfig(interval_seconds=0.01), env={"CUDA_VISIBLE_DEVICES": "0"}, clock=clock,
                   wall_clock=lambda: 1.7e9)
    s.start()
    try:
        assert hung.wait(5), "the sampler never reached the hanging call"
        yield s, clock, gate
    finally:
        gate.set()
        s.stop()


def test_a_hung_nvml_call_shows_as_nvml_down_and_no_values_past_the_bound_and_says_so_once(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with hung_sampler() as (s, clock, gate):
        bound = s.config.stale_after_seconds
        assert bound == 30.0  # max(3 x 0.01 s, the 30 s floor)
        clock.t = bound  # the last poll finished at 0: as old as a healthy slow poll may leave it
        text = sidecar_scrape(s)
        assert value(text, "posttrain_gpu_nvml_up") == 1 and value(text, "posttrain_gpu_utilization_ratio") == 0.9
        assert value(text, "posttrain_gpu_source_active", source="nvml") == 1
        assert not warnings(caplog)
        clock.t = bound + 0.5
        for _ in range(3):
            text = sidecar_scrape(s)
        assert value(text, "posttrain_gpu_nvml_up") == 0
        assert value(text, "posttrain_gpu_source_active", source="nvml") == 0
        for name in ("posttrain_gpu_up", "posttrain_gpu_utilization_ratio", "posttrain_gpu_power_watts",
                     "posttrain_gpu_memory_used_bytes", "posttrain_gpu_phase", "posttrain_gpu_visible_devices",
                     "posttrain_gpu_ecc_errors_total"):
            assert value(text, name) is None, name  # nothing frozen served as current
        assert value(text, "posttrain_gpu_sampler_last_poll_timestamp_seconds") == 1.7e9
        assert value(text, "posttrain_gpu_training_expected") == 1  # so PostTrainGPUDataMissing fires
        assert len(warnings(caplog)) == 1 and "no poll has finished for 30s" in warnings(caplog)[0]
        polls = s.snapshot().polls
        gate.set()  # the driver answers again
        assert wait_for(lambda: s.snapshot().polls > polls + 1)
        text = sidecar_scrape(s)
        assert value(text, "posttrain_gpu_nvml_up") == 1 and value(text, "posttrain_gpu_up", gpu="0") == 1
        assert value(text, "posttrain_gpu_source_active", source="nvml") == 1
    assert len(warnings(caplog)) == 1
    assert sum("polling again" in m for m in infos(caplog)) == 1


def test_a_sampler_polled_by_hand_is_never_called_stuck(caplog) -> None:
    """Staleness is about the thread's polls: a caller that polls when it likes (dump, the tests) sees its last."""
    clock = Clock()
    s = make(FakeNvml(h100s(1, utilization=90, power_mw=600_000)), clock, env={"CUDA_VISIBLE_DEVICES": "0"})
    s.poll_once()
    clock.t = 3600.0
    assert s.snapshot().nvml_up and s.active() and not warnings(caplog)


def _every_gpu_lost(gpus: list[FakeGpu]) -> None:
    for g in gpus:
        g.lost = True


def _every_read_fails(gpus: list[FakeGpu]) -> None:  # a wedged driver after an Xid: handles valid, no answers
    reads = [n for n in dir(FakeNvml) if n.startswith("nvmlDeviceGet")
             and n not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID")]
    for g in gpus:
        g.errors = dict.fromkeys(reads, pynvml.NVML_ERROR_UNKNOWN)


@pytest.mark.parametrize("break_gpus", [_every_gpu_lost, _every_read_fails], ids=["all_lost", "every_read_fails"])
def test_a_poll_that_read_no_gpu_makes_the_source_inactive_and_the_gpus_not_up(break_gpus, monkeypatch,
                                                                                caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    gpus = h100s(2, utilization=90, power_mw=600_000)
    fake = FakeNvml(gpus)
    service = GpuService("nvml", SamplerConfig())  # the source series as the CLI wires them
    service.reader._nvml = fake

    def scrape_service() -> str:
        reg = CollectorRegistry(auto_describe=False)
        for c in service.collectors():
            reg.register(c)
        return generate_latest(reg).decode()

    service.poll_once()
    assert value(scrape_service(), "posttrain_gpu_source_active", source="nvml") == 1
    break_gpus(gpus)
    for _ in range(5):
        fake.advance()
        service.poll_once()
    text = scrape_service()
    assert value(text, "posttrain_gpu_source_active", source="nvml") == 0
    assert value(text, "posttrain_gpu_up", gpu="0") == 0 and value(text, "posttrain_gpu_up", gpu="1") == 0
    for name in ("posttrain_gpu_utilization_ratio", "posttrain_gpu_power_watts", "posttrain_gpu_phase",
                 "posttrain_gpu_ecc_errors_total"):
        assert gpus_of(text, name) == set(), name
    # NVML itself answers (GpuIsLost, Unknown): nvml_up stays 1; the GPUs' own state is posttrain_gpu_up's
    assert value(text, "posttrain_gpu_nvml_up") == 1 and value(text, "posttrain_gpu_training_expected") == 1
    if break_gpus is _every_read_fails:
        said = [m for m in warnings(caplog) if "answered no field" in m]
        assert len(said) == 2, warnings(caplog)  # one per GPU, not one per poll
        for g in gpus:
            g.errors = {}
        service.poll_once()
        text = scrape_service()
        assert value(text, "posttrain_gpu_up", gpu="0") == 1
        assert value(text, "posttrain_gpu_source_active", source="nvml") == 1
        assert sum("answers again" in m for m in infos(caplog)) == 2


# --- which GPUs ------------------------------------------------------------------------------------


def test_visibility_syntax() -> None:
    assert parse_visibility("CUDA_VISIBLE_DEVICES", "all").entries is None
    for v in ("", " ", "none", "void", "NoNe", "-1"):
        assert parse_visibility("CUDA_VISIBLE_DEVICES", v).none, v
    assert parse_visibility("CUDA_VISIBLE_DEVICES", "0, 2").entries == ("0", "2")
    assert parse_visibility("CUDA_VISIBLE_DEVICES", "1,-1,2").entries == ("1",)  # CUDA stops at an invalid one
    assert parse_visibility("CUDA_VISIBLE_DEVICES", "GPU-ab12,MIG-x,3").entries == ("GPU-ab12", "3")
    assert visibility_from_env({}).entries is None
    both = {"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}
    assert visibility_from_env(both).source == "CUDA_VISIBLE_DEVICES"
    found = [(0, "GPU-aaaa-1"), (1, "GPU-bbbb-2"), (2, "GPU-bbcc-3")]
    assert select_devices(parse_visibility("X", "2,0,7"), found) == ([0, 2], ["7"])
    assert select_devices(parse_visibility("X", "GPU-bb"), found) == ([], ["GPU-bb"])  # ambiguous prefix
    assert select_devices(parse_visibility("X", "gpu-BBCC"), found) == ([2], [])


@pytest.mark.parametrize("spec,expected", [("1,3", {"1", "3"}), ("3,1,1", {"1", "3"}), ("2", {"2"})])
def test_cuda_visible_devices_indices(spec: str, expected: set[str]) -> None:
    s = make(FakeNvml(h100s(4)), env={"CUDA_VISIBLE_DEVICES": spec, "NVIDIA_VISIBLE_DEVICES": "all"})
    snap = s.poll_once()
    assert snap.visible_devices == len(expected)
    assert gpus_of(scrape(s), "posttrain_gpu_up") == expected


def test_cuda_visible_devices_uuids_and_prefixes() -> None:
    gpus = h100s(4)
    spec = f"{gpus[3].uuid},{gpus[1].uuid[:12]}"
    s = make(FakeNvml(gpus), env={"CUDA_VISIBLE_DEVICES": spec})
    s.poll_once()
    text = scrape(s)
    assert gpus_of(text, "posttrain_gpu_up") == {"1", "3"}
    assert value(text, "posttrain_gpu_up", gpu="3", UUID=gpus[3].uuid) == 1


def test_unmatched_entries_are_logged_once(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    s = make(FakeNvml(h100s(2)), env={"CUDA_VISIBLE_DEVICES": "1,5,GPU-ffff"})
    s.poll_once()
    s.poll_once()
    assert [g.index for g in s.snapshot().gpus] == [1]
    assert len(warnings(caplog)) == 1 and "5,GPU-ffff match no GPU" in warnings(caplog)[0]


def test_nvidia_visible_devices_in_a_container_and_on_the_host() -> None:
    # In a container the runtime already applied the host index 3: NVML lists that one GPU as 0.
    s = make(FakeNvml(h100s(1)), env={"NVIDIA_VISIBLE_DEVICES": "3"})
    assert s.poll_once().visible_devices == 1
    # On a host with 4 GPUs the same setting picks index 3.
    s = make(FakeNvml(h100s(4)), env={"NVIDIA_VISIBLE_DEVICES": "3"})
    assert [g.index for g in s.poll_once().gpus] == [3]
    gpus = h100s(4)
    s = make(FakeNvml(gpus), env={"NVIDIA_VISIBLE_DEVICES": f"{gpus[0].uuid},{gpus[2].uuid}"})
    assert [g.index for g in s.poll_once().gpus] == [0, 2]


@pytest.mark.parametrize("env", [{"CUDA_VISIBLE_DEVICES": ""}, {"NVIDIA_VISIBLE_DEVICES": "void"},
                                 {"NVIDIA_VISIBLE_DEVICES": "none"}])
def test_no_visible_gpu_leaves_nvml_alone(env: dict[str, str], caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FakeNvml(h100s(2))
    s = make(fake, env=env)
    for _ in range(3):
        s.poll_once()
    assert sum(fake.calls.values()) == 0
    text = scrape(s)
    assert value(text, "posttrain_gpu_visible_devices") == 0 and value(text, "posttrain_gpu_nvml_up") == 0
    assert len(infos(caplog)) == 1 and "no GPU visible" in infos(caplog)[0]
    assert make(fake, visible_devices="", env={"CUDA_VISIBLE_DEVICES": "0"}).visibility.none


# --- phases ----------------------------------------------------------------------------------------


def rl_trace(cycles: int, gen_s: int = 90, idle_s: int = 15, train_s: int = 60, seed: int = 7):
    """GRPO-like cycles at 1 sample/s: generation (~380 W), a pause (weight sync, rewards), training (~640 W)."""
    rng = random.Random(seed)
    util, power, truth = [], [], []
    for _ in range(cycles):
        for phase, n, u, watts in (("generation", gen_s, (92, 100), (355, 405)), ("idle", idle_s, (0, 2), (85, 95)),
                                   ("training", train_s, (95, 100), (605, 675))):
            for _ in range(n):
                util.append(rng.randint(*u))
                power.append(rng.uniform(*watts))
                truth.append(phase)
    return util, power, truth


def test_phase_rule_on_alternating_generation_and_training() -> None:
    util, power, truth = rl_trace(8)
    tracker = PhaseTracker(PhaseConfig())
    got = [tracker.update(float(t), u / 100, p) for t, (u, p) in enumerate(zip(util, power, strict=True))]
    first_training = truth.index("training")
    # Before the window has seen training, a busy GPU is called training (the documented limit).
    assert {r.phase for r in got[:90]} == {"training"}
    tail = list(zip([r.phase for r in got], truth, strict=True))[first_training:]
    assert all(a == b for a, b in tail), [i for i, (a, b) in enumerate(tail) if a != b][:5]
    last = got[-1]
    assert last.generation_ratio == pytest.approx(truth[-600:].count("generation") / 600, abs=0.01)
    assert sum(last.seconds) == pytest.approx(len(truth) - 1)
    busy = sorted(p for p, tr in zip(power[-601:], truth[-601:], strict=True) if tr != "idle")
    # Prometheus's quantile (linear between the nearest ranks), as the DCGM recording rules compute it
    rank = 0.9 * (len(busy) - 1)
    low = math.floor(rank)
    assert last.reference_watts == pytest.approx(busy[low] + (busy[low + 1] - busy[low]) * (rank - low))


def test_phase_hysteresis_and_a_pinned_reference() -> None:
    t = PhaseTracker(PhaseConfig())
    assert t.update(0, 1.0, 600).phase == "training"
    assert t.update(1, 1.0, 300).phase == "generation"
    assert t.update(2, 1.0, 450).phase == "generation"  # 0.75 x ref: in the band, stays
    assert t.update(3, 1.0, 590).phase == "training"
    assert t.update(4, 1.0, 450).phase == "training"  # in the band, stays
    assert t.update(5, 0.01, 80).phase == "idle"
    assert t.update(6, 1.0, 450).phase == "training"  # the last busy phase
    # A job that only generates: relative to itself it looks like training, unless the reference is pinned.
    free, pinned = PhaseTracker(), PhaseTracker(PhaseConfig(reference_watts=650))
    for i in range(30):
        assert free.update(i, 0.98, 380).phase == "training"
        assert pinned.update(i, 0.98, 380).phase == "generation"
    assert pinned.update(30, 1.0, 640).reference_watts == 650
    with pytest.raises(ValueError):
        PhaseConfig(generation_power_ratio=0.9, training_power_ratio=0.8)


def test_phase_time_is_capped_across_a_stall() -> None:
    t = PhaseTracker(PhaseConfig(max_gap_seconds=5), interval_seconds=1)
    t.update(0, 1.0, 600)
    r = t.update(3600, 1.0, 600)  # the sampler was stuck for an hour
    assert r.seconds[1] == 5


def test_phases_through_the_sampler() -> None:
    util, power, truth = rl_trace(6)  # 990 s: the last 600 s are past the first (misread) generation
    gpus = h100s(2)
    gpus[0].utilization, gpus[0].power_mw = util, [p * 1000 for p in power]
    gpus[1].utilization, gpus[1].power_mw = 99, 650_000
    fake = FakeNvml(gpus)
    clock = Clock()
    s = make(fake, clock)
    checked = 0
    for i in range(len(truth)):
        clock.t = float(i)
        s.poll_once()
        if i > truth.index("training"):
            g0, g1 = s.snapshot().gpus
            assert (g0.phase.phase, g1.phase.phase) == (truth[i], "training"), i
            checked += 1
            if i % 97 == 0:  # and as exported: a state set, 1 for the current phase
                sm = samples(scrape(s))
                for phase in ("generation", "training", "idle"):
                    key = ("posttrain_gpu_phase", frozenset({"gpu": "0", "UUID": gpus[0].uuid,
                                                             "model_name": gpus[0].name, "phase": phase}.items()))
                    assert sm[key] == (phase == truth[i]), i
        fake.advance()
    assert checked > 800
    text = scrape(s)
    assert value(text, "posttrain_gpu_generation_time_ratio", gpu="0") == pytest.approx(
        truth[-600:].count("generation") / 600, abs=0.01)
    assert value(text, "posttrain_gpu_generation_time_ratio", gpu="1") == 0
    total = sum(value(text, "posttrain_gpu_phase_seconds_total", gpu="0", phase=p) for p in ("generation",
                                                                                                "training", "idle"))
    assert total == pytest.approx(len(truth) - 1)
    assert 600 < value(text, "posttrain_gpu_phase_reference_watts", gpu="0") < 680


# --- the exposition --------------------------------------------------------------------------------


def _check_with_promtool(text: str) -> None:
    promtool = require_binary("promtool")
    res = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), (res.stdout + res.stderr).decode()


def test_promtool_accepts_every_family() -> None:
    gpus = h100s(3, utilization=95, power_mw=640_000, ecc={(0, 0): 1}, retired_pages={1: [1]},
                 throttle_reasons=0x4)
    gpus[1].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_TIMEOUT
    fake = FakeNvml(gpus)
    clock = Clock()
    s = make(fake, clock)
    for i in range(5):
        clock.t = i
        if i == 3:
            gpus[2].lost = True
        s.poll_once()
        fake.advance()
    text = scrape(s)
    names = {fam.name for fam in text_string_to_metric_families(text) if fam.samples}
    assert len(names) == 27, sorted(names)
    _check_with_promtool(text)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, 0.0),  # a pod without GPUs: no visible-devices variable at all
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, 0.0),
    ({"CUDA_VISIBLE_DEVICES": ""}, 0.0),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, 1.0),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-1234"}, 1.0),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 1.0),
])
def test_gpus_are_expected_only_where_some_are_assigned(env: dict[str, str], expected: float) -> None:
    """PostTrainNVMLDown reads this: NVML absent on a pod without GPUs is no fault."""
    s = make(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), env=env)
    s.poll_once()
    assert value(scrape(s), "posttrain_gpu_expected") == expected


def test_promtool_accepts_the_nvml_down_exposition() -> None:
    s = make(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    s.poll_once()
    _check_with_promtool(scrape(s))


def _input_series(pod: str, healthy: str, broken: str, minutes: tuple[int, int]) -> list[dict[str, str]]:
    """A sidecar's scrapes as promtool input series: `healthy` for minutes[0] samples, then `broken` for
    minutes[1] (a series absent from one is `_` there), with the labels Prometheus adds, and the run's series."""
    target = {"job": "posttrain", "instance": f"{pod}:9847", "namespace": "ml", "pod": pod}
    before, after = samples(healthy), samples(broken)
    out = []
    for name, labels in sorted(set(before) | set(after), key=str):
        lbls = {**dict(labels), **target}
        vals = [f"{before[name, labels]:g}" if (name, labels) in before else "_"] * minutes[0] \
            + [f"{after[name, labels]:g}" if (name, labels) in after else "_"] * minutes[1]
        out.append({"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(lbls.items())) + "}",
                    "values": " ".join(vals)})
    out.append({"series": "posttrain_run_finished{" + ", ".join(f'{k}="{v}"' for k, v in
                                                               {"run": f"r-{pod}", **target}.items()) + "}",
                "values": " ".join(["0"] * sum(minutes))})
    return out


def test_gpu_data_missing_fires_for_a_sidecar_whose_nvml_is_stale_or_read_no_gpu(tmp_path) -> None:
    """The sidecars' own expositions through the shipped rules (promtool): healthy for 5 minutes, then a hung NVML
    call, every GPU lost, every read failing; and one that stays healthy. PostTrainGPUDataMissing fires for the
    three (its `for` is 3m), PostTrainNVMLDown (10m) for the hung one only: NVML itself answers the other two."""
    promtool = require_binary("promtool")
    series: list[dict[str, str]] = []
    with hung_sampler() as (s, clock, _):
        healthy = sidecar_scrape(s)
        clock.t = s.config.stale_after_seconds + 1
        series += _input_series("hung-0", healthy, sidecar_scrape(s), (5, 16))
    for pod, break_gpus in (("lost-0", _every_gpu_lost), ("unread-0", _every_read_fails), ("ok-0", None)):
        gpus = h100s(2, utilization=90, power_mw=600_000)
        clock = Clock()
        s = make(FakeNvml(gpus), clock, env={"CUDA_VISIBLE_DEVICES": "0,1"})
        s.poll_once()
        healthy = sidecar_scrape(s)
        if break_gpus is not None:
            break_gpus(gpus)
        for _ in range(3):
            clock.t += 1
            s.poll_once()
        series += _input_series(pod, healthy, sidecar_scrape(s), (5, 16))

    def firing(alert: str, *pods: str) -> dict:
        return {"expr": f'ALERTS{{alertname="{alert}", alertstate="firing"}}', "eval_time": "20m",
                "exp_samples": [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}",
                                 "value": 1} for labels in (
                    {"__name__": "ALERTS", "alertname": alert, "alertstate": "firing", "severity": "warning",
                     **({"run": f"r-{p}"} if alert == "PostTrainGPUDataMissing" else {"job": "posttrain"}),
                     "instance": f"{p}:9847", "namespace": "ml", "pod": p} for p in pods)]}

    path = tmp_path / "stale.test.yml"
    path.write_text(yaml.safe_dump({
        "rule_files": [str(REPO / "rules" / "posttrain.recording.yml"), str(REPO / "rules" / "posttrain.alerts.yml")],
        "evaluation_interval": "1m",
        "group_eval_order": ["posttrain.recording", "posttrain.gpu", "posttrain.pages", "posttrain.warnings",
                             "posttrain.exporter"],
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": "ALERTS", "eval_time": "4m", "exp_samples": []},
            firing("PostTrainGPUDataMissing", "hung-0", "lost-0", "unread-0"),
            firing("PostTrainNVMLDown", "hung-0"),
        ]}]}, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr


# --- the one table of GPU fields (exporter/gpu/fields.py) -------------------------------------------------------


def test_every_field_of_the_table_is_read_and_rendered_with_its_help_and_type() -> None:
    """The sampler's reads and the collector's families are the table's: a fake-NVML scrape has every field, under
    its family, type and HELP, and every NVML call of the table is made once per GPU and poll."""
    from exporter.gpu.fields import FIELDS, READS
    from exporter.gpu.sampler import GpuReading

    fake = FakeNvml(h100s(2, utilization=50, power_mw=350_000))
    s = make(fake)
    s.poll_once()
    families = {f.name: f for f in text_string_to_metric_families(scrape(s))}
    assert {f.attr for f in FIELDS} <= set(GpuReading._fields)
    for f in FIELDS:
        fam = families[f.family]
        assert (fam.type, fam.documentation) == (f.kind, f.help), f.family
        assert {dict(x.labels)["gpu"] for x in fam.samples} == {"0", "1"}, f.family
    assert {r.call for r in READS} == {f.call for f in FIELDS}
    for r in READS:
        assert fake.calls[r.call] == 2, r.call  # memory used and total share one call


def test_the_docs_field_table_is_the_tables_and_a_stale_one_fails_generate_check() -> None:
    from exporter.gpu.fields import BEGIN, DOC, END, FIELDS, render_doc, render_doc_table

    text = DOC.read_text(encoding="utf-8")
    assert render_doc(text) == text, "docs/gpu.md's field table is stale: run python scripts/generate.py"
    table = text.split(BEGIN + "\n", 1)[1].split(END, 1)[0]
    assert table == render_doc_table()
    for f in FIELDS:
        assert f"`{f.family}" in table and f.help in table and f.call in table and f.dcgm in table
    stale = text.replace(FIELDS[0].help, "edited by hand", 1)
    assert render_doc(stale) == text
    repo = DOC.parents[1]
    try:
        DOC.write_text(stale, encoding="utf-8")
        done = subprocess.run([sys.executable, "scripts/generate.py", "--check"], cwd=repo, capture_output=True,
                              text=True)
    finally:
        DOC.write_text(text, encoding="utf-8")
    assert done.returncode == 1 and "docs/gpu.md" in done.stderr, done.stderr


def test_a_mig_instance_is_an_assigned_gpu_that_gives_no_data_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """NVIDIA_VISIBLE_DEVICES naming a MIG instance: GPUs are assigned (expected, so the GPU-data alert can fire), none
    is sampled (NVML gives an instance no utilisation or power), and the log says that once, naming it (it read as a
    pod without GPUs: `expected` 0, no alert, and "NVIDIA_VISIBLE_DEVICES is empty/none")."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    mig = "MIG-4f2a6c1e-90b3-5d7e-8a21-3c5b7d9e1f20"
    fake = FakeNvml(h100s(1))
    s = make(fake, env={"NVIDIA_VISIBLE_DEVICES": mig})
    for _ in range(3):
        s.poll_once()
    assert s.expected and not s.visibility.none
    text = scrape(s)
    assert value(text, "posttrain_gpu_expected") == 1
    assert value(text, "posttrain_gpu_up") is None and not s.active()
    said = [r.getMessage() for r in caplog.records if mig in r.getMessage()]
    assert len(said) == 1 and "not sampled" in said[0] and "PostTrainGPUDataMissing" in said[0], said
    assert not any("empty/none" in r.getMessage() for r in caplog.records)
