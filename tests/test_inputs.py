"""The shared input-spec parser and generator."""

import numpy as np
import pytest
import torch

from gpuspeed.errors import UserError
from gpuspeed.inputs import INT_HIGH, InputSpec, make_inputs, parse_spec, parse_specs


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
