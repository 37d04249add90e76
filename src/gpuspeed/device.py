"""The device we run on: detection, properties, clocks, backends and the datasheet table.

Everything that wants to know "where are we" asks here, so a machine without a GPU is handled in one
place: `get_device()` returns a `DeviceInfo` with kind "cpu" and every study falls back from that.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import platform
import re
import sys
from dataclasses import asdict, dataclass, field

from gpuspeed.errors import UserError, one_line


# ---------------------------------------------------------------------------------------------------
# Datasheet peaks. Dense (no sparsity) figures from each vendor datasheet, tensor rates with FP32
# accumulate (what torch uses). Units: GB/s for memory, TFLOP/s for arithmetic. None = no such unit.
# Patterns are matched in order against the name torch/NVML reports, most specific first.
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Datasheet:
    name: str
    mem_GBps: float
    fp32_TFLOPs: float
    tf32_TFLOPs: float | None
    fp16_TFLOPs: float | None
    bf16_TFLOPs: float | None
    fp64_TFLOPs: float
    fp8_TFLOPs: float | None = None
    source: str = "vendor datasheet, dense"

    def peak(self, unit: str) -> float | None:
        """Peak for a unit name ('mem', 'fp32', 'tf32', 'fp16', 'bf16', 'fp64', 'fp8')."""
        return getattr(self, "mem_GBps" if unit == "mem" else f"{unit}_TFLOPs")


_H100_SXM_RATES = dict(fp32_TFLOPs=66.9, tf32_TFLOPs=494.7, fp16_TFLOPs=989.4, bf16_TFLOPs=989.4,
                       fp64_TFLOPs=33.5, fp8_TFLOPs=1978.9)

DATASHEETS: list[tuple[str, Datasheet]] = [
    # Grace Hopper: an H100's rates; its HBM3 (96 GB, "GH200 480GB") or HBM3e (144 GB) memory, not an H200's
    (r"GH200.*(144G|HBM3e)", Datasheet("NVIDIA GH200 144GB HBM3e", 4900, **_H100_SXM_RATES)),
    (r"GH200", Datasheet("NVIDIA GH200 96GB HBM3", 4000, **_H100_SXM_RATES)),
    (r"H200 NVL", Datasheet("NVIDIA H200 NVL", 4800, 60.0, 417.5, 835.5, 835.5, 30.0, 1670.5)),
    (r"H200", Datasheet("NVIDIA H200 SXM", 4800, **_H100_SXM_RATES)),
    (r"H100.*PCIe", Datasheet("NVIDIA H100 PCIe", 2000, 51.2, 378.0, 756.0, 756.0, 25.6, 1513.0)),
    (r"H100.*NVL", Datasheet("NVIDIA H100 NVL", 3900, 60.0, 417.5, 835.5, 835.5, 30.0, 1670.5)),
    (r"H100", Datasheet("NVIDIA H100 SXM", 3350, **_H100_SXM_RATES)),
    (r"A100.*80GB.*PCIe|A100.*PCIe.*80GB",
     Datasheet("NVIDIA A100 80GB PCIe", 1935, 19.5, 156.0, 312.0, 312.0, 9.7)),
    (r"A100.*80GB", Datasheet("NVIDIA A100 80GB SXM", 2039, 19.5, 156.0, 312.0, 312.0, 9.7)),
    (r"A100", Datasheet("NVIDIA A100 40GB", 1555, 19.5, 156.0, 312.0, 312.0, 9.7)),
    (r"L40S", Datasheet("NVIDIA L40S", 864, 91.6, 183.0, 362.05, 362.05, 1.43, 733.0)),
    (r"\bL4\b", Datasheet("NVIDIA L4", 300, 30.3, 60.0, 121.0, 121.0, 0.49, 242.5)),
    (r"A10G", Datasheet("NVIDIA A10G", 600, 35.0, 35.0, 70.0, 70.0, 1.09,
                        source="AWS G5 figures (no public NVIDIA datasheet), dense")),
    (r"\bA10\b", Datasheet("NVIDIA A10", 600, 31.2, 62.5, 125.0, 125.0, 0.98)),
    (r"\bT4\b", Datasheet("NVIDIA T4", 320, 8.1, None, 65.0, None, 0.25)),
    (r"RTX 4090(?!.*Laptop)", Datasheet("NVIDIA GeForce RTX 4090", 1008, 82.6, 82.6, 165.2, 165.2, 1.29,
                                         330.3)),
    (r"RTX 4070 Laptop", Datasheet("NVIDIA GeForce RTX 4070 Laptop (8 GB)", 256, 20.0, 20.0, 40.1, 40.1,
                                   0.31, 80.2, source="Ada whitepaper rates at 2175 MHz max boost, dense")),
    (r"RTX 4070(?! Ti| SUPER)", Datasheet("NVIDIA GeForce RTX 4070 (12 GB)", 504.2, 29.1, 29.1, 58.3, 58.3,
                                          0.45, 116.6)),
]


def datasheet_for(name: str | None) -> Datasheet | None:
    """The datasheet entry whose pattern matches a device name, or None ("no datasheet entry")."""
    if not name:
        return None
    for pattern, sheet in DATASHEETS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return sheet
    return None


def pct_of_datasheet(value: float, name: str | None, unit: str) -> float | None:
    """value as a percentage of the datasheet peak for `unit`, or None when there is no entry."""
    sheet = datasheet_for(name)
    peak = sheet.peak(unit) if sheet else None
    return 100.0 * value / peak if peak else None


# ---------------------------------------------------------------------------------------------------
# Device detection
# ---------------------------------------------------------------------------------------------------


@dataclass
class DeviceInfo:
    kind: str  # "cuda" or "cpu"
    name: str
    cc: str | None = None
    sms: int | None = None
    mem_bytes: int | None = None
    l2_bytes: int | None = None
    driver: str | None = None
    cuda: str | None = None
    clocks: dict = field(default_factory=dict)
    note: str | None = None

    @property
    def slug(self) -> str:
        """Folder name for results: 'nvidia-h200', 'nvidia-geforce-rtx-4070', 'cpu'."""
        return device_slug(self.name) if self.kind == "cuda" else "cpu"

    @property
    def datasheet(self) -> Datasheet | None:
        return datasheet_for(self.name) if self.kind == "cuda" else None

    def to_dict(self) -> dict:
        return asdict(self)


def device_slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug if slug.startswith("nvidia") else f"nvidia-{slug}" if slug else "unknown"


def cuda_available() -> bool:
    try:
        import torch
    except Exception:  # not installed, or broken (torch's loader raises OSError/ValueError for a CUDA library)
        return False
    return bool(torch.cuda.is_available())


def why_cpu() -> str:
    """Why a run is on the CPU, in words, for the notes that say so: "no CUDA device", or "--device cpu" on a machine
    with one (where "no CUDA device" read as if CUDA were broken)."""
    return "--device cpu" if cuda_available() else "no CUDA device"


def why_no_device(env=None) -> str:
    """Why a CUDA build of torch sees no GPU: CUDA_VISIBLE_DEVICES where it hides them all (empty, or a first entry
    that is no device: '-1'), else no driver or device (a set CUDA_VISIBLE_DEVICES named, as it may name none here)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return "no driver or device visible"
    first = visible.split(",")[0].strip()
    if not (first.isdigit() or first.upper().startswith(("GPU-", "MIG-"))):  # CUDA stops at the first entry it rejects
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU (unset it, or name one: 0)"
    return f"no driver or device visible (CUDA_VISIBLE_DEVICES={visible!r} is set: it may name no GPU that is here)"


def resolve_device(device: str = "auto") -> str:
    """'auto' -> 'cuda' when a GPU is usable, else 'cpu'; 'cuda' without a GPU is a user error."""
    device = (str(device) if device is not None else "auto").lower()  # torch.device("cuda") reads "cuda"
    if device.startswith("cuda:"):
        raise UserError(f"device {device!r}: gpuspeed runs on the current CUDA device; choose it with "
                        "torch.cuda.set_device or CUDA_VISIBLE_DEVICES and pass 'cuda'")
    if device not in ("auto", "cuda", "cpu"):
        raise UserError(f"unknown device {device!r}: use cpu, cuda or auto")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise UserError("device 'cuda' asked for, but no CUDA device is usable here (see `gpuspeed doctor`)")
    return device


@functools.lru_cache(maxsize=1)
def _nvml():
    """The initialised pynvml module, or None when NVML is not installed or not usable."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def pci_bus_id(domain: int, bus: int, device: int) -> str:
    """A PCI address in NVML's own form (nvmlPciInfo_t.busId): '00000000:3B:00.0'."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def _handle_from_props(nvml, props):
    """NVML's handle for the GPU torch describes by `props`: by PCI bus id, else by UUID, else None.

    CUDA numbers devices after CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, NVML numbers them all in bus
    order, so an index means different GPUs to the two; the bus id and the UUID do not."""
    ids = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    if None not in ids:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id(*ids).encode())
        except Exception:
            pass
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"  # torch leaves NVML's prefix off
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
        except Exception:
            pass
    return None


@functools.lru_cache(maxsize=None)
def _handle_for_cuda_index(index: int):
    nvml = _nvml()
    if nvml is None:
        return None
    import torch

    return _handle_from_props(nvml, torch.cuda.get_device_properties(index))


def current_index() -> int | None:
    """The current CUDA device (torch's numbering), or None without CUDA. It is per thread: a thread that
    polls NVML for another must be handed this index, since its own current device is 0."""
    if not cuda_available():
        return None
    import torch

    return int(torch.cuda.current_device())


def nvml_device(index: int | None = None):
    """(pynvml, handle) for CUDA device `index` (torch's numbering; None: the current device), or None when
    NVML or CUDA is unavailable or the GPU cannot be matched. Every per-GPU NVML read goes through here, so
    clocks, cap counters and memory come from the GPU being measured, not NVML's GPU 0."""
    if _nvml() is None or not cuda_available():
        return None
    handle = _handle_for_cuda_index(current_index() if index is None else int(index))
    return None if handle is None else (_nvml(), handle)


def read_clocks(index: int | None = None) -> dict:
    """Current and max SM and memory clocks in MHz from NVML; {} when NVML is unavailable."""
    found = nvml_device(index)
    if found is None:
        return {}
    nvml, handle = found
    out = {}
    for key, fn, clk in [
        ("sm_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
        ("sm_max_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_SM"),
        ("mem_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
        ("mem_max_mhz", "nvmlDeviceGetMaxClockInfo", "NVML_CLOCK_MEM"),
    ]:
        try:
            out[key] = int(getattr(nvml, fn)(handle, getattr(nvml, clk)))
        except Exception:
            pass
    return out


def capped_ns(index: int | None = None) -> dict:
    """Nanoseconds, counted since the driver loaded, that the clocks were held down by the power cap and
    by heat (NVML violation counters): {"power": ns, "thermal": ns}, either missing where NVML or the
    counter is unavailable. Two reads bracket how long a cap acted in between, which clock reads before
    and after a run miss (a power cap can act and let go within one run)."""
    found = nvml_device(index)
    if found is None:
        return {}
    nvml, handle = found
    out = {}
    for key, policy in (("power", "NVML_PERF_POLICY_POWER"), ("thermal", "NVML_PERF_POLICY_THERMAL")):
        try:
            out[key] = int(nvml.nvmlDeviceGetViolationStatus(handle, getattr(nvml, policy)).violationTime)
        except Exception:
            pass
    return out


def sm_clock_mhz(index: int | None = None) -> int | None:
    """The SM clock now, from NVML, or None."""
    found = nvml_device(index)
    if found is None:
        return None
    nvml, handle = found
    try:
        return int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
    except Exception:
        return None


def nvml_used_bytes(index: int | None = None) -> int | None:
    """Device-level used memory (all processes) from NVML, or None."""
    found = nvml_device(index)
    if found is None:
        return None
    nvml, handle = found
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:
        return None


NVML_NOT_AVAILABLE = 2**64 - 1  # NVML's usedGpuMemory where it cannot say (some containers, Windows' WDDM)


def gpu_processes(index: int | None = None) -> list[dict] | None:
    """Processes holding a compute context on the GPU, from NVML: [{"pid": int, "used_bytes": int or None}],
    or None where NVML cannot list them."""
    found = nvml_device(index)
    if found is None:
        return None
    nvml, handle = found
    try:
        listed = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    out = []
    for proc in listed:
        used = getattr(proc, "usedGpuMemory", None)
        ok = isinstance(used, int) and 0 <= used < NVML_NOT_AVAILABLE
        out.append({"pid": int(proc.pid), "used_bytes": int(used) if ok else None})
    return out


def process_sm_busy(index: int | None = None, since_us: int = 0) -> dict[int, int] | None:
    """pid -> the highest SM utilisation (%) NVML sampled for that process since `since_us` (host clock, in
    microseconds since the epoch); {} when it sampled none; None where NVML cannot tell."""
    found = nvml_device(index)
    if found is None:
        return None
    nvml, handle = found
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, int(since_us))
    except Exception as exc:
        not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", None)
        return {} if not_found is not None and getattr(exc, "value", None) == not_found else None
    busy: dict[int, int] = {}
    for s in samples:
        if int(getattr(s, "timeStamp", since_us)) >= since_us:
            busy[int(s.pid)] = max(busy.get(int(s.pid), 0), int(s.smUtil))
    return busy


def get_device(device: str = "auto", index: int | None = None) -> DeviceInfo:
    """Describe the device a study will run on (the current CUDA device, or the CPU)."""
    kind = resolve_device(device)
    if kind == "cpu":
        note = None if cuda_available() else "no CUDA device: running on the CPU"
        return DeviceInfo(kind="cpu", name=host_name(), mem_bytes=_host_mem_bytes(), note=note)
    import torch

    idx = torch.cuda.current_device() if index is None else index
    p = torch.cuda.get_device_properties(idx)
    driver = None
    nvml = _nvml()
    if nvml is not None:
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:
            pass
    return DeviceInfo(
        kind="cuda", name=p.name, cc=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
        mem_bytes=int(p.total_memory), l2_bytes=int(getattr(p, "L2_cache_size", 0)) or None,
        driver=driver, cuda=torch.version.cuda, clocks=read_clocks(idx),
    )


def host_name() -> str:
    """The CPU's name as get_device("cpu") gives it, without importing torch (its CUDA check costs ~1.3 s)."""
    return platform.processor() or platform.machine() or "cpu"


def _host_mem_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def l2_bytes(default: int = 64 * 2**20) -> int:
    """L2 size of the current CUDA device (a generous default when it cannot be read)."""
    if cuda_available():
        import torch

        size = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
        if size:
            return int(size)
    return default


# ---------------------------------------------------------------------------------------------------
# Library versions and backends
# ---------------------------------------------------------------------------------------------------

_VERSIONED = ["numpy", "torch", "triton", "cupy", "numba", "jax", "transformers", "pynvml"]


def versions() -> dict:
    """Versions of Python and every library gpuspeed knows about (None when not installed)."""
    out = {"python": platform.python_version(), "gpuspeed": _own_version()}
    for name in _VERSIONED:
        found = _installed(name)
        out[name] = found[0][1] if found else None
        if len(found) > 1:
            # two distributions install the module (triton beside pytorch-triton): the one imported is the one that ran
            out[name] = getattr(sys.modules.get(name), "__version__", None) or out[name]
    if cuda_available():
        import torch

        out["cuda_runtime"] = torch.version.cuda
    return out


# the distributions that install each module: torch's nightly and ROCm wheels bring the `triton` module as pytorch-triton
_DISTS = {"cupy": ["cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"], "pynvml": ["nvidia-ml-py"],
          "triton": ["triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"]}
# what to pip install where the package name alone is the wrong advice (plain `cupy` builds from source)
_INSTALL = {"cupy": "cupy-cuda12x, or cupy-cuda13x to match a CUDA 13 driver", "numba": "numba numba-cuda",
            "pynvml": "nvidia-ml-py"}


def _installed(module: str) -> list[tuple[str, str]]:
    """The installed distributions that provide `module`, with their versions, in _DISTS's order."""
    from importlib import metadata

    found = []
    for dist in _DISTS.get(module, [module]):
        try:
            found.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            continue
    return found


def _dist(module: str) -> tuple[str, str] | None:
    """The installed distribution that provides `module` and its version, or None."""
    found = _installed(module)
    return found[0] if found else None


def _not_found(module: str) -> str:
    """Why `module` cannot be imported when no module of that name is found: not installed, or its distribution is
    installed without its files (pip then calls it satisfied, so the plain install advice would change nothing)."""
    found = _dist(module)
    if found is None:
        return f"not installed (pip install {_INSTALL.get(module, module)})"
    dist, version = found
    return (f"{dist} {version} is installed but `import {module}` finds no module: a broken install "
            f"(pip install --force-reinstall {dist})")


def _own_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gpuspeed")
    except metadata.PackageNotFoundError:
        return "source"


@dataclass
class Backend:
    name: str
    usable: bool
    why: str  # one line: what it runs on, or why it does not


def _probe(module: str) -> tuple[object | None, str | None]:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return None, _not_found(module.split(".")[0])
    try:
        return importlib.import_module(module), None
    except Exception as exc:  # a broken install must not break doctor
        return None, f"import failed: {one_line(exc, 120)}"


def _numba_cuda_runs(ncuda) -> Backend:
    """numba.cuda usable when one tiny kernel compiles and writes its output; else the first line of why not."""
    try:
        import numpy as np

        @ncuda.jit
        def _probe_kernel(out):
            out[0] = 7

        host = np.zeros(1, dtype=np.int32)
        dev = ncuda.to_device(host)
        _probe_kernel[1, 1](dev)
        ok = int(dev.copy_to_host()[0]) == 7
        from gpuspeed import compat

        shim = [k for k, v in compat.RESTORED.items() if v]
        why = "a kernel compiles and runs" + (f" (with the shim {shim[0]})" if shim else "")
        return Backend("numba.cuda", ok, why if ok else "a probe kernel ran but did not write its output")
    except Exception as exc:
        return Backend("numba.cuda", False, f"a probe kernel failed: {one_line(exc, 100)}")


def _torch_compile(torch, has_cuda: bool, why: str | None, triton_why: str | None = None) -> Backend:
    """torch.compile's inductor builds C++ kernels on the CPU: usable there only with a C++ compiler on PATH; on a
    GPU it writes Triton kernels, so it needs an importable triton there."""
    if torch is None or not hasattr(torch, "compile"):
        return Backend("torch.compile", False, why or "this torch has no torch.compile")
    if has_cuda:
        if triton_why:
            return Backend("torch.compile", False, f"no usable triton ({triton_why}): inductor writes its GPU kernels in it")
        return Backend("torch.compile", True, "inductor (Triton on GPU, C++ on CPU)")
    import shutil

    try:
        from torch._inductor import config

        cxx = config.cpp.cxx[-1] or "g++"
    except Exception:  # a torch without inductor's config: its usual default
        cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        return Backend("torch.compile", False, f"no C++ compiler ({cxx} not on PATH): inductor builds its CPU kernels "
                                               "with one")
    return Backend("torch.compile", True, f"inductor (C++ on CPU, {cxx})")


def backends() -> list[Backend]:
    """Which compute backends work here, and for each that does not, why, in one line."""
    out: list[Backend] = []
    torch, why = _probe("torch")
    has_cuda = bool(torch is not None and torch.cuda.is_available())
    if torch is None:
        out.append(Backend("torch (CUDA)", False, why))
    elif has_cuda:
        out.append(Backend("torch (CUDA)", True, f"CUDA {torch.version.cuda}"))
    else:
        built = "a CPU-only build" if torch.version.cuda is None else why_no_device()
        out.append(Backend("torch (CUDA)", False, f"{built}; torch runs on the CPU"))
    triton, triton_why = _probe("triton")
    out.append(_torch_compile(torch, has_cuda, why, triton_why))

    if triton is None:
        out.append(Backend("triton", False, triton_why))
    elif not has_cuda:
        out.append(Backend("triton", False, "no GPU; TRITON_INTERPRET=1 runs kernels on the CPU for tests"))
    else:
        out.append(Backend("triton", True, f"triton {triton.__version__}"))

    cupy, why = _probe("cupy")
    if cupy is None:
        out.append(Backend("cupy", False, why))
    else:
        try:
            n = cupy.cuda.runtime.getDeviceCount()
            out.append(Backend("cupy", n > 0, f"{n} device(s)" if n else "no CUDA device visible"))
        except Exception as exc:
            out.append(Backend("cupy", False, f"no usable device: {one_line(exc, 100)}"))

    if importlib.util.find_spec("numba") is None:
        out.append(Backend("numba.cuda", False, _not_found("numba")))
    elif not has_cuda:  # the simulator needs numba itself to import
        numba, numba_why = _probe("numba")
        out.append(Backend("numba.cuda", False, numba_why if numba is None else
                           "no GPU; NUMBA_ENABLE_CUDASIM=1 simulates kernels for tests"))
    else:
        try:
            from numba import cuda as ncuda

            if not ncuda.is_available():
                out.append(Backend("numba.cuda", False, "driver not found"))
            else:  # a driver is not enough: compile and run one kernel (numba-cuda 0.68 on NumPy 2.5 could not compile)
                out.append(_numba_cuda_runs(ncuda))
        except Exception as exc:
            out.append(Backend("numba.cuda", False, f"import failed: {one_line(exc, 100)}"))

    if importlib.util.find_spec("jax") is None:
        out.append(Backend("jax", False, _not_found("jax")))
    else:
        try:
            import jax

            gpus = [d for d in jax.devices() if d.platform == "gpu"]
            out.append(Backend("jax", True, f"{len(gpus)} GPU(s)" if gpus else "CPU only (no jax CUDA plugin)"))
        except Exception as exc:
            out.append(Backend("jax", False, f"failed to start: {one_line(exc, 100)}"))

    if importlib.util.find_spec("pynvml") is None:
        out.append(Backend("nvml", False, f"{_not_found('pynvml')}; clocks are not read"))
    else:
        out.append(Backend("nvml", _nvml() is not None,
                           "clocks and device memory readable" if _nvml() else "no NVIDIA driver here"))
    return out
