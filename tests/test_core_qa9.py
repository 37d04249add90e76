"""QA round 9 on the measurement core (CPU): check() of masked and quantized arrays, dataclass arguments,
Measurement records read back from strict JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
import torch

from gpuspeed import trees
from gpuspeed.errors import UserError
from gpuspeed.results import make_results, read_results, strict_json, write_results
from gpuspeed.stats import Measurement, compare, summarize
from gpuspeed.timing import bench
from gpuspeed.verify import check, count_poisoned, poison, verify_function


def _rng():
    return np.random.default_rng()


# --- check(): NumPy masked arrays -------------------------------------------------------------------------


def test_check_masked_arrays_compare_only_the_unmasked_values():
    x = _rng().standard_normal(64)
    mask = _rng().random(64) < 0.3
    mask[5] = True
    other = x.copy()
    other[mask] = _rng().standard_normal(int(mask.sum())) + 100  # garbage under the mask
    other[5] = np.nan  # a masked NaN is not looked at
    res = check(np.ma.array(other, mask=mask), np.ma.array(x, mask=mask))
    assert res.passed, res.summary  # it failed on the masked garbage
    assert res.leaves[0].n_elements == int((~mask).sum())
    # a wrong unmasked value still fails, and its index is the one in the array
    i = int(np.flatnonzero(~mask)[-1])
    other[i] += 1.0
    res = check(np.ma.array(other, mask=mask), np.ma.array(x, mask=mask))
    assert not res.passed and res.worst_index == (i,)


def test_check_masked_arrays_with_different_masks_fail_naming_the_mask():
    x = _rng().standard_normal((4, 5))
    mask = np.zeros((4, 5), dtype=bool)
    mask[2, 3] = True
    res = check(np.ma.array(x, mask=mask), np.ma.array(x.copy()))  # it passed: the mask was dropped
    assert not res.passed and "masks differ" in res.summary and "(2, 3)" in res.summary
    res = check(np.ma.array(x, mask=mask), x.copy())  # a plain array has nothing masked
    assert not res.passed and "masks differ" in res.summary
    assert check(np.ma.array(x), x.copy()).passed  # nothing masked: a plain compare


# --- check(): quantized torch tensors ---------------------------------------------------------------------


def _quantized(x, scale=0.05):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch >= 2.10 deprecates its quantized tensors
        return torch.quantize_per_tensor(x, scale, 0, torch.qint8)


def test_check_compares_quantized_tensors_by_their_dequantized_values():
    x = torch.randn(32)
    q = _quantized(x)
    # it was a TypeError from NumPy ("Got unsupported ScalarType QInt8")
    assert check(q, q.dequantize(), rtol=0, atol=0).passed
    assert check(q, x, rtol=0, atol=0.05 / 2 + 1e-6).passed  # within half a step of the real values
    wrong = _quantized(x + 0.5)
    res = check(wrong, x, rtol=0, atol=0.05)
    assert not res.passed and "dtype qint8 vs reference float32" in res.summary


def test_check_of_a_quantized_tensor_needs_a_stated_tolerance():
    q = _quantized(torch.randn(8))
    with pytest.raises(UserError, match="quantized dtype 'qint8'.*pass rtol= and atol="):
        check(q, q.dequantize())


# --- dataclass arguments: cloned, rotated and compared like tuples of their fields ------------------------


@dataclasses.dataclass
class _Batch:
    x: torch.Tensor
    out: torch.Tensor
    scale: float = 2.0


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: np.ndarray
    tag: str = dataclasses.field(init=False, default="kept")


def test_clone_tree_copies_the_arrays_inside_a_dataclass():
    b, f = _Batch(torch.randn(64), torch.randn(64)), _Frozen(_rng().standard_normal(16))
    cb, cf = trees.clone_tree((b, f))
    assert type(cb) is _Batch and type(cf) is _Frozen and cf.tag == "kept" and cb.scale == 2.0
    assert cb.x is not b.x and cb.x.data_ptr() != b.x.data_ptr() and torch.equal(cb.x, b.x)  # was the same object
    assert cf.a is not f.a and np.array_equal(cf.a, f.a)
    assert trees.nbytes(b) == 2 * 64 * 4  # nbytes saw no arrays in it


def test_bench_rotate_cycles_fresh_copies_of_a_dataclass_argument():
    seen = set()

    def fn(batch):
        seen.add(batch.x.data_ptr())
        return batch.x.sum()

    bench(fn, _Batch(torch.randn(256), torch.randn(256)), rotate=3, device="cpu", budget_s=0.2, min_samples=3)
    assert len(seen) == 3  # every "rotation" was the one dataclass, its inputs L2-resident


def test_verify_function_compares_what_in_place_functions_wrote_into_a_dataclass():
    def reference(batch):
        batch.out.copy_(batch.x * batch.scale)

    def wrong(batch):
        batch.out.copy_(batch.x * 3)

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return (_Batch(torch.randn(128, generator=g), torch.randn(128, generator=g)),)

    # both wrote into the one shared dataclass and were compared on nothing: "PASS" for the wrong function
    assert not any(r.passed for r in verify_function(wrong, reference, make, seeds=2))
    assert all(r.passed for r in verify_function(reference, reference, make, seeds=2))


# --- Measurement records read back from strict JSON (results files, --json) ------------------------------


def test_a_measurement_read_back_from_strict_json_with_nulls_prints_and_compares():
    base = 1e-3 * (1 + 0.01 * _rng().random())
    two = summarize([base, base * 1.1], name="two", device="cpu", mode="cpu")  # rel_noise inf: written as null
    doc = json.loads(strict_json(two))
    assert doc["rel_noise"] is None
    back = Measurement.from_dict(doc)
    assert back.rel_noise == math.inf and back.unreliable
    assert "±inf%" in str(back)  # TypeError: unsupported operand type(s) for *: 'int' and 'NoneType'
    assert compare(back, back).verdict == "same"
    # an infinite sample (and the statistics it makes infinite) read back as NaN: a one-line refusal to compare
    odd = Measurement.from_dict(json.loads(strict_json(summarize([base, math.inf, base, base], name="odd",
                                                                 device="cpu", mode="cpu"))))
    assert math.isnan(odd.samples[1]) and str(odd)
    with pytest.raises(UserError, match="NaN"):
        compare(odd, back)
    assert Measurement.from_dict(doc | {"notes": None, "clocks": None}).notes == []


def test_check_takes_a_zero_d_tensor_or_array_as_its_tolerance():
    x = torch.randn(32, dtype=torch.float64)
    near = x + 1e-4 * x.abs().mean()
    eps = torch.tensor(1e-3, dtype=torch.float64)  # TypeError: '<=' between 'numpy.ndarray' and 'Tensor'
    assert check(near, x, rtol=eps).passed
    assert check(near, x, rtol=np.array(1e-3), atol=np.float32(1.0)).passed
    assert not check(near, x, rtol=torch.tensor(0.0), atol=torch.tensor(0.0)).passed
    with pytest.raises(UserError, match="rtol must be one number"):
        check(near, x, rtol=[1e-3, 1e-2])


# --- read_results(): what is not a results document is a one-line error ---------------------------------


@pytest.mark.parametrize("content, match", [(b"42", "JSON object, got a number"),
                                            (b"null", "JSON object, got null"),
                                            (b'"study schema created"', "JSON object, got a string"),
                                            (b"\x89PNG\r\n\x1a\n\xff\xfe", "not UTF-8 text")])
def test_read_results_of_something_else_is_one_line(tmp_path, content, match):
    path = tmp_path / "r.json"
    path.write_bytes(content)
    with pytest.raises(UserError, match=match):  # TypeError / UnicodeDecodeError tracebacks
        read_results(path)


def test_read_results_names_a_schema_given_as_text(tmp_path):
    doc = make_results("qa9", summary={"x": float(_rng().random())}, device="cpu")
    path = write_results(doc, tmp_path)
    assert read_results(path)["summary"] == doc["summary"]
    path.write_text(json.dumps(doc | {"schema": "1"}))
    with pytest.raises(UserError, match="schema '1' is not 1"):  # read "results schema 1 is not 1"
        read_results(path)


# --- the GPU clocks refuse a lazy result as the host clock does ------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["auto", "events", "graph", "kernel"])
def test_bench_on_the_gpu_refuses_a_lambda_returning_a_lazy_iterator(mode):
    xs = [torch.randn(1 << 16, device="cuda") for _ in range(4)]
    # events and graph timed the map object's creation (~100 ns, no launch); kernel said "saw no GPU work"
    with pytest.raises(UserError, match=r"lazy iterator \(map\).*list\("):
        bench(lambda: map(torch.exp, xs), mode=mode, budget_s=0.2)
    assert bench(lambda: list(map(torch.exp, xs)), mode=mode, budget_s=0.2, min_samples=3).median > 0


def test_check_of_a_torch_dtype_numpy_lacks_is_one_line():
    raw = torch.from_numpy(_rng().integers(0, 256, 16, dtype=np.uint8)).view(torch.bits8)
    with pytest.raises(UserError, match="cannot compare torch.bits8"):  # TypeError: unsupported ScalarType Bits8
        check(raw, raw.clone())
    assert check(raw.view(torch.uint8), raw.clone().view(torch.uint8)).passed


def test_poison_marks_a_quantized_buffer_so_its_unwritten_elements_count():
    x = torch.randn(64) * 0.5  # well inside a qint8 range of +-6.4 at scale 0.05
    buf = poison(_quantized(x))
    assert count_poisoned(buf) == 64  # it read 0: NaN quantized to the top step, which looked written
    assert count_poisoned(_quantized(x)) == 0


def test_verify_function_names_a_dict_from_make_inputs_passed_whole():
    # gpuspeed.inputs.make_inputs returns {name: array}; verify_function passes a non-tuple as the one argument, so
    # f(a, b) raised a bare TypeError 'missing 1 required positional argument' that named neither cause nor way out
    from gpuspeed.inputs import make_inputs, parse_specs
    from gpuspeed.verify import verify_function

    specs = parse_specs(["a=float32[5]", "b=float32[5]"])

    def f(a, b):
        return a + b

    with pytest.raises(UserError, match=r"make_inputs returned a dict.*return the arguments as a tuple"):
        verify_function(f, f, lambda seed: make_inputs(specs, seed=seed, backend="numpy"), seeds=1)
    # a function that takes the dict itself is unchanged
    res = verify_function(lambda d: d["a"] * 2, lambda d: d["a"] + d["a"],
                          lambda seed: make_inputs(specs, seed=seed, backend="numpy"), seeds=1)
    assert res[0].passed


def test_a_dataclass_with_an_unset_init_false_field_is_walked_bench_checked_and_recorded():
    # 92d85e4 walked every declared field: a field(init=False) never set raised AttributeError in trees, so bench,
    # capture, check and verify_function all failed on such an argument or result
    import dataclasses

    from gpuspeed.results import strict_json
    from gpuspeed.trees import clone_tree, flatten, unflatten
    from gpuspeed.verify import check

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        cache: object = dataclasses.field(init=False)

    b = Batch(torch.randn(5))
    leaves, spec = flatten((b,))
    assert len(leaves) == 1 and leaves[0] is b.x
    c = clone_tree((b,))[0]
    assert torch.equal(c.x, b.x) and c.x is not b.x and not hasattr(c, "cache")
    assert unflatten(spec, [b.x * 2])[0].x.equal(b.x * 2)
    assert check(Batch(b.x.clone()), b).passed
    bad = Batch(b.x.clone())
    bad.cache = 1  # set on one side only: the fields differ
    assert not check(bad, b).passed
    from gpuspeed import bench

    m = bench(lambda batch: batch.x * 2, b, device="cpu", budget_s=0.05)
    assert m.median > 0
    assert '"x"' in strict_json(b)


def test_every_command_prints_json_through_strict_json():
    # bench, decode, kernel, launch --explain, optimize and roofline printed --json with json.dumps: a NaN or inf
    # (a failed row's time, a 0-byte placement's intensity) came out as NaN/Infinity, which strict parsers refuse
    import ast
    from pathlib import Path

    import gpuspeed.commands as commands

    offenders = []
    for path in sorted(Path(commands.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dumps"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
