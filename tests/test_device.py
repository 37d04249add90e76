"""Device detection, the datasheet table and backend probing."""

import pytest

from gpuspeed import device
from gpuspeed.errors import UserError

NAMES = {
    "NVIDIA GeForce RTX 4070": "NVIDIA GeForce RTX 4070 (12 GB)",
    "NVIDIA GeForce RTX 4070 Laptop GPU": "NVIDIA GeForce RTX 4070 Laptop (8 GB)",
    "NVIDIA GeForce RTX 4090": "NVIDIA GeForce RTX 4090",
    "NVIDIA L4": "NVIDIA L4",
    "NVIDIA L40S": "NVIDIA L40S",
    "Tesla T4": "NVIDIA T4",
    "NVIDIA A10G": "NVIDIA A10G",
    "NVIDIA A100-SXM4-40GB": "NVIDIA A100 40GB",
    "NVIDIA A100-SXM4-80GB": "NVIDIA A100 80GB SXM",
    "NVIDIA A100 80GB PCIe": "NVIDIA A100 80GB PCIe",
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM",
    "NVIDIA H100 PCIe": "NVIDIA H100 PCIe",
    "NVIDIA H200": "NVIDIA H200 SXM",
}


@pytest.mark.parametrize("reported,entry", NAMES.items())
def test_datasheet_matching(reported, entry):
    assert device.datasheet_for(reported).name == entry


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4070 Ti", "NVIDIA GeForce RTX 4070 SUPER", "NVIDIA L40",
                                  "Quadro P1000", "", None])
def test_unknown_devices_have_no_entry(name):
    assert device.datasheet_for(name) is None
    assert device.pct_of_datasheet(1.0, name, "mem") is None


def test_datasheet_values_are_complete_and_sane():
    for _, sheet in device.DATASHEETS:
        assert sheet.mem_GBps > 100 and sheet.fp32_TFLOPs > 1 and sheet.fp64_TFLOPs > 0
        for unit in ("tf32", "fp16", "bf16"):
            v = sheet.peak(unit)
            assert v is None or v >= sheet.fp32_TFLOPs * 0.99
    h200 = device.datasheet_for("NVIDIA H200")
    assert h200.mem_GBps == 4800 and h200.fp32_TFLOPs == 66.9 and h200.bf16_TFLOPs == 989.4
    assert device.pct_of_datasheet(4320, "NVIDIA H200", "mem") == pytest.approx(90.0)


def test_slug():
    assert device.device_slug("NVIDIA H200") == "nvidia-h200"
    assert device.device_slug("Tesla T4") == "nvidia-tesla-t4"
    assert device.device_slug("NVIDIA GeForce RTX 4070 Laptop GPU") == "nvidia-geforce-rtx-4070-laptop-gpu"


def test_cpu_device_and_resolution():
    info = device.get_device("cpu")
    assert info.kind == "cpu" and info.slug == "cpu" and info.datasheet is None
    assert device.resolve_device("cpu") == "cpu"
    with pytest.raises(UserError):
        device.resolve_device("tpu")
    if not device.cuda_available():
        assert device.resolve_device("auto") == "cpu"
        with pytest.raises(UserError):
            device.resolve_device("cuda")


def test_backends_and_versions_never_raise():
    names = [b.name for b in device.backends()]
    for expected in ("torch (CUDA)", "triton", "cupy", "numba.cuda", "jax", "nvml"):
        assert expected in names
    for b in device.backends():
        assert b.why and "\n" not in b.why
    v = device.versions()
    assert v["python"] and v["torch"]
    assert set(["triton", "cupy", "numba", "jax", "transformers"]) <= set(v)


class _FakeNvml:
    """Stands in for pynvml only to see which bus id / UUID string the mapping asks NVML for."""

    def __init__(self, known):
        self.known, self.asked = known, []

    def _lookup(self, key):
        self.asked.append(key)
        if key not in self.known:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return self.known[key]

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        return self._lookup(bus_id)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self._lookup(uuid)


class _Props:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_pci_bus_id_is_nvmls_own_format():
    assert device.pci_bus_id(0, 0x3B, 0) == "00000000:3B:00.0"
    assert device.pci_bus_id(0x1, 0xDB, 0x1F) == "00000001:DB:1F.0"


def test_cuda_device_maps_to_nvml_by_bus_id_then_uuid():
    nvml = _FakeNvml({b"00000000:9A:00.0": "h-9a", b"GPU-1234-abcd": "h-uuid"})
    props = _Props(pci_domain_id=0, pci_bus_id=0x9A, pci_device_id=0, uuid="1234-abcd")
    assert device._handle_from_props(nvml, props) == "h-9a"
    assert nvml.asked == [b"00000000:9A:00.0"]
    # a torch without the PCI fields falls back to the UUID, with NVML's "GPU-" prefix
    assert device._handle_from_props(nvml, _Props(uuid="1234-abcd")) == "h-uuid"
    # an unmatched GPU gives None, never NVML's GPU 0
    assert device._handle_from_props(nvml, _Props(pci_domain_id=0, pci_bus_id=1, pci_device_id=0)) is None


def test_nvml_readers_say_nothing_without_a_gpu():
    if device.cuda_available():
        pytest.skip("has a GPU")
    assert device.nvml_device() is None
    assert device.read_clocks() == {} and device.capped_ns() == {}
    assert device.sm_clock_mhz() is None and device.nvml_used_bytes() is None
