"""The shared input-spec parser and generator."""

import os

import numpy as np
import pytest
import torch

from gpuspeed.errors import UserError
from gpuspeed.inputs import INT_HIGH, InputSpec, host_available_bytes, make_inputs, memory_needed, parse_spec, parse_specs


def test_parse_array_and_scalars():
    assert parse_spec("x=float32[4096,1024]") == InputSpec("x", "array", "float32", (4096, 1024))
    assert parse_spec("n=int:200") == InputSpec("n", "int", value=200)
    assert parse_spec("eps=float:1e-3").value == 1e-3
    assert parse_spec("v=bf16[8]").dtype == "bfloat16"
    assert parse_spec("s=float64[]").shape == ()
    assert parse_spec("x=float32[4, 5]").shape == (4, 5)
    assert parse_spec("x=float16[3,2]").nbytes == 12


@pytest.mark.parametrize("bad", ["x", "x=", "x=float32", "x=float32[4,", "x=cats[4]", "1x=float32[4]",
                                 "x=float32[4,-1]", "x=float32[a]", "n=int:1.5", "f=float:abc", "=int:3"])
def test_malformed_specs_raise_user_error(bad):
    with pytest.raises(UserError, match="bad input spec"):
        parse_spec(bad)


def test_duplicate_names():
    with pytest.raises(UserError, match="twice"):
        parse_specs(["x=float32[2]", "x=int:3"])


def test_make_inputs_seeded_random_and_typed():
    specs = parse_specs(["x=float32[64,32]", "i=int32[100]", "m=bool[50]", "n=int:7", "h=bfloat16[16]"])
    a = make_inputs(specs, seed=1)
    b = make_inputs(specs, seed=1)
    c = make_inputs(specs, seed=2)
    assert a["x"].shape == (64, 32) and a["x"].dtype == torch.float32
    assert a["i"].dtype == torch.int32 and int(a["i"].min()) >= 0 and int(a["i"].max()) < INT_HIGH
    assert a["m"].dtype == torch.bool and 0 < int(a["m"].sum()) < 50
    assert a["h"].dtype == torch.bfloat16
    assert a["n"] == 7
    assert torch.equal(a["x"], b["x"]) and not torch.equal(a["x"], c["x"])
    assert float(a["x"].abs().min()) > 0 and 0.8 < float(a["x"].std()) < 1.2  # standard normal, no zeros


def test_make_inputs_numpy_backend():
    a = make_inputs(["x=float64[10,3]", "k=int64[5]"], backend="numpy", seed=0)
    assert isinstance(a["x"], np.ndarray) and a["x"].dtype == np.float64 and a["k"].dtype == np.int64
    with pytest.raises(UserError, match="bfloat16"):
        make_inputs(["x=bfloat16[4]"], backend="numpy")


def test_numpy_and_torch_backends_make_the_same_values():
    specs = ["x=float32[8,4]", "h=float16[6]", "d=float64[3,3]", "i=int32[10]", "m=bool[12]", "n=int:3"]
    a = make_inputs(specs, seed=5, backend="numpy")
    b = make_inputs(specs, seed=5, backend="torch")
    for name in ("x", "h", "d", "i", "m"):
        assert isinstance(a[name], np.ndarray) and a[name].flags.c_contiguous
        assert str(a[name].dtype) == str(b[name].dtype).removeprefix("torch.")
        assert np.array_equal(a[name], b[name].numpy())
    assert a["n"] == b["n"] == 3


def test_cupy_backend_wants_a_gpu_and_no_bfloat16():
    with pytest.raises(UserError, match="CUDA GPU"):
        make_inputs(["x=float32[4]"], backend="cupy", device="cpu")
    with pytest.raises(UserError, match="cupy arrays have no bfloat16"):
        make_inputs(["x=bfloat16[4]"], backend="cupy", device="cuda")
    with pytest.raises(UserError, match="unknown input backend 'jax'"):
        make_inputs(["x=float32[4]"], backend="jax")


def test_cupy_backend_without_cupy_is_one_line():
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="needs CuPy"):
            make_inputs(["x=float32[4]"], backend="cupy", device="cuda")
    else:
        pytest.skip("CuPy is installed here")


def test_memory_needed_counts_what_is_made():
    specs = parse_specs(["x=float32[1000]", "h=float16[1000]", "i=int8[100]", "n=int:3"])
    # host, peak while h is made: x kept (4000) + h drawn as float32 (4000) + its float16 copy (2000)
    assert memory_needed(specs, backend="numpy") == (0, 4000 + 4000 + 2000)
    assert memory_needed(specs, backend="torch", device="cpu") == (0, 4000 + 4000 + 2000)
    # and with a bigger int8 array last: x, h kept (6000) + i drawn as int64 (8 * 2000) + its int8 copy (2000)
    specs[2] = parse_spec("i=int8[2000]")
    assert memory_needed(specs, backend="numpy") == (0, 6000 + 16000 + 2000)
    # to a GPU: host buffers are freed after each move, so the host peak is the largest single one
    assert memory_needed(specs, backend="torch", device="cuda") == (4000 + 2000 + 2000, 16000 + 2000)


def test_inputs_too_big_for_memory_are_one_line_before_allocating(monkeypatch):
    import gpuspeed.inputs as inputs

    monkeypatch.setattr(inputs, "host_available_bytes", lambda: 8 * 2**30)
    with pytest.raises(UserError) as err:
        make_inputs(["x=float32[100000,100000]"], device="cpu")
    assert str(err.value) == ("the inputs need 37.3 GiB of host memory but only 8.0 GiB is available; "
                              "use smaller shapes")
    with pytest.raises(UserError, match=r"largest x=float64\[100000,100000\]: 74.5 GiB"):
        make_inputs(["y=int8[10]", "x=float64[100000,100000]"], backend="numpy")


def test_inputs_bigger_than_any_machine_are_refused_before_allocating():
    with pytest.raises(UserError, match=r"need 37252\.9 GiB of host memory but only [0-9.]+ [GM]iB is available"):
        make_inputs(["x=float32[10000000,1000000]"])


def test_out_of_memory_while_making_is_a_user_error(monkeypatch):
    import gpuspeed.inputs as inputs

    monkeypatch.setattr(inputs, "host_available_bytes", lambda: None)  # unknown: only the backstop is left
    with pytest.raises(UserError, match=r"out of memory making input x=float64\[1125899906842624\]"):
        make_inputs([f"x=float64[{2**50}]"], backend="numpy")  # 8 PiB: past any address space


def test_host_available_bytes_is_plausible():
    free = host_available_bytes()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert free is not None and 0 < free <= total


def test_cli_input_too_big_is_one_line(tmp_path, capsys):
    from gpuspeed.cli import main

    (tmp_path / "f.py").write_text("def fn(x):\n    return x * 2\n")
    rc = main(["profile", "--function", f"{tmp_path / 'f.py'}:fn", "--input", "x=float32[10000000,1000000]",
               "--device", "cpu"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and "GiB" in err and err.startswith("gpuspeed: error: the inputs need")


@pytest.mark.gpu
@pytest.mark.alone  # sized by the GPU's free memory: under xdist another worker's allocations would move it
def test_inputs_too_big_for_the_gpu_are_refused_before_allocating():
    free, total = torch.cuda.mem_get_info()
    before = torch.cuda.memory_allocated()
    n = int(1.1 * total) // 4 + 1  # float32 elements that cannot fit on the card
    with pytest.raises(UserError, match=r"the inputs need [0-9.]+ GiB on cuda but only [0-9.]+ GiB is free there"):
        make_inputs([f"x=float32[{n}]"], device="cuda")
    assert torch.cuda.memory_allocated() == before
    small = make_inputs(["x=float32[1024]"], device="cuda")  # and one that fits is made on the card
    assert small["x"].is_cuda and small["x"].shape == (1024,)


@pytest.mark.gpu
def test_cupy_backend_makes_the_numpy_values_on_the_gpu():
    cupy = pytest.importorskip("cupy")
    specs = ["x=float32[8,4]", "h=float16[6]", "i=int32[10]", "m=bool[12]", "n=int:3"]
    a = make_inputs(specs, seed=5, backend="cupy", device="cuda")
    b = make_inputs(specs, seed=5, backend="numpy")
    for name in ("x", "h", "i", "m"):
        assert isinstance(a[name], cupy.ndarray) and a[name].dtype == b[name].dtype
        assert np.array_equal(cupy.asnumpy(a[name]), b[name])
    assert a["n"] == 3
    _, total = torch.cuda.mem_get_info()
    with pytest.raises(UserError, match=r"on cuda but only"):
        make_inputs([f"x=float32[{int(1.1 * total) // 4 + 1}]"], backend="cupy", device="cuda")
