"""NVML reads come from the GPU torch uses (skipped without CUDA): the bus-id mapping, checked against
NVML's own UUID and name, on device 1 and under CUDA_VISIBLE_DEVICES."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pynvml = pytest.importorskip("pynvml")

import gpuspeed  # noqa: E402
from gpuspeed import device  # noqa: E402

pytestmark = pytest.mark.gpu
GiB = 2**30


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_identity(handle) -> tuple[str, str, str]:
    """(bus id, UUID, name) NVML reports for a handle."""
    return (_text(pynvml.nvmlDeviceGetPciInfo(handle).busId).upper(), _text(pynvml.nvmlDeviceGetUUID(handle)),
            _text(pynvml.nvmlDeviceGetName(handle)))


def _mapped(index):
    found = device.nvml_device(index)
    assert found is not None, "NVML is installed but the CUDA device was not matched"
    return _nvml_identity(found[1])


@pytest.mark.parametrize("index", [None, 0])
def test_cuda_device_maps_to_its_own_nvml_gpu(index):
    props = torch.cuda.get_device_properties(0 if index is None else index)
    bus, uuid, name = _mapped(index)
    assert bus == device.pci_bus_id(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    assert str(props.uuid) in uuid  # an identity NVML reports independently of the bus id
    assert name == props.name
    clocks = device.read_clocks(index)
    assert clocks.get("sm_mhz", 0) > 0 and clocks.get("sm_max_mhz", 0) >= clocks["sm_mhz"]
    assert device.nvml_used_bytes(index) > 0


def test_device_one_maps_to_a_different_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    assert _mapped(0)[0] != _mapped(1)[0]
    with torch.cuda.device(1):
        assert _mapped(None)[1].endswith(str(torch.cuda.get_device_properties(1).uuid))
        # memory allocated on device 1 shows in device 1's NVML reading, not device 0's
        torch.cuda.synchronize()
        before = (device.nvml_used_bytes(0), device.nvml_used_bytes(1))
        x = torch.ones(GiB, dtype=torch.uint8, device="cuda:1")
        torch.cuda.synchronize()
        after = (device.nvml_used_bytes(0), device.nvml_used_bytes(1))
        del x
    assert after[1] - before[1] >= GiB - 2**20
    assert abs(after[0] - before[0]) < GiB // 4


def test_cuda_visible_devices_picks_the_nvml_gpu_it_names():
    pynvml.nvmlInit()
    last = pynvml.nvmlDeviceGetCount() - 1  # NVML counts every GPU; CUDA sees only the one we name
    want_uuid = _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(last)))
    src = str(Path(gpuspeed.__file__).resolve().parents[1])
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=want_uuid,
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    code = ("import pynvml; from gpuspeed import device; n, h = device.nvml_device(0); "
            "u = pynvml.nvmlDeviceGetUUID(h); print(u.decode() if isinstance(u, bytes) else u)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == want_uuid
