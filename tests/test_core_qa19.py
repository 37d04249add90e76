"""QA round 19, core: check()'s one-pass comparison of small leaves (the same result, bit for bit, as the chunked path,
in half the work), and a demanding user's pass over bench / check / peak_memory / doctor / roofline / launch."""

from __future__ import annotations

import json
import math
import struct
import sys
import warnings
from dataclasses import asdict

import numpy as np
import pytest

import gpuspeed
from gpuspeed import verify
from gpuspeed.errors import UserError

# -- check() of small leaves: one pass, the chunked path's numbers ------------------------------------------------

FLOATS = [np.float64, np.float32, np.float16, np.longdouble, np.complex128, np.complex64, np.dtype(">f8")]
INTEGERS = [np.int64, np.int32, np.int8, np.uint8, np.uint64, np.bool_, np.dtype(">u8"), np.dtype(">i8")]
SHAPES = [(), (0,), (1,), (2,), (7,), (3, 4), (2, 3, 5), (300,)]
SPECIALS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, -1e308, 5e-324]
TOLERANCES = [{}, {}, {}, {"rtol": 1e-6}, {"rtol": 0.0}, {"atol": 0.0}, {"atol": 1e-3, "rtol": 0.0}, {"atol": 1e-9},
              {"rtol": math.inf}, {"atol": math.inf}, {"rtol": 1e-3, "atol": 1e-300}, {"dtype": "float16"},
              {"atol": 2.0}, {"rtol": 0.5, "atol": 0.0}]


def _values(rng, dtype, shape):
    """Random (never all-zero) values of a dtype: wide magnitudes for floats, past 2**53 for 64-bit integers."""
    n = int(np.prod(shape))
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.random(n).reshape(shape) < 0.5
    if kind in "iu":
        info = np.iinfo(dtype)
        if info.bits == 64 and rng.random() < 0.5:  # past 2**53: float64 rounds them
            base = np.array(2**62 if kind == "i" else 2**63 + 2**62, dtype=dtype)
            return (base + rng.integers(0, 1000, n).astype(dtype)).reshape(shape)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(dtype).reshape(shape)
    scale = 10.0 ** rng.choice([-300, -30, -3, 0, 3, 30, 300]) if rng.random() < 0.4 else 1.0
    values = rng.standard_normal(n) * scale
    if kind == "c":
        values = values + 1j * rng.standard_normal(n) * scale
    with np.errstate(over="ignore"):
        return values.astype(dtype).reshape(shape)


def _perturbed(rng, ref, dtype):
    """ref as dtype, off by nothing, by a little, or by a lot, here and there or everywhere."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex to real drops the imaginary part: meant here
        out = np.array(ref).astype(dtype)
        if out.size == 0 or np.dtype(dtype).kind == "b":
            return out
        how = rng.choice(["same", "tiny", "small", "large", "one"])
        flat = out.reshape(-1)
        if np.dtype(dtype).kind in "iu":
            if how != "same":
                i = rng.integers(flat.size, size=1 if how == "one" else flat.size)
                flat[i] = flat[i] + np.array(rng.integers(1, 3), dtype=dtype)
            return out
        size = {"same": 0.0, "tiny": 1e-15, "small": 1e-6, "large": 1.0, "one": 1e-2}[how]
        noise = rng.standard_normal(flat.size) * size
        if how == "one":
            noise[:] = 0
            noise[rng.integers(flat.size)] = 1e-2
        flat[...] = flat * (1 + noise).astype(flat.real.dtype) + (rng.random() < 0.2) * noise[0]
        return out


def _sprinkle(rng, *arrays):
    """NaN, +-inf, -0.0, huge and subnormal values at random places, some at the same place in every array."""
    for arr in arrays:
        flat = arr.reshape(-1)
        if flat.size == 0 or arr.dtype.kind not in "fc" or rng.random() < 0.5:
            continue
        for _ in range(rng.integers(1, 4)):
            with np.errstate(all="ignore"):
                flat[rng.integers(flat.size)] = rng.choice(SPECIALS)
    if rng.random() < 0.3 and all(a.size and a.dtype.kind in "fc" for a in arrays):  # matching specials
        i, value = rng.integers(arrays[0].size), rng.choice(SPECIALS[:3])
        for arr in arrays:
            with np.errstate(all="ignore"):
                arr.reshape(-1)[i] = value


def _strided(rng, arr):
    """The same values as a strided view: every other element of a larger array, or a transpose."""
    if arr.ndim == 0 or rng.random() < 0.6:
        return arr
    if arr.ndim >= 2 and rng.random() < 0.5:
        return np.ascontiguousarray(arr.swapaxes(0, 1)).swapaxes(0, 1)
    big = np.zeros(arr.shape[:-1] + (arr.shape[-1] * 2,), dtype=arr.dtype)
    big[..., ::2] = arr
    return big[..., ::2]


def _case(rng):
    shape = SHAPES[rng.integers(len(SHAPES))]
    ref_dtype = (FLOATS + INTEGERS)[rng.integers(len(FLOATS) + len(INTEGERS))]
    out_dtype = ref_dtype if rng.random() < 0.6 else (FLOATS + INTEGERS)[rng.integers(len(FLOATS) + len(INTEGERS))]
    ref = _values(rng, ref_dtype, shape)
    out = _perturbed(rng, ref, out_dtype)
    ref = np.array(ref)
    _sprinkle(rng, out, ref)
    out, ref = _strided(rng, out), _strided(rng, ref)
    if rng.random() < 0.1 and out.ndim:  # masked alike (and now and then not)
        mask = rng.random(shape) < 0.3
        other = mask if rng.random() < 0.8 else ~mask
        out, ref = np.ma.MaskedArray(out, mask=mask), np.ma.MaskedArray(ref, mask=other)
    kwargs = dict(TOLERANCES[rng.integers(len(TOLERANCES))])
    kwargs["equal_nan"] = bool(rng.random() < 0.3)
    return out, ref, kwargs


def _bits(value):
    """A value with every float as its bytes: -0.0 and 0.0 apart, NaN equal to NaN."""
    if isinstance(value, float):
        return struct.pack("<d", value)
    if isinstance(value, dict):
        return {k: _bits(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_bits(v) for v in value)
    return value


def _outcome(out, ref, kwargs):
    try:
        result = gpuspeed.check(out, ref, **kwargs)
    except UserError as exc:
        return ("UserError", str(exc))
    return _bits({"passed": result.passed, "summary": result.summary, "bool": bool(result),
                  "headline": [result.max_abs_err, result.max_rel_err, result.rel_l2_err, result.nan_count,
                               result.inf_count, result.n_over_tol, result.worst_index],
                  "leaves": [asdict(leaf) for leaf in result.leaves]})


def _both_paths(monkeypatch, out, ref, kwargs):
    """check()'s outcome with small leaves compared in one pass, and with every leaf through the chunked path."""
    one_pass = _outcome(out, ref, kwargs)
    with monkeypatch.context() as patched:
        patched.setattr(verify, "SMALL_LEAF", 0)
        chunked = _outcome(out, ref, kwargs)
    return one_pass, chunked


def test_one_pass_gives_the_chunked_paths_result_bit_for_bit(monkeypatch):
    # the one-pass comparison of small leaves must not move a single bit of any field or message
    rng = np.random.default_rng(19)
    kinds = {"pass": 0, "fail": 0, "error": 0}
    for i in range(1500):
        out, ref, kwargs = _case(rng)
        one_pass, chunked = _both_paths(monkeypatch, out, ref, kwargs)
        assert one_pass == chunked, (i, out.dtype, ref.dtype, out.shape, kwargs, repr(out)[:300], repr(ref)[:300])
        kinds["error" if isinstance(one_pass, tuple) else "pass" if one_pass["passed"] else "fail"] += 1
    assert min(kinds.values()) > 10 or kinds["error"] == 0 and min(kinds["pass"], kinds["fail"]) > 100, kinds


def test_one_pass_edge_cases_match_the_chunked_path(monkeypatch):
    big = 2**62
    cases = [
        (np.array(big, dtype=np.int64), np.array(big + 1, dtype=np.int64), {}),
        (np.array([2.0**62]), np.array([big + 1], dtype=np.int64), {}),  # a float that is the int's rounding
        (np.array([2.0**62, 1.0]), np.array([big, 1], dtype=np.int64), {"atol": 0.5}),
        (np.array([np.iinfo(np.int64).min, 0]), np.array([np.iinfo(np.int64).max, 0]), {}),
        (np.array([-0.0, 0.0]), np.array([0.0, -0.0]), {}),
        (np.zeros(3) + 1e-300, np.zeros(3), {}),  # an all-zero reference: no scale
        (np.array([1e308, -1e308]), np.array([-1e308, 1e308]), {}),  # differences past float64
        (np.array([math.inf, math.nan, 1.0]), np.array([math.inf, math.nan, 1.0]), {"equal_nan": True}),
        (np.array([math.inf, math.nan, 1.0]), np.array([math.inf, math.nan, 1.0]), {}),
        (np.array([-math.inf, 1.0]), np.array([math.inf, 1.0]), {"atol": math.inf}),
        (np.array([1.0, 2.0]), np.array([0.0, 2.0]), {"rtol": math.inf}),
        (np.array([0.0, 2.0]), np.array([0.0, 2.0]), {"rtol": math.inf}),
        (np.array([math.nan, 0.0]), np.array([1.0, 0.0]), {"rtol": math.inf}),
        (np.array([math.nan, math.nan]), np.array([1.0, 1e308]), {"rtol": 10.0, "atol": 0.0}),  # scores inf, inf - inf
        (np.array([complex(math.inf, math.nan), 1j]), np.array([complex(math.inf, 0), 1j]), {}),
        (np.array([1e308 + 1e308j]), np.array([1e308 + 1e308j]), {}),  # |ref| overflows, ref itself is finite
        (np.array([True, False]), np.array([1, 0], dtype=np.uint64), {}),
        (np.array([3, 4], dtype=np.uint64), np.array([3.0, 4.5]), {}),
        (np.float32(1.5), np.float64(1.5 + 1e-7), {}),
        (np.arange(12.0).reshape(3, 4).T, np.arange(12.0).reshape(3, 4).T.copy(), {}),
        (np.array([1.0, 5.0, 5.0, 2.0]), np.array([1.0, 4.0, 4.0, 2.0]), {"atol": 0.0, "rtol": 0.0}),
    ]
    for out, ref, kwargs in cases:
        one_pass, chunked = _both_paths(monkeypatch, out, ref, kwargs)
        assert one_pass == chunked, (out, ref, kwargs)


def test_one_pass_of_torch_leaves_matches_the_chunked_path(monkeypatch):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(19)
    leaves = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64, torch.int32):
        ref = torch.randn(37, generator=gen).to(dtype) if dtype != torch.int32 else torch.randint(-9, 9, (37,), generator=gen,
                                                                                                   dtype=dtype)
        out = ref.clone()
        out[5] += 1 if dtype == torch.int32 else 1e-2
        leaves.append((out, ref))
        leaves.append((ref.clone().requires_grad_(dtype.is_floating_point), ref))
    conj = torch.randn(6, dtype=torch.complex64, generator=gen)
    leaves.append((conj.conj(), conj.resolve_conj().conj().resolve_conj()))
    leaves.append((conj.conj().imag, -conj.imag))
    for out, ref in leaves:
        one_pass, chunked = _both_paths(monkeypatch, out, ref, {})
        assert one_pass == chunked, (out, ref)
    tree_out = {f"w{i}": out for i, (out, _) in enumerate(leaves)}
    tree_ref = {f"w{i}": ref for i, (_, ref) in enumerate(leaves)}
    one_pass, chunked = _both_paths(monkeypatch, tree_out, tree_ref, {})
    assert one_pass == chunked


def _calls_in_one_check(out, ref) -> int:
    """Python-level calls (Python functions and C functions called from Python) that one check() makes."""
    gpuspeed.check(out, ref)  # imports and caches warmed
    events = []
    sys.setprofile(lambda frame, event, arg: events.append(event) if event in ("call", "c_call") else None)
    try:
        gpuspeed.check(out, ref)
    finally:
        sys.setprofile(None)
    return len(events)


def test_check_of_a_small_leaf_does_a_fraction_of_the_chunked_paths_work():
    # ~40 NumPy calls and ~250 Python-level calls a leaf made a pytree of 1000 small tensors cost 0.1-0.25 s a check
    # (optimize checks every candidate on several seeds); counted, not timed, so a loaded machine cannot fail it
    rng = np.random.default_rng(7)
    ref = rng.standard_normal(100)
    out = ref * (1 + 1e-15 * rng.standard_normal(100))
    calls = _calls_in_one_check(out, ref)
    assert calls <= 160, f"check() of two 100-element float64 arrays made {calls} calls (was ~254; one pass: ~128)"
    ints = rng.integers(0, 100, 100)
    calls = _calls_in_one_check(ints, ints.copy())
    assert calls <= 110, f"check() of two equal 100-element int64 arrays made {calls} calls (was ~200)"


def test_check_of_a_large_leaf_with_huge_values_raises_no_numpy_warning():
    # 1e308 against -1e308 in a leaf past one chunk printed "RuntimeWarning: overflow encountered in subtract" from
    # inside check(), as if the user's code had overflowed; the difference is judged (inf: over any tolerance)
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(verify.CHUNK + 10)
    out = ref.copy()
    out[5], ref[5] = 1e308, -1e308
    out[7], ref[7] = 1.0, 5e-324  # 1 / 5e-324 overflows too
    for sliced in (slice(None), slice(0, 100)):  # the chunked path and the one-pass one
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = gpuspeed.check(out[sliced], ref[sliced])
        assert not result.passed and result.max_abs_err == math.inf and result.worst_index == (5,), result.summary


@pytest.mark.gpu
def test_one_pass_of_cuda_tensors_matches_the_chunked_path(monkeypatch):
    # _to_host now skips the steps that do nothing on a CPU tensor (detach, cpu, resolve_conj): a CUDA tensor still takes them
    import torch

    gen = torch.Generator(device="cuda").manual_seed(19)
    leaves = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64, torch.int64):
        if dtype == torch.int64:
            ref = torch.randint(-9, 9, (4, 33), generator=gen, device="cuda", dtype=dtype)
        else:
            ref = torch.randn(4, 33, generator=gen, device="cuda").to(dtype)
        out = ref.clone()
        out[1, 5] += 1
        leaves += [(out, ref), (out.t(), ref.t()), (ref.clone().requires_grad_(dtype.is_floating_point), ref)]
    conj = torch.randn(6, dtype=torch.complex64, generator=gen, device="cuda")
    leaves += [(conj.conj(), conj.resolve_conj().conj().resolve_conj()), (conj.conj().imag, -conj.imag)]
    for out, ref in leaves:
        one_pass, chunked = _both_paths(monkeypatch, out, ref, {})
        assert one_pass == chunked, (out.dtype, out.shape)
        assert one_pass == _outcome(out.cpu(), ref.cpu(), {}), (out.dtype, out.shape)  # the GPU copy changes nothing
    with pytest.raises(UserError, match="meta tensor"):
        gpuspeed.check(torch.empty(3, device="meta"), torch.zeros(3))


def test_check_of_big_endian_arrays_uses_their_types_tolerance():
    # an array read from a file in big-endian order ('>f8': FITS, HDF5, np.frombuffer of network data) was refused:
    # "no default tolerance for dtype '>f8'; pass rtol= and atol="
    rng = np.random.default_rng(5)
    ref = rng.standard_normal(50)
    close = ref * (1 + 1e-7 * rng.standard_normal(50))
    for code, rtol in ((">f8", 1e-12), (">f4", 1e-5), (">f2", 1e-3), (">c16", 1e-12)):
        result = gpuspeed.check(close.astype(code), ref)
        assert result.leaves[0].rtol == rtol, (code, result.summary)
        assert result.passed == (rtol >= 1e-5), (code, result.summary)
    counts = rng.integers(0, 9, 20)
    assert gpuspeed.check(counts.astype(">i4"), counts).passed
    off = counts.astype(">u2")
    off[3] += 1
    assert gpuspeed.check(off, counts).n_over_tol == 1
    assert gpuspeed.check(ref, ref, dtype=">f4").leaves[0].rtol == 1e-5


def test_check_of_a_python_array_says_to_pass_it_as_a_numpy_array():
    # array.array('d', ...) and memoryviews were refused as "cannot compare array values", with no way out named
    import array

    for value in (array.array("d", [1.0, 2.0]), memoryview(np.arange(3.0))):
        with pytest.raises(UserError, match=r"cannot compare (array\.array|memoryview) values: pass np\.asarray"):
            gpuspeed.check(value, np.asarray(value))
    with pytest.raises(UserError, match=r"cannot compare set values$"):  # no such advice where it would not work
        gpuspeed.check({1.0}, {1.0})


def test_launch_tells_apart_fusion_sizes_that_round_alike():
    # `--ns 1000,1500,2000` printed N as 1e+03, 2e+03, 2e+03: two sizes read alike in the table, in launch.md and in
    # the notes on unreliable points ("eager N=2e+03" twice)
    from typer.testing import CliRunner

    from gpuspeed.cli import app

    res = CliRunner().invoke(app, ["launch", "--device", "cpu", "--ks", "1,2", "--ns", "1000,1500,2000",
                                   "--variants", "eager", "--budget", "0.01", "--tiny-k", "2", "--json"])
    assert res.exit_code == 0, res.output[-2000:]
    from gpuspeed.launch.report import to_markdown

    doc = json.loads(res.stdout)
    fusion_lines = [ln for ln in to_markdown(doc).splitlines() if ln[:3] == "| 1" or ln[:3] == "| 2"]
    fusion_lines = [ln for ln in fusion_lines if "| eager |" in ln]
    assert [ln.split(" | ")[0] for ln in fusion_lines] == ["| 1e+03", "| 1,500", "| 2e+03"], fusion_lines
    table = CliRunner().invoke(app, ["launch", "--device", "cpu", "--ks", "1,2", "--ns", "1500",
                                     "--variants", "eager", "--budget", "0.01", "--tiny-k", "2"])
    assert table.exit_code == 0 and "│ 1,500 │" in table.stdout, table.output[-2000:]


def test_check_of_big_endian_uint64_past_int64_is_exact():
    # '>u8' is not np.uint64's dtype, so its values were taken as int64: 2**64 - 1 against 0 read "max abs 1", and
    # passed under atol=2
    top = np.iinfo(np.uint64).max
    for code in (">u8", "<u8"):
        out, ref = np.array([top, 5], dtype=code), np.array([0, 5], dtype=code)
        result = gpuspeed.check(out, ref, atol=2)
        assert not result.passed and result.max_abs_err == float(top) and result.n_over_tol == 1, (code, result.summary)
        near = gpuspeed.check(out, np.array([top - 1, 5], dtype=code))
        assert near.max_abs_err == 1.0 and near.rel_l2_err < 1e-19, (code, near.summary)


def test_a_measurement_record_with_negative_times_is_refused():
    # a hand-edited or corrupted record with samples [-1, 1, 2] read back as "1.000 s median" (its statistics
    # recomputed from them) and went on into compare()
    from gpuspeed.timing import Measurement

    record = {"name": "x", "samples": [-1.0, 1.0, 2.0], "device": "cpu", "mode": "cpu"}
    with pytest.raises(UserError, match="none below 0"):
        Measurement.from_dict(record)
    kept = Measurement.from_dict(record | {"samples": [1e-3, 0.0, 2e-3]})  # zero is a time (a clock's tick)
    assert kept.n == 3 and kept.median == 1e-3
