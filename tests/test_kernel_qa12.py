"""`gpuspeed kernel` QA, round 12: one buffer passed to a launch as two views, what the summary's launch numbers
count, the launch record of constexpr and runtime arguments however they are passed, zero-size inputs, and targets
that are not launchers. Kernels run under the interpreters in a fresh process (they must be on before Triton and
Numba define the kernels).
"""

import json
import sys

import numpy as np
import pytest
from kernel_cli_helpers import kernel_cli, one_error, run_script


# --- one buffer passed to a launch as two views

def test_views_of_one_buffer_count_its_bytes_once_in_a_launch():
    # arg_bytes deduplicated arguments by id(): the same tensor passed twice counted once, but x and x.view(-1), or
    # x and x[::2], counted the buffer twice (and a launcher's per-launch bytes, on a GPU, inflated GB/s and % of roof)
    torch = pytest.importorskip("torch")
    from gpuspeed.kernel.capture import arg_bytes

    rng = np.random.default_rng()
    n = int(rng.integers(200, 400))
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    o = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    assert arg_bytes([x, x, o, n]) == 8 * n
    assert arg_bytes([x, x.view(-1), o]) == 8 * n
    assert arg_bytes([x, x[::2], o]) == 8 * n
    assert arg_bytes([x[: n // 2], x[n // 2:]]) == 4 * n  # two halves: the whole buffer, once
    assert arg_bytes([x[: n // 2], x[n // 2 + 8:]]) == 4 * (n - 8)  # a gap between them is not counted
    a = rng.standard_normal(n)
    assert arg_bytes([a, torch.from_numpy(a)]) == 8 * n  # a NumPy array and a tensor on its memory
    assert arg_bytes([x, x.to(torch.float64)]) == 12 * n  # a copy is memory of its own


VIEWS = '''
import json
import numpy as np
import torch
import triton
import triton.language as tl
from gpuspeed import kernel_report
from gpuspeed.kernel.capture import Capture
from gpuspeed.kernel.report import call_bytes


@triton.jit
def axpy(x, y, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, 2.0 * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


def twice(x):  # two launches, each reading x through two views of it
    o = torch.empty_like(x)
    axpy[(triton.cdiv(x.numel(), 64),)](x, x.view(-1), o, x.numel(), BLOCK=64)
    axpy[(triton.cdiv(x.numel(), 64),)](o, o.view(-1), o, x.numel(), BLOCK=64)
    return o


rng = np.random.default_rng()
x = torch.from_numpy(rng.standard_normal(int(rng.integers(100, 300))).astype(np.float32))
rep = kernel_report(twice, x, device="cpu", expected=9.0 * x.numpy())
assert rep.check["passed"], rep.check
with Capture() as cap:
    twice(x)
print(json.dumps({"n": x.numel(), "rows": [[la["arg_bytes"], la["count"]] for la in rep.launches],
                  "arg_bytes": [la.arg_bytes for la in cap.launches],
                  "call": call_bytes(None, 2 * x.nbytes, cap.launches)}))
'''


def test_a_launch_reading_one_buffer_through_two_views_is_not_charged_twice(tmp_path):
    pytest.importorskip("triton")
    r = run_script(tmp_path, VIEWS)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    n = got["n"]
    # each launch moves x (or o) and o: 8 bytes an element, however many views of them it was handed
    assert got["arg_bytes"] == [8 * n, 4 * n] and got["rows"] == [[8 * n, 2]], got
    # the call: launch 1 reads x and writes o, launch 2 reads and writes o -- 12n by the launches, above the floor
    assert got["call"][0] == 12 * n, got


# --- the summary's launch numbers

def _report(counts: list[int]):
    from gpuspeed.kernel.report import KernelReport

    launches = [{"kernel": f"k{i}", "backend": "triton", "grid": [i + 1, 1, 1], "block": None, "num_warps": 4,
                 "num_stages": 3, "count": c} for i, c in enumerate(counts)]
    return KernelReport(name="loop", backend="triton", gpu=False, note=None, time_s=None, time_rel_iqr=None,
                        launches=launches, placement=None, pct_of_roof=None, occupancy_pct=None, limiter=None,
                        verdict="v", next_lever="l")


def test_the_summary_counts_launches_and_distinct_launches_apart():
    # summary["launches"] was len(launches): the distinct launch configurations, so a launcher that launched one
    # kernel 100 times read "launches: 1"
    rng = np.random.default_rng()
    counts = [int(rng.integers(2, 200)), 1, int(rng.integers(2, 50))]
    rep = _report(counts)
    summary = rep.to_results()["summary"]
    assert summary["launch_count"] == sum(counts) and summary["distinct_launches"] == 3, summary
    assert "launches" not in summary  # the old name, which counted distinct configurations: not reused
    assert f"launches: {sum(counts)} in one call, 3 distinct" in rep.lines()
    one = _report([1])
    assert one.to_results()["summary"]["launch_count"] == 1 and "launches: 1 in one call" in one.lines()


# --- constexpr and runtime arguments, by position or by keyword

CHUNKS = '''
import json
import numpy as np
import torch
import triton
import triton.language as tl
from gpuspeed import kernel_report


@triton.jit
def chunk(x, o, off, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = off + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) * SCALE, mask=m)


def by_keyword(x):
    o = torch.empty_like(x)
    for i in range(0, x.numel(), 128):
        chunk[(2,)](x, o, off=i, n=x.numel(), BLOCK=64, SCALE=3.0)
    return o


def by_position(x):
    o = torch.empty_like(x)
    for i in range(0, x.numel(), 128):
        chunk[(2,)](x, o, i, x.numel(), 3.0, 64)
    return o


rng = np.random.default_rng()
x = torch.from_numpy(rng.standard_normal(int(rng.integers(3, 6)) * 128).astype(np.float32))
out = {"chunks": x.numel() // 128}
for f in (by_keyword, by_position):
    rep = kernel_report(f, x, device="cpu", expected=3.0 * x.numpy())
    assert rep.check["passed"], rep.check
    out[f.__name__] = [[la["count"], la["meta"]] for la in rep.launches]
print(json.dumps(out))
'''


def test_a_launch_records_its_constexprs_and_not_its_runtime_arguments_however_passed(tmp_path):
    # meta took every plain keyword argument and nothing positional: a loop passing its offset by keyword
    # (off=i) listed each launch on a line of its own (identical lines, the offset told them apart), and
    # BLOCK / SCALE passed by position were missing from the record
    pytest.importorskip("triton")
    r = run_script(tmp_path, CHUNKS)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    want = [[got["chunks"], {"SCALE": 3.0, "BLOCK": 64}]]
    assert got["by_keyword"] == want and got["by_position"] == want, got


# --- zero-size inputs

NUMBA_SUM = '''
import numpy as np
from numba import cuda, float32

TPB = 32


@cuda.jit
def block_sums(x, out):
    s = cuda.shared.array(TPB, dtype=float32)  # a static shared array
    i, t = cuda.grid(1), cuda.threadIdx.x
    s[t] = x[i] if i < x.shape[0] else 0.0
    cuda.syncthreads()
    if t == 0:
        acc = 0.0
        for k in range(TPB):
            acc += s[k]
        out[cuda.blockIdx.x] = acc


def launcher(x):
    out = np.empty((x.shape[0] + TPB - 1) // TPB, dtype=np.float32)
    block_sums[out.shape[0], TPB](x, out)
    return out
'''


def test_a_numba_launch_of_no_blocks_fails_under_the_simulator_as_on_a_gpu(tmp_path):
    # an empty input made a grid of 0 blocks: the simulator ran nothing and the report said the launcher ran and
    # returned, where a GPU refuses the launch (CUDA_ERROR_INVALID_VALUE; the bundled kernels found it on the GPU)
    pytest.importorskip("numba")
    r = kernel_cli(tmp_path, {"sums.py": NUMBA_SUM}, "sums.py:launcher", "--input", "x=float32[0]")
    err = one_error(r)
    assert "block_sums" in err and "grid (0, 1, 1)" in err and "a GPU refuses" in err, err
    n = int(np.random.default_rng().integers(40, 100))
    r = kernel_cli(tmp_path, {}, "sums.py:launcher", "--input", f"x=float32[{n}]", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    (la,) = json.loads(r.stdout)["launches"]
    assert la["grid"] == [-(-n // 32), 1, 1] and la["block"] == [32, 1, 1] and la["arg_bytes"] == 4 * (n + -(-n // 32))


# --- a target that is not a function

NOT_FUNCTIONS = '''
import numpy as np

THREADS = 128
variants = {"fast": lambda x: x, "slow": lambda x: x}
'''


@pytest.mark.parametrize("name, said", [
    ("variants", "variants is a dict, not a launcher: name one of its entries (not_functions.py:variants.fast, "
                 "not_functions.py:variants.slow)"),
    ("THREADS", "THREADS is an int, not a launcher"),
    ("np", "np is a module, not a launcher"),
])
def test_a_target_that_is_not_a_function_says_what_it_is(tmp_path, monkeypatch, name, said):
    # it said only 'not_functions.py:variants is not callable': for a workload's variants dict, not which to name
    from gpuspeed.errors import UserError
    from gpuspeed.kernel.target import load_target

    (tmp_path / "not_functions.py").write_text(NOT_FUNCTIONS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(UserError) as err:
        load_target(f"not_functions.py:{name}")
    assert said in str(err.value), str(err.value)


def test_a_bundled_example_is_named_as_optimize_takes_it(tmp_path, monkeypatch):
    """`gpuspeed kernel histogram:variants.triton` finds the bundled example, as `gpuspeed optimize histogram` does
    (it said 'no such file: histogram'); a file of that name in the folder it runs from still comes first."""
    from gpuspeed.errors import UserError
    from gpuspeed.kernel.target import load_target

    monkeypatch.chdir(tmp_path)
    fn, module, attr = load_target("histogram:variants.triton")
    assert callable(fn) and attr == "variants.triton" and module.__file__.endswith("examples/histogram.py")
    with pytest.raises(UserError, match="no such file: nosuch_example"):
        load_target("nosuch_example:f")
    (tmp_path / "histogram").write_text("not python\n")  # the user's own file of that name: theirs, and refused
    with pytest.raises(UserError, match="not a .py file"):
        load_target("histogram:variants.triton")
