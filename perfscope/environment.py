"""The machine a run happened on: GPU, driver, toolchain versions and the clocks as found.

``ClockReader`` reads the SM clock (NVML through nvidia-ml-py, else nvidia-smi) and only
reads it: nothing here changes a clock, a power limit or a mode. The GPU is named to NVML
and nvidia-smi by its PCI bus id, not by CUDA's device index: with CUDA_VISIBLE_DEVICES
set, or on a node whose GPUs CUDA and NVML number differently, an index would read
another card's clock.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
from typing import Any

from perfscope.build import nvrtc_version
from perfscope.kernels.launch import require_gpu
from perfscope.manifest import Environment
from perfscope.version import installed_version

log = logging.getLogger(__name__)


class ClockReader:
    """The current SM clock in MHz from NVML (nvidia-ml-py), else nvidia-smi, else None."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self._smi = shutil.which("nvidia-smi")
        self._bus_id = self._pci_bus_id()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = self._nvml_handle(pynvml)
            self._nvml = pynvml
        except Exception as exc:  # no NVML is a missing figure, not a failure
            log.info("NVML unavailable (%s); SM clock from nvidia-smi", exc)

    def _nvml_handle(self, nvml: Any) -> Any:
        if self._bus_id:
            return nvml.nvmlDeviceGetHandleByPciBusId(self._bus_id.encode())
        # No bus id from CUDA: NVML's index is the best guess left.
        return nvml.nvmlDeviceGetHandleByIndex(self._device_index())

    @staticmethod
    def _pci_bus_id() -> str | None:
        """The current CUDA device's PCI bus id ("0000:3B:00.0"), None if CUDA cannot say."""
        try:
            import cupy

            return str(cupy.cuda.Device().pci_bus_id)
        except Exception:  # no CuPy or no device: the clock is a missing figure
            return None

    @staticmethod
    def _device_index() -> int:
        import cupy

        return cupy.cuda.Device().id

    def sm_mhz(self) -> float | None:
        """The SM clock now, in MHz; None when neither NVML nor nvidia-smi can say."""
        if self._nvml is not None:
            try:
                return float(self._nvml.nvmlDeviceGetClockInfo(self._handle,
                                                               self._nvml.NVML_CLOCK_SM))
            except Exception:
                return None
        if self._smi:
            try:
                out = subprocess.run([self._smi, "--query-gpu=clocks.sm",
                                      "--format=csv,noheader,nounits",
                                      f"--id={self._bus_id or self._device_index()}"],
                                     capture_output=True, text=True, timeout=10)
                return float(out.stdout.strip().splitlines()[0])
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return None
        return None

    def energy_mj(self) -> int | None:
        """The card's energy counter since the driver loaded, in mJ (NVML only: nvidia-smi
        has no such query); None where NVML cannot say. Differences of two readings are what
        the card drew between them, all of it, not one kernel's share."""
        if self._nvml is None:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # a card or driver without the counter: a missing figure
            return None

    def info(self) -> dict[str, str]:
        """Driver version and clock limits as found (nothing here changes them)."""
        out: dict[str, str] = {}
        nv = self._nvml
        if nv is None:
            return out
        for key, fn in (
            ("driver", lambda: nv.nvmlSystemGetDriverVersion()),
            ("sm_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(self._handle,
                                                                       nv.NVML_CLOCK_SM)),
            ("mem_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(self._handle,
                                                                        nv.NVML_CLOCK_MEM)),
            ("sm_clock_app_mhz", lambda: nv.nvmlDeviceGetApplicationsClock(self._handle,
                                                                            nv.NVML_CLOCK_SM)),
            ("power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementLimit(self._handle) / 1000),
        ):
            try:
                value = fn()
                out[key] = value.decode() if isinstance(value, bytes) else str(value)
            except Exception:
                continue
        return out


def _version(dist: str) -> str:
    return installed_version(dist) or ""


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def collect_environment(cp: Any | None = None) -> Environment:
    """GPU, driver, CUDA, NVRTC, CuPy and cuBLAS versions, and the clocks as found."""
    cp = cp or require_gpu()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    clock = ClockReader()
    info = clock.info()
    try:
        from cupy_backends.cuda.libs import cublas

        cublas_v = str(cublas.getVersion(dev.cublas_handle))
    except Exception:
        cublas_v = ""
    extra = {k: v for k, v in info.items() if k != "driver"}
    extra["nvidia-cuda-nvrtc"] = _version("nvidia-cuda-nvrtc")
    extra["nvidia-cuda-runtime"] = _version("nvidia-cuda-runtime")
    idle = clock.sm_mhz()
    if idle is not None:
        extra["sm_clock_at_start_mhz"] = str(idle)
    extra["host"] = platform.node()
    # Recorded because it changes what the FP32 reference computes (require_gpu refuses it).
    extra["CUPY_TF32"] = os.environ.get("CUPY_TF32", "")
    return Environment(
        gpu=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=f"{dev.compute_capability[:-1]}.{dev.compute_capability[-1]}",
        sm_count=int(props["multiProcessorCount"]),
        driver=info.get("driver", ""),
        cuda_driver=_cuda_version(cp.cuda.runtime.driverGetVersion()),
        cuda_runtime=_cuda_version(cp.cuda.runtime.runtimeGetVersion()),
        nvrtc=nvrtc_version(),
        cupy=cp.__version__,
        cublas=cublas_v,
        cuda_bindings=_version("cuda-bindings"),
        ml_dtypes=_version("ml_dtypes"),
        python=platform.python_version(),
        extra=extra)
