"""gpuspeed.kernel on the CPU: the occupancy formula against hand-computed cases, the ordered verdict rules on
synthetic facts, launch capture under the Triton interpreter (in this process) and the Numba CUDA simulator
(in a fresh process: the simulator must be chosen before numba.cuda is imported), and `gpuspeed kernel`.

Without CUDA, TRITON_INTERPRET=1 is set before triton is imported (as test_decode_kernels does); on a GPU the
in-process interpreter test is skipped and the command-line tests (fresh processes, --device cpu) cover it.
The Triton kernels below also serve `gpuspeed kernel tests/test_kernel_report.py:add_launcher`, with
`inputs(rng)` giving its arguments.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuspeed import check, poison
from gpuspeed.kernel import verdict
from gpuspeed.kernel.occupancy import KNOWN, known_limits, occupancy

ROOT = Path(__file__).resolve().parents[1]
N = 1000  # divides none of the block sizes below

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: it decorates tl.sum & co. then
triton = pytest.importorskip("triton")
tl = triton.language
INTERPRETED = type(tl.sum).__name__ == "InterpretedFunction"
# kernel_report(..., device="cpu") in this process needs the interpreter: CPU tensors reach no compiled kernel
in_process_interpreter = pytest.mark.skipif(
    not INTERPRETED, reason="triton was imported before TRITON_INTERPRET=1 (or there is a GPU): "
                            "the command-line tests cover the interpreter in fresh processes")


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4, num_stages=2),
                          triton.Config({"BLOCK": 64}, num_warps=2)], key=["n"])
@triton.jit
def add_kernel(x, y, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def rowsum_kernel(x, o, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    v = tl.load(x + row * cols + offs, mask=offs < cols, other=0.0)
    tl.store(o + row, tl.sum(v, axis=0))


def add_launcher(x, y):
    """Two launches: the autotuned add, then a row sum of the result seen as 8 rows (a 1-D grid of 8)."""
    o = poison(torch.empty_like(x))
    add_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, o, x.numel())
    rows = poison(torch.empty(8, dtype=x.dtype, device=x.device))
    cols = o.numel() // 8
    rowsum_kernel[(8,)](o, rows, cols, BLOCK=triton.next_power_of_2(cols), num_warps=1)
    return o, rows


add_launcher.gpuspeed_inputs = "torch"  # `gpuspeed kernel` moves inputs(rng)'s arrays to torch on the device


def repeat_launcher(x):
    """The same row sum three times, then once over half the rows: two distinct launches."""
    rows = poison(torch.empty(8, dtype=x.dtype, device=x.device))
    cols = x.numel() // 8
    for _ in range(3):
        rowsum_kernel[(8,)](x, rows, cols, BLOCK=triton.next_power_of_2(cols), num_warps=1)
    half = poison(torch.empty(4, dtype=x.dtype, device=x.device))
    rowsum_kernel[(4,)](x, half, cols, BLOCK=triton.next_power_of_2(cols), num_warps=1)
    return rows, half


def inputs(rng):
    """Example arguments for `gpuspeed kernel` (the optimize workload format: host arrays)."""
    return tuple(rng.standard_normal(N).astype(np.float32) for _ in range(2))


# --- occupancy: hand-computed cases on sm_90 (64 warps, 32 blocks, 64K registers in 4 sub-partitions,
# 228 KB shared per SM, 1 KB reserved per block)
H200 = KNOWN["9.0"]


@pytest.mark.parametrize("threads,regs,smem,blocks,pct,limiter", [
    (256, 255, 0, 1, 12.5, "registers"),        # 255*32 -> 8192 regs/warp, 2 warps per sub-partition: 8 warps
    (128, 32, 48 * 1024, 4, 25.0, "shared_memory"),  # (48K + 1K) per block: 233472 // 50176 = 4 blocks
    (1024, 32, 0, 2, 100.0, "warps"),           # 64 warps // 32 per block = 2; registers allow 2 too
    (1024, 64, 0, 1, 50.0, "registers"),        # 2048 regs/warp: 8 per sub-partition, 32 warps, 1 block
    (1024, 65, 0, 0, 0.0, "registers"),         # 65*32 -> 2304/warp x 32 warps > 65536 per block: cannot launch
    (32, 16, 0, 32, 50.0, "blocks"),            # 32 one-warp blocks: the block cap
    (32, 200, 0, 8, 12.5, "registers"),         # 6400 regs/warp: 2 per sub-partition (10 if the SM were one pool)
    (256, 33, 0, 6, 75.0, "registers"),         # 33*32=1056 rounds to 1280: 12 per sub-partition (15 unrounded)
    (128, 32, 232449, 0, 0.0, "shared_memory"),  # over the 227 KB per-block opt-in limit
    (2048, 16, 0, 0, 0.0, "warps"),             # over 1024 threads per block
])
def test_occupancy_hand_cases(threads, regs, smem, blocks, pct, limiter):
    occ = occupancy(threads, regs, smem, H200)
    assert occ["blocks_per_sm"] == blocks
    assert occ["pct"] == pytest.approx(pct)
    assert occ["limiter"] == limiter
    assert occ["active_warps_per_sm"] == blocks * -(-threads // 32)


def test_occupancy_other_ccs_and_lookup():
    ada = known_limits("sm_89")
    assert ada is KNOWN["8.9"] and known_limits((8, 6)) is KNOWN["8.6"] and known_limits("6.1") is None
    occ = occupancy(256, 32, 0, KNOWN["8.6"])  # 48 warps per SM: 6 blocks of 8 warps fill it
    assert (occ["blocks_per_sm"], occ["pct"], occ["limiter"]) == (6, 100.0, "warps")
    occ = occupancy(64, 32, 0, KNOWN["8.6"])  # 16 blocks of 2 warps: 32 of 48 warps
    assert (occ["blocks_per_sm"], occ["limiter"]) == (16, "blocks") and occ["pct"] == pytest.approx(200 / 3)
    # A100: 164 KB per SM, 40 KB blocks (+1 KB) -> 4 blocks
    assert occupancy(128, 32, 40 * 1024, KNOWN["8.0"])["blocks_per_sm"] == 4
    with pytest.raises(ValueError):
        occupancy(0, 32, 0, H200)


# --- verdict rules on synthetic facts
def _launch(grid=(1000, 1, 1), regs=32, spills=0, pct=100.0, limiter="warps", backend="triton", num_warps=4):
    return {"kernel": "k", "backend": backend, "grid": list(grid), "num_warps": num_warps, "threads_per_block": 128,
            "registers": regs, "spills": spills,
            "occupancy": {"pct": pct, "limiter": limiter, "blocks_per_sm": 1, "active_warps_per_sm": 1,
                          "max_warps_per_sm": 64}}


def _facts(pct_of_roof=None, time_s=1e-3, copy_pct=None, **launch):
    la = _launch(**launch)
    return {"gpu": True, "launches": [la], "main": la, "sms": 132, "pct_of_roof": pct_of_roof, "bound": "memory",
            "roof": "copy", "time_s": time_s, "occupancy_pct": la["occupancy"]["pct"],
            "limiter": la["occupancy"]["limiter"], "copy_pct": copy_pct}


@pytest.mark.parametrize("facts,rule,words", [
    ({"gpu": False, "launches": [_launch()]}, "no_gpu", "interpreters"),
    ({"gpu": True, "launches": []}, "no_launch", "no Triton"),
    ({"gpu": False, "launches": []}, "no_launch", "no Triton"),  # without a GPU too: the launcher launched nothing
    (_facts(92.0, spills=64, pct=25.0, limiter="registers"), "at_roof", "at 92 % of the copy roof: done"),
    (_facts(160.0), "at_roof", "above the copy roof (160 %): cache-resident"),
    # as fast as device copies of the same bytes per launch: no tuning left, whatever else the launch shows
    (_facts(69.7, copy_pct=67.4, pct=25.0, limiter="registers"), "at_copy",
     "at 70 % of the copy roof, where device copies of the same bytes per launch reach 67 %"),
    (_facts(65.0, copy_pct=67.4), "at_copy", "at the practical roof for this launch size"),
    (_facts(60.0, copy_pct=92.0), "tune", "at 60 % of the copy roof"),
    (_facts(40.0, spills=64, pct=25.0, limiter="registers"), "spills",
     "spills 64 bytes per thread: fewer elements per thread: a smaller BLOCK, or more num_warps"),
    (_facts(40.0, grid=(40, 1, 1), pct=25.0, limiter="registers"), "small_grid",
     "grid of 40 programs on 132 SMs: split the work"),
    (_facts(40.0, pct=50.0, limiter="registers", num_warps=8), "occupancy",
     "register-limited to 50 % occupancy: try num_warps=4"),
    (_facts(60.0, pct=25.0, limiter="shared_memory"), "occupancy", "shared-memory-limited to 25 %"),
    (_facts(20.0, time_s=4e-6), "launch_bound", "launch-bound"),
    (_facts(20.0), "latency", "latency-bound at 20 % of the copy roof with 100 % occupancy"),
    # copies of the same bytes run far faster at this occupancy: the loads are not the limit, the work between them is
    (_facts(43.0, copy_pct=93.0, pct=56.25), "own_work",
     "bound by its own instructions at 43 % of the copy roof: device copies of the same bytes reach 93 %"),
    (_facts(43.0, copy_pct=60.0), "latency", "latency-bound at 43 %"),  # copies barely faster: not its instructions
    (_facts(43.0, copy_pct=93.0, pct=25.0, limiter="registers"), "occupancy", "register-limited to 25 %"),
    (_facts(65.0), "tune", "at 65 % of the copy roof"),
    (_facts(None), "unplaced", "no roof position"),
    # a wrong answer is the verdict before any timing rule, with or without a GPU
    ({**_facts(92.0), "check": {"passed": False, "summary": "FAIL out: 3/8 over tolerance", "against": "f's original()"}},
     "wrong", "WRONG: its output differs from f's original(): FAIL out: 3/8"),
    ({"gpu": False, "launches": [_launch()], "check": {"passed": False, "summary": "FAIL", "against": "x"}}, "wrong",
     "WRONG"),
    ({"gpu": False, "launches": [_launch()], "check": {"passed": True, "summary": "PASS", "against": "f's original()"}},
     "no_gpu", "its output matches f's original()"),
    ({**_facts(92.0), "check": {"passed": True, "summary": "PASS", "against": "x"}}, "at_roof", "done"),
])
def test_verdict_rules_in_order(facts, rule, words):
    got, said, lever = verdict.judge(facts)
    assert got == rule
    assert words in said and lever


def test_verdict_skips_an_occupancy_lever_the_autotuner_already_timed():
    # the H200 histogram: 8 warps at 50 % (registers), the 4-warp configs timed and not chosen, copies far faster
    f = _facts(42.8, copy_pct=94.6, pct=50.0, limiter="registers", num_warps=8)
    assert verdict.judge(f)[:2] == ("occupancy", "register-limited to 50 % occupancy: try num_warps=4")
    tried = [{"config": {"BLOCK": 4096, "num_warps": 8, "num_stages": 1}, "time_ms": 0.215},
             {"config": {"BLOCK": 2048, "num_warps": 4, "num_stages": 1}, "time_ms": 0.216}]
    f["main"]["autotune"] = {"chosen": tried[0]["config"], "tried": tried}
    assert verdict.judge(f)[0] == "own_work"
    # only timed configs count: one listed without a time (a cached choice) leaves the lever to try
    f["main"]["autotune"] = {"chosen": tried[0]["config"], "tried": [dict(tried[1], time_ms=None)]}
    assert verdict.judge(f)[0] == "occupancy"
    # shared memory: the lever is fewer stages
    g = _facts(30.0, pct=25.0, limiter="shared_memory")
    g["main"]["num_stages"] = 3
    g["main"]["autotune"] = {"tried": [{"config": {"num_warps": 4, "num_stages": 2}, "time_ms": 0.3}]}
    assert verdict.judge(g)[0] == "tune"  # not "fewer num_stages" again: it was timed


def test_verdict_numba_levers_and_main_launch():
    f = _facts(30.0, spills=16, backend="numba")
    assert "fewer live values" in verdict.judge(f)[2]
    small = dict(_launch(grid=(1, 1, 1)), threads_per_block=32)
    big = _launch(grid=(4, 100, 1))
    assert verdict.main_launch([small, big]) is big
    assert verdict.main_launch([dict(small, count=10000), big])["count"] == 10000  # 320000 threads in all
    assert verdict.judge({**_facts(30.0), "launches": [small, big], "main": big})[0] == "latency"
    # a Numba kernel has no num_warps or num_stages to tune: its lever names what it has
    assert "num_warps" in verdict.judge(_facts(65.0))[2]
    assert "num_warps" not in verdict.judge(_facts(65.0, backend="numba"))[2]


# --- the roof position, on the H200's committed ceilings
def test_placement_on_the_copy_roof():
    from gpuspeed.kernel.report import copy_roof_view, placement
    from gpuspeed.roofline.study import ceilings_from_results

    ceil = ceilings_from_results(json.loads((ROOT / "results/nvidia-h200/roofline.json").read_text()))
    copy = ceil.value("copy")
    assert ceil.mem_roof_GBps() > copy  # the read stream is faster: a read+write kernel is held to copy
    view = copy_roof_view(ceil)
    assert view.mem_roof_GBps() == copy and view.value("fp32") == ceil.value("fp32")
    nbytes = 3 * 2**27  # two inputs read, one output written
    p = placement("add", None, nbytes, nbytes / (0.9 * copy * 1e9), view, "fp32")  # no FLOP count: memory roof
    assert p["bound"] == "memory" and p["roof"] == "copy" and p["pct_of_roof"] == pytest.approx(90.0)
    assert p["intensity"] == 0 and p["flops_source"].startswith("none")
    peak = ceil.value("fp32")
    flops = 1e12  # 1 TFLOP over 1 MiB: far right of the ridge
    p = placement("fma", flops, 2**20, flops / (0.5 * peak * 1e12), view, "fp32")
    assert p["bound"] == "compute" and p["roof"] == "fp32" and p["pct_of_roof"] == pytest.approx(50.0)
    ai = 2.0  # left of the fp32 ridge (about 15 FLOP/B): memory-bound with a FLOP count too
    p = placement("axpy", ai * nbytes, nbytes, nbytes / (0.75 * copy * 1e9), view, "fp32")
    assert p["bound"] == "memory" and p["roof"] == "copy" and p["pct_of_roof"] == pytest.approx(75.0)


# --- capture under the Triton interpreter (this process)
@in_process_interpreter
def test_a_launcher_that_launches_nothing_says_so_on_the_cpu():
    from gpuspeed import kernel_report

    rep = kernel_report(lambda x: None, torch.ones(4), name="nothing", device="cpu")
    assert rep.rule == "no_launch" and rep.output is None and rep.launches == []
    assert rep.lines()[0] == "nothing: no Triton or Numba CUDA launch seen (interpreted, no GPU)"


@in_process_interpreter
def test_triton_launcher_interpreted():
    from gpuspeed import kernel_report

    rng = np.random.default_rng(1)
    x, y = (torch.from_numpy(rng.standard_normal(N).astype(np.float32)) for _ in range(2))
    rep = kernel_report(add_launcher, x, y, device="cpu")
    o, rows = rep.output
    ref = x.double() + y.double()
    assert check(o, ref).passed
    assert check(rows, ref[: 8 * (N // 8)].reshape(8, -1).sum(1)).passed
    d = rep.to_dict()
    assert d["backend"] == "triton" and d["gpu"] is False and d["time_s"] is None and "interpreters" in d["note"]
    assert d["rule"] == "no_gpu" and d["occupancy_pct"] is None and d["placement"] is None
    add, rowsum = d["launches"]
    chosen = add["autotune"]["chosen"]
    assert chosen["BLOCK"] == 128 and chosen["num_warps"] == 4  # the first config: the interpreter times nothing
    assert add["grid"] == [-(-N // 128), 1, 1] and add["num_warps"] == 4 and add["num_stages"] == 2
    assert sorted(t["config"]["BLOCK"] for t in add["autotune"]["tried"]) == [64, 128]
    assert all(t["time_ms"] is None for t in add["autotune"]["tried"])
    assert rowsum["kernel"] == "rowsum_kernel" and rowsum["grid"] == [8, 1, 1] and rowsum["num_warps"] == 1
    assert rowsum["autotune"] is None and rowsum["meta"]["BLOCK"] == 128
    assert add["arg_bytes"] == 3 * 4 * N and rowsum["arg_bytes"] == 4 * N + 4 * 8  # x, y, o; then o, rows
    json.dumps(d)  # JSON-safe
    assert add["count"] == 1 and rowsum["count"] == 1


def test_call_bytes_counts_each_launchs_arguments_for_multi_pass_launchers():
    from gpuspeed.kernel.capture import Launch, arg_bytes
    from gpuspeed.kernel.report import call_bytes

    x = torch.ones(100, dtype=torch.float64)
    # x[:10] is memory of x's: counted once with it (test_kernel_qa12: views of one buffer)
    assert arg_bytes([x, x, x[:10], np.float64(2.0), 3, 0.5, np.ones(4, np.float32)]) == 800 + 16
    steps = [Launch(kernel="step", backend="triton", grid=[1, 1, 1], arg_bytes=1600) for _ in range(40)]
    assert call_bytes(None, 1600, steps) == (64000, "each of its 40 launches moving its array arguments once")
    assert call_bytes(None, 1600, steps[:1]) == (1600, "inputs read once + outputs written once")  # one launch
    assert call_bytes(None, 99999, steps)[0] == 99999  # arguments adding up to less: the inputs and outputs
    assert call_bytes(123, 1600, steps) == (123, "given")


@in_process_interpreter
def test_kernel_report_checks_the_output_against_an_expected_one():
    from gpuspeed import kernel_report

    rng = np.random.default_rng(5)
    x, y = (torch.from_numpy(rng.standard_normal(N).astype(np.float32)) for _ in range(2))
    want = (x.double() + y.double()).numpy()
    rows = want[: 8 * (N // 8)].reshape(8, -1).sum(1)
    good = kernel_report(add_launcher, x, y, device="cpu", expected=(want, rows), against="x + y")
    assert good.check["passed"] and good.check["against"] == "x + y" and good.rule == "no_gpu"
    assert "its output matches x + y" in good.verdict
    assert any(line.startswith("check against x + y: PASS") for line in good.lines())
    off = want.copy()
    off[N - 1] += 1.0  # the last element: the one a block that does not divide N would leave unwritten
    bad = kernel_report(add_launcher, x, y, device="cpu", expected=(off, rows), rtol=1e-5, atol=1e-6, against="x + y")
    assert bad.check["passed"] is False and bad.rule == "wrong" and "1/1000 over tolerance" in bad.check["summary"]
    assert bad.check["rtol"] == 1e-5 and bad.to_results()["summary"]["check_passed"] is False
    assert bad.verdict.startswith("WRONG: its output differs from x + y")
    none = kernel_report(lambda x: add_launcher(x, x) and None, x, device="cpu", expected=want)
    assert none.rule == "wrong" and "output NoneType" in none.check["summary"]  # a launcher that returns nothing


@pytest.mark.skipif(not INTERPRETED, reason="triton was imported before TRITON_INTERPRET=1 (or there is a GPU)")
def test_identical_launches_are_counted_once():
    from gpuspeed import kernel_report

    x = torch.from_numpy(np.random.default_rng(2).standard_normal(8 * 37).astype(np.float32))
    rep = kernel_report(repeat_launcher, x, device="cpu")
    rows, half = rep.output
    ref = x.double().reshape(8, 37).sum(1)
    assert check(rows, ref).passed and check(half, ref[:4]).passed
    got = [(la["kernel"], la["grid"], la["count"]) for la in rep.to_dict()["launches"]]
    assert got == [("rowsum_kernel", [8, 1, 1], 3), ("rowsum_kernel", [4, 1, 1], 1)]
    assert "rowsum_kernel x3 [triton]" in "\n".join(rep.lines())


def test_watching_launches_is_true_only_while_a_capture_is_open():
    # a launcher that replays CUDA graphs asks this to launch eagerly where its kernels must be seen
    from gpuspeed.kernel.capture import Capture, watching_launches

    assert not watching_launches()
    with Capture():
        assert watching_launches()
        with Capture():
            assert watching_launches()
        assert watching_launches()  # the outer one is still open
    assert not watching_launches()
    with pytest.raises(ZeroDivisionError), Capture():
        raise ZeroDivisionError("inside the capture")
    assert not watching_launches()  # closed by the error too


@pytest.mark.skipif(CUDA, reason="the kernel would compile and run on the GPU")
def test_compiled_kernel_without_gpu_is_a_user_error(tmp_path):
    script = tmp_path / "compiled.py"  # @triton.jit reads its source from a file
    script.write_text(textwrap.dedent('''
        import torch, triton, triton.language as tl
        from gpuspeed import UserError, kernel_report

        @triton.jit
        def copy(x, o, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(o + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)

        def launcher(x):
            o = torch.empty_like(x)
            copy[(1,)](x, o, x.numel(), BLOCK=16)
            return o

        try:
            kernel_report(launcher, torch.randn(10), device="cpu")
        except UserError as exc:
            print("USERERROR", exc)
    '''))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert "USERERROR launcher cannot run here: there is no GPU" in r.stdout, (r.stdout, r.stderr[-2000:])


# --- the Numba CUDA simulator (a fresh process)
def _numba_available() -> bool:
    probe = "import numba, numba.cuda"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True).returncode == 0


NUMBA_FILE = textwrap.dedent('''
    import numpy as np
    from numba import cuda, float32
    from gpuspeed import poison

    @cuda.jit
    def tile_scale(x, o, a):
        tile = cuda.shared.array((64,), float32)
        i = cuda.grid(1)
        t = cuda.threadIdx.x
        if i < x.size:
            tile[t] = x[i]
        cuda.syncthreads()
        if i < x.size:
            o[i] = a * tile[t]

    @cuda.jit
    def add2d(x, o):
        r, c = cuda.grid(2)
        if r < x.shape[0] and c < x.shape[1]:
            o[r, c] = x[r, c] + 1.0

    def launcher(x, m):
        o = poison(np.empty_like(x))
        tile_scale[(x.size + 63) // 64, 64](x, o, np.float32(3.0))
        o2 = poison(np.empty_like(m))
        add2d[((m.shape[0] + 7) // 8, (m.shape[1] + 15) // 16), (8, 16), 0, 256](m, o2)
        return o, o2

    def inputs(rng):
        return rng.standard_normal(77).astype(np.float32), rng.standard_normal((13, 21)).astype(np.float32)

    def mixed(x):
        """A Numba launch, then a Triton one: backend 'mixed'."""
        import torch

        o = poison(np.empty_like(x))
        tile_scale[(x.size + 63) // 64, 64](x, o, np.float32(3.0))
        t = torch.from_numpy(o)
        out = poison(torch.empty_like(t))
        neg[(triton.cdiv(t.numel(), 32),)](t, out, t.numel(), BLOCK=32)
        return out

    try:
        import triton
        import triton.language as tl

        @triton.jit
        def neg(x, o, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(o + offs, -tl.load(x + offs, mask=offs < n), mask=offs < n)
    except ImportError:
        pass
''')


@pytest.fixture
def numba_file(tmp_path):
    if not _numba_available():
        pytest.skip("numba / numba-cuda not installed")
    p = tmp_path / "numba_launcher.py"
    p.write_text(NUMBA_FILE)
    return p


def _cli(*args, env=None, cwd=ROOT):
    env = {**os.environ, **(env or {})}
    env.pop("TRITON_INTERPRET", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)  # the command sets both itself when there is no GPU
    return subprocess.run([sys.executable, "-m", "gpuspeed", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def test_numba_launcher_simulated(numba_file):
    script = textwrap.dedent(f'''
        import json, sys
        import numpy as np
        sys.path.insert(0, {str(numba_file.parent)!r})
        import numba_launcher as nl
        from gpuspeed import kernel_report, check
        x, m = nl.inputs(np.random.default_rng(3))
        rep = kernel_report(nl.launcher, x, m, device="cpu")
        o, o2 = rep.output
        d = rep.to_dict()
        d["ok"] = [check(o, 3.0 * x.astype(np.float64)).passed, check(o2, m.astype(np.float64) + 1).passed]
        mixed = kernel_report(nl.mixed, x, device="cpu")
        d["mixed"] = [mixed.backend, [la["backend"] for la in mixed.launches],
                      check(mixed.output, -3.0 * x.astype(np.float64)).passed]
        print(json.dumps(d))
    ''')
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["ok"] == [True, True]
    assert d["mixed"] == ["mixed", ["numba", "triton"], True]
    assert d["backend"] == "numba" and d["gpu"] is False and d["time_s"] is None
    one, two = d["launches"]
    assert (one["kernel"], one["grid"], one["block"], one["shared_dynamic"]) == ("tile_scale", [2, 1, 1], [64, 1, 1], 0)
    assert (two["kernel"], two["grid"], two["block"], two["shared_dynamic"]) == ("add2d", [2, 2, 1], [8, 16, 1], 256)
    assert one["num_warps"] is None and one["threads_per_block"] == 64 and two["threads_per_block"] == 128
    assert d["main_kernel"] == "add2d"  # 4 blocks x 128 threads start more threads than 2 x 64


# --- the command line
def test_cli_triton_json_from_inputs_rng():
    r = _cli("kernel", "tests/test_kernel_report.py:add_launcher", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["backend"] == "triton" and d["gpu"] is False and "interpreters" in d["note"]
    assert [la["kernel"] for la in d["launches"]] == ["add_kernel", "rowsum_kernel"]
    assert d["launches"][0]["grid"] == [-(-N // 128), 1, 1]
    assert any("inputs(rng)" in n for n in d["notes"])


def test_cli_input_specs_and_out(tmp_path):
    r = _cli("kernel", "tests/test_kernel_report.py:add_launcher", "--input", "x=float32[515]",
             "--input", "y=float32[515]", "--out", str(tmp_path), "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "grid (5, 1, 1)" in r.stdout and "verdict:" in r.stdout and "next lever:" in r.stdout
    doc = json.loads((tmp_path / "kernel_report.json").read_text())
    assert doc["study"] == "kernel_report" and doc["summary"]["launch_count"] == 2 and doc["summary"]["gpu"] is False
    assert doc["rows"][0]["grid"] == [5, 1, 1] and doc["report"]["backend"] == "triton"


def test_cli_numba_file(numba_file):
    r = _cli("kernel", f"{numba_file}:launcher", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["backend"] == "numba" and [la["block"] for la in d["launches"]] == [[64, 1, 1], [8, 16, 1]]


def test_cli_launcher_that_imports_its_kernels_late(numba_file):
    # the launcher's module imports numba only inside the call: the capture patches it after the warm-up call
    (numba_file.parent / "late.py").write_text(textwrap.dedent('''
        import numpy as np

        def launcher(x, m):
            import numba_launcher
            return numba_launcher.launcher(x, m)

        def inputs(rng):
            return rng.standard_normal(50).astype(np.float32), rng.standard_normal((9, 17)).astype(np.float32)
    '''))
    r = _cli("kernel", f"{numba_file.parent / 'late.py'}:launcher", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["backend"] == "numba" and [la["grid"] for la in d["launches"]] == [[1, 1, 1], [2, 2, 1]]


WORKLOAD = '''
"""A workload (the optimize format) with one right and one wrong Triton variant."""
import numpy as np
import torch
import triton
import triton.language as tl

TOLERANCE = dict(rtol=1e-6, atol=1e-9)


@triton.jit
def scale_kernel(x, o, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m) * factor, mask=m)


def scaled(factor):
    def launcher(x):
        o = torch.full_like(x, float("nan"))
        scale_kernel[(triton.cdiv(x.numel(), 64),)](x, o, x.numel(), factor, BLOCK=64)
        return o
    launcher.gpuspeed_inputs = "torch"
    return launcher


def original(x):
    return 2.0 * x


def inputs(rng):
    return (rng.standard_normal(999),)


variants = {"right": scaled(2.0), "wrong": scaled(2.001)}
'''


def test_cli_checks_a_workload_variant_against_its_original(tmp_path):
    p = tmp_path / "twice.py"
    p.write_text(WORKLOAD)
    r = _cli("kernel", f"{p}:variants.right", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "check against twice.py's original(): PASS: 999 elements" in r.stdout
    assert "its output matches twice.py's original()" in r.stdout
    r = _cli("kernel", f"{p}:variants.wrong", "--device", "cpu", "--out", str(tmp_path / "w"))
    assert r.returncode == 1, r.stderr[-2000:]  # the report is printed and written; the status says it is wrong
    assert "verdict: WRONG: its output differs from twice.py's original(): FAIL out:" in r.stdout
    doc = json.loads((tmp_path / "w" / "kernel_report.json").read_text())
    assert doc["summary"]["check_passed"] is False and doc["report"]["rule"] == "wrong"
    r = _cli("kernel", f"{p}:original", "--device", "cpu")  # not one of the variants: nothing to check it against
    assert r.returncode == 0 and "check against" not in r.stdout and "no Triton or Numba CUDA launch" in r.stdout


STEP_WORKLOAD = '''
"""A workload whose original returns None and updates its first argument (a state step), with Triton variants."""
import torch
import triton
import triton.language as tl

TOLERANCE = dict(rtol=1e-6, atol=1e-9)


@triton.jit
def step_kernel(s, x, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(s + offs, tl.load(s + offs, mask=m) + factor * tl.load(x + offs, mask=m), mask=m)


def stepper(cover):
    def launcher(state, x):
        n = int(state.numel() * cover)
        step_kernel[(triton.cdiv(n, 64),)](state, x, n, 2.0, BLOCK=64)
    launcher.gpuspeed_inputs = "torch"
    return launcher


def original(state, x):
    state += 2.0 * x


def inputs(rng):
    return rng.standard_normal(999), rng.standard_normal(999)


variants = {"right": stepper(1.0), "half": stepper(0.5)}
'''


def test_cli_checks_what_an_in_place_variant_writes(tmp_path):
    """An original returning None that updates an argument: the variant's check compares what it writes in one
    call on fresh copies (the warm-up and the recorded call step the state too), so a right step passes and a
    step that covers half the state fails."""
    p = tmp_path / "step.py"
    p.write_text(STEP_WORKLOAD)
    r = _cli("kernel", f"{p}:variants.right", "--device", "cpu")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "check against step.py's original(): PASS: 999 elements" in r.stdout
    r = _cli("kernel", f"{p}:variants.half", "--device", "cpu")
    assert r.returncode == 1 and "verdict: WRONG" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_cli_runs_a_bundled_examples_variant_without_a_gpu():
    # the example's lazy variant refuses without CUDA (optimize must not time interpreted kernels): the command
    # runs the launcher it names instead, on float32 inputs for a float32 variant, and checks it
    r = _cli("kernel", "src/gpuspeed/examples/row_normalize_loop.py:variants.triton_fp32", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["check"]["passed"] and d["check"]["against"] == "row_normalize_loop.py's original()"
    assert d["check"]["rtol"] == 1e-5 and d["check"]["atol"] == 1e-6  # the example's TOLERANCE
    assert d["launches"][0]["kernel"] == "normalize_rows_f32_kernel"
    assert any("normalize_rows_triton_fp32 runs under the interpreters" in n for n in d["notes"])
    assert any("cast to float32" in n for n in d["notes"])


def test_cli_numba_variant_without_numba_is_one_line(numba_hidden_path):
    r = _cli("kernel", "src/gpuspeed/examples/histogram.py:variants.numba_cuda", "--device", "cpu",
             env={"PYTHONPATH": numba_hidden_path})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert "numba-cuda is not installed (pip install numba-cuda)" in r.stderr


@pytest.mark.parametrize("args,words", [
    (["tests/no_such_file.py:f"], "no such file"),
    (["tests/test_kernel_report.py"], "expected path/to/file.py:function"),
    (["tests/test_kernel_report.py:nope"], "has no 'nope'"),
    (["tests/test_kernel_report.py:add_launcher", "--input", "x=float32[abc]"], "bad input spec"),
    (["tests/test_kernel_report.py:add_launcher", "--input", "x=float32[8]"], "add_launcher needs y too"),
    (["tests/test_kernel_report.py:add_launcher", "--device", "tpu"], "unknown device"),
    (["tests/test_kernel_report.py:add_launcher", "--seed", "-1"], "--seed must be >= 0"),
    (["tests/test_kernel_report.py:add_launcher", "--input", "x=float32[0,100000000000000000000]"], "too large"),
    (["tests/test_kernel_report.py:add_kernel"], "is a @triton.jit kernel, not a launcher"),
])
def test_cli_bad_input_one_line_exit_2(args, words, monkeypatch, capsys):
    from gpuspeed.cli import main

    # in this process: keep the interpreter switches out of the environment the other tests share
    monkeypatch.setattr("gpuspeed.kernel.target.use_interpreters", lambda: None)
    rc = main(["kernel", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(lines) == 1 and words in lines[0], err


def test_cli_launcher_without_arguments_is_exit_2(tmp_path, monkeypatch, capsys):
    from gpuspeed.cli import main

    monkeypatch.setattr("gpuspeed.kernel.target.use_interpreters", lambda: None)
    p = tmp_path / "bare.py"
    p.write_text("def needs_args(x, n=3):\n    return x\n")
    assert main(["kernel", f"{p}:needs_args"]) == 2
    assert "gpuspeed: error: needs_args needs arguments (x)" in capsys.readouterr().err


def test_cli_bad_out_fails_before_any_work(tmp_path, monkeypatch, capsys):
    from gpuspeed.cli import main

    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder")
    monkeypatch.setattr("gpuspeed.kernel.target.use_interpreters", lambda: None)
    monkeypatch.setattr("gpuspeed.kernel.target.load_target", lambda *_: pytest.fail("work started before --out"))
    assert main(["kernel", "tests/test_kernel_report.py:add_launcher", "--out", str(taken)]) == 2
    assert "gpuspeed: error: --out" in capsys.readouterr().err


@in_process_interpreter
def test_an_in_place_launcher_writing_one_argument_is_checked_against_one_array():
    from gpuspeed import kernel_report

    def add_into_x(x, y):  # the result lands in x
        o, _ = add_launcher(x, y)
        x.copy_(o)

    rng = np.random.default_rng(7)
    x, y = (torch.from_numpy(rng.standard_normal(N).astype(np.float32)) for _ in range(2))
    want = x.double() + y.double()
    rep = kernel_report(add_into_x, x.clone(), y, device="cpu", expected=want, in_place=[0])
    assert rep.check["passed"], rep.check["summary"]
    assert not kernel_report(add_into_x, x.clone(), y, device="cpu", expected=want + 1, in_place=[0]).check["passed"]


NOISY = """
import sys

import torch
import triton
import triton.language as tl

print("hello at import")


@triton.jit
def clamp_kernel(x_ptr, out_ptr, n, lo, hi, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.minimum(tl.maximum(tl.load(x_ptr + offs, mask=mask), lo), hi), mask=mask)


def clamp(x):
    print("launching")
    out = torch.empty_like(x)
    clamp_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), 0.0, float("inf"), BLOCK=128)
    return out


def quits(x):
    sys.exit(3)


def clamp_into(x, *, out):
    clamp_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), 0.0, 1.0, BLOCK=128)
    return out
"""


def test_cli_json_is_strict_json_whatever_the_launcher_prints_or_passes(tmp_path):
    """The user's prints go to stderr; an infinite scalar argument is null (strict JSON); sys.exit in the launcher
    is a one-line error, not gpuspeed's own exit."""
    (tmp_path / "noisy.py").write_text(NOISY)
    r = _cli("kernel", f"{tmp_path}/noisy.py:clamp", "--input", "x=float32[300]", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert d["launches"][0]["kernel"] == "clamp_kernel" and "hello at import" in r.stderr and "launching" in r.stderr
    q = _cli("kernel", f"{tmp_path}/noisy.py:quits", "--input", "x=float32[8]", "--device", "cpu")
    assert q.returncode == 2 and "quits raised SystemExit: 3" in q.stderr, q.stderr[-2000:]


def test_cli_input_reaches_a_keyword_only_parameter(tmp_path):
    """--input out=... fills `def clamp_into(x, *, out)` by keyword; leaving it out names it in one line."""
    (tmp_path / "noisy.py").write_text(NOISY)
    r = _cli("kernel", f"{tmp_path}/noisy.py:clamp_into", "--input", "out=float32[300]", "--input", "x=float32[300]",
             "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["launches"][0]["kernel"] == "clamp_kernel" and d["launches"][0]["grid"] == [3, 1, 1]
    q = _cli("kernel", f"{tmp_path}/noisy.py:clamp_into", "--input", "x=float32[300]", "--device", "cpu")
    assert q.returncode == 2 and "keyword argument(s) out" in q.stderr and "Traceback" not in q.stderr, q.stderr
