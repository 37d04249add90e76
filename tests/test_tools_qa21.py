"""Round 21 QA of the tools area: doctor, launch --explain, profile."""

import sys

import pytest

from gpuspeed import device, doctor

OPTIONAL = ["triton", "cupy", "numba", "jax", "pynvml"]


def _blocked(monkeypatch, names):
    for name in names:  # `import name` now fails as for a package whose files are gone
        monkeypatch.setitem(sys.modules, name, None)


def test_doctor_never_says_not_installed_of_a_package_it_lists_with_a_version(monkeypatch):
    # a distribution installed without its module (files deleted, a half-done uninstall) was "not installed (pip
    # install numba)" beside "numba 0.68.1" in the versions table; pip calls it satisfied, so the advice did nothing
    _blocked(monkeypatch, OPTIONAL)
    rep = doctor.report()
    why = {b["name"]: b["why"] for b in rep["backends"]}
    for module, backend in [("triton", "triton"), ("cupy", "cupy"), ("numba", "numba.cuda"), ("jax", "jax"),
                            ("pynvml", "nvml")]:
        version = rep["versions"][module]
        if version is None:
            assert why[backend].startswith("not installed (pip install "), (backend, why[backend])
        else:
            assert "not installed" not in why[backend], (backend, why[backend])
            assert f"{version} is installed but `import {module}` finds no module" in why[backend]
            assert "pip install --force-reinstall " in why[backend]


def test_doctor_advises_a_cupy_wheel_not_a_source_build(monkeypatch):
    # "pip install cupy" compiles CuPy from source (a CUDA toolkit and minutes); the wheels are cupy-cuda12x/13x,
    # as the optimize report's emitted script already says
    if device.versions()["cupy"] is not None:
        pytest.skip("CuPy is installed here")  # CI has none: its dev extras leave CuPy out
    cupy = next(b for b in device.backends() if b.name == "cupy")
    assert not cupy.usable
    assert "pip install cupy-cuda12x" in cupy.why and "cupy-cuda13x" in cupy.why
    assert "pip install cupy)" not in cupy.why


@pytest.mark.gpu
def test_doctor_on_a_gpu_without_triton_says_torch_compile_cannot_build_gpu_kernels(monkeypatch):
    # on a GPU, doctor called torch.compile usable ("Triton on GPU") with triton missing, where inductor fails at the
    # first compile of a CUDA function
    _blocked(monkeypatch, ["triton"])
    compiled = next(b for b in device.backends() if b.name == "torch.compile")
    assert not compiled.usable and "triton" in compiled.why
