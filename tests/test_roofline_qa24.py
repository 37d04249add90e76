"""QA round 24, roofline and doctor: place()'s bytes of a function that writes its inputs in place and returns None,
doctor on a torch whose import raises OSError or ValueError and under a CUDA_VISIBLE_DEVICES that hides every GPU,
and the plot's label of a point above its roof."""

from __future__ import annotations

import numpy as np
import pytest
import torch

FAST = dict(budget_s=0.02, warmup_s=0.0, min_samples=3)


def _cpu_ceilings():
    from gpuspeed import device
    from gpuspeed.roofline.ceilings import Ceiling, Ceilings

    return Ceilings("cpu", device.host_name(), [Ceiling("copy", "memory", 20.0), Ceiling("fp32", "compute", 0.5),
                                                Ceiling("fp64", "compute", 0.25)])


def _place(fn, *args, **kw):
    from gpuspeed.roofline import place

    return place(fn, *args, ceilings=_cpu_ceilings(), **FAST, **kw)


# -- place(): an input written in place is written traffic, whatever the function returns --------------------------


def _scale_torch(t):
    t.mul_(2.0)  # returns None: the write is only seen in t


def _scale_numpy(a):
    a *= 2.0


def _scale_kwarg(t, *, out):
    torch.mul(t, 2.0, out=out)


@pytest.mark.parametrize("make", [lambda: torch.randn(4096), lambda: np.random.rand(4096),
                                  lambda: torch.randn(64, 128)[:, ::2]])
def test_an_input_written_in_place_by_a_function_returning_none_counts_its_write(make):
    """x.mul_(2) in a function returning None was placed at half its bytes (the read alone): its GB/s and % of roof
    were half what the call moved."""
    x = make()
    fn = _scale_numpy if isinstance(x, np.ndarray) else _scale_torch
    p = _place(fn, x, flops=4096)
    nbytes = x.nbytes if isinstance(x, np.ndarray) else x.numel() * x.element_size()
    assert p.bytes == 2 * nbytes
    assert any("wrote in place" in n for n in p.notes)


def test_an_input_written_in_place_and_returned_is_counted_once():
    x = torch.randn(4096)
    p = _place(lambda t: t.add_(1.0), x, flops=4096)
    assert p.bytes == 2 * x.nbytes  # read once, written once: not twice for the output that is the input
    assert not any("wrote in place" in n for n in p.notes)  # the output showed the write already
    assert not any("wrote in place" in n for n in _place(torch.add, x, x, flops=4096).notes)


def test_an_out_buffer_written_by_a_function_returning_none_is_counted_as_when_it_is_returned():
    """The convention of an input that is written: read and written, as for `return torch.mul(x, 2, out=out)`; the
    note says bytes= states a write-only buffer."""
    x, out = torch.randn(4096), torch.empty(4096)
    returned = _place(lambda t, o: torch.mul(t, 2.0, out=o), x, out, flops=4096)
    p = _place(_scale_kwarg, x, flops=4096, kwargs={"out": out})
    assert p.bytes == returned.bytes == x.nbytes + 2 * out.nbytes
    assert any("out= buffer" in n for n in p.notes)


@pytest.mark.gpu
def test_a_cuda_tensor_written_in_place_by_a_function_returning_none_counts_its_write():
    x = torch.randn(1 << 20, device="cuda")
    p = _place(_scale_torch, x, flops=x.numel(), device="cuda")
    assert p.bytes == 2 * x.nbytes and any("wrote in place" in n for n in p.notes)


def test_a_read_only_call_is_not_counted_as_a_write():
    x, a = torch.randn(4096), np.random.rand(4096)
    assert _place(torch.sum, x, flops=4096).bytes == x.nbytes + 4
    assert _place(np.sum, a, flops=4096).bytes == a.nbytes  # a NumPy scalar out: no array bytes


# -- doctor: a torch whose import raises OSError or ValueError (torch's CUDA-library loader) -------------------------


@pytest.mark.parametrize("error", ["OSError('libcudart.so.12: cannot open shared object file: No such file')",
                                   "ValueError('libcudnn.so.*[0-9] not found in the system path')"])
def test_doctor_reports_a_torch_whose_import_raises_something_other_than_import_error(tmp_path, error):
    """torch's own loader raises OSError for a CUDA library it cannot open and ValueError for a pip CUDA library that is
    missing: doctor, the command meant to say what is wrong, ended in a 40-line traceback there."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text(f"raise {error}\n")
    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(src)]))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "doctor", "--json"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    first = error.split("'")[1].split(":")[0]  # the library named
    assert "torch cannot be imported" in rep["headline"] and first in rep["headline"], rep["headline"]
    assert not rep["gpu"] and rep["versions"]["torch"]  # installed (its distribution is there), not usable
    torch_row = next(b for b in rep["backends"] if b["name"] == "torch (CUDA)")
    assert not torch_row["usable"] and first in torch_row["why"]


# -- doctor: a CUDA build that sees no GPU because CUDA_VISIBLE_DEVICES hides them ---------------------------------


@pytest.mark.parametrize(("visible", "hides"), [("", True), ("-1", True), (" ", True), ("none", True), ("0", False),
                                                ("GPU-5f1e", False), ("1,-1", False)])
def test_why_no_device_names_a_cuda_visible_devices_that_hides_every_gpu(visible, hides):
    from gpuspeed.device import why_no_device as _why_no_device

    why = _why_no_device({"CUDA_VISIBLE_DEVICES": visible})
    assert ("hides every GPU" in why) == hides and repr(visible) in why
    assert _why_no_device({}) == "no driver or device visible"


@pytest.mark.gpu
@pytest.mark.parametrize("visible", ["", "-1"])
def test_doctor_on_a_gpu_machine_says_cuda_visible_devices_hides_the_gpu(tmp_path, visible):
    """CUDA_VISIBLE_DEVICES='' (left over from a CPU job) made doctor say "no driver or device visible", which sends the
    user to reinstall a driver that works."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible,
               PYTHONPATH=os.pathsep.join(p for p in [str(src), os.environ.get("PYTHONPATH")] if p))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "doctor", "--json"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    headline = json.loads(r.stdout)["headline"]
    assert f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU" in headline, headline


# -- plot: a point above its roof is labelled with the reason the tables give ------------------------------------


def _labels_of(doc) -> list[str]:
    import matplotlib.pyplot as plt

    from gpuspeed.roofline.plot import draw

    fig = draw(doc)
    try:
        return [t.get_text() for t in fig.axes[0].texts]
    finally:
        plt.close(fig)


def _doc_with_point(device: str, pct: float, bound: str = "memory") -> dict:
    """A minimal roofline document: one memory and one compute ceiling, one point at `pct` % of its roof."""
    ceilings = [{"section": "ceiling", "name": "read", "kind": "memory", "value": 20.0},
                {"section": "ceiling", "name": "fp32", "kind": "compute", "value": 0.1}]
    ai = 0.25 if bound == "memory" else 64.0
    roof = min(0.1, 20.0 * ai / 1e3)  # TFLOP/s
    point = {"section": "placement", "name": "sum", "group": "reduction", "ai": ai, "flops": 1e6, "bytes": 4e6,
             "TFLOPs": roof * pct / 100, "GBps": 1.0, "pct_of_roof": pct, "bound": bound, "above_roof": pct > 100,
             "notes": []}
    return {"params": {"device": device, "quick": True}, "device": {"name": "test"}, "rows": [*ceilings, point],
            "notes": []}


@pytest.mark.parametrize(("device", "pct", "label"), [
    ("cpu", 157.0, "sum (above measured roof)"),  # a shared CPU's drifting ceilings explain it as well as a cache
    ("cuda", 140.0, "sum (above roof: cache-resident)"),
    ("cuda", 60000.0, "sum (>50x roof: fewer bytes or FLOPs moved than counted)"),  # a view returned, a no-op
    ("cpu", 60000.0, "sum (>50x roof: fewer bytes or FLOPs moved than counted)"),
    ("cuda", 80.0, "sum"),
])
def test_the_plot_labels_a_point_above_its_roof_as_the_tables_do(device, pct, label):
    """The plot called every memory-bound point above its roof 'cache-resident': a CPU sum over 4x its L3 (the tables
    say 'above the measured ceiling' there) and a call returning a view at 60000 % of the roof (the tables: fewer
    bytes or FLOPs moved than counted)."""
    assert label in _labels_of(_doc_with_point(device, pct))
