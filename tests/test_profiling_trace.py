"""The trace reader on a small hand-built Chrome trace of known shape (the real GPU checks live in
test_profiling_gpu.py): 10 tiny kernels launched from one line, then one pageable H2D copy."""

from gpuspeed.profiling.sites import Sites
from gpuspeed.profiling.trace import TraceAnalysis


def _trace():
    ev = [{"ph": "X", "cat": "user_annotation", "name": "gpuspeed.step0", "ts": 0, "dur": 200, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "python_function", "name": "u.py(3): f", "ts": 1, "dur": 198, "pid": 1, "tid": 1}]
    for k in range(10):  # each launch takes 10 us of host time; each kernel runs 2 us
        t = 2 + 10 * k
        ev += [{"ph": "X", "cat": "python_function", "name": "<built-in method mul_ of Tensor object at 0x1>",
                "ts": t, "dur": 9, "pid": 1, "tid": 1},
               {"ph": "X", "cat": "cpu_op", "name": "aten::mul_", "ts": t + 1, "dur": 7, "pid": 1, "tid": 1},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 2, "dur": 5, "pid": 1,
                "tid": 1, "args": {"correlation": k}},
               {"ph": "X", "cat": "kernel", "name": "mul_kernel", "ts": t + 9, "dur": 2, "pid": 0, "tid": 7,
                "args": {"correlation": k, "stream": 7}}]
    ev += [{"ph": "X", "cat": "python_function", "name": "<built-in method to of Tensor object at 0x2>",
            "ts": 150, "dur": 40, "pid": 1, "tid": 1},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 151, "dur": 38, "pid": 1, "tid": 1,
            "args": {"correlation": 99}},
           {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 160, "dur": 25,
            "pid": 0, "tid": 7, "args": {"correlation": 99, "stream": 7, "bytes": 1_000_000}}]
    return {"traceEvents": ev}


def _sites():
    s = Sites()
    s.user_funcs["u.py(3): f"] = ("/x/u.py", 3, "f")
    s.calls[("u.py(3): f", "<built-in method mul_ of Tensor object>")][5] = 10
    s.calls[("u.py(3): f", "<built-in method to of Tensor object>")][7] = 1
    return s


def test_tiny_runs_gaps_transfers_idle():
    f = TraceAnalysis(_trace(), _sites(), steps=1).findings()
    (run,) = f["tiny_runs"]["runs"]
    assert (run["length"], run["runs_per_step"], run["file"], run["line"]) == (10, 1.0, "/x/u.py", 5)
    gaps = f["launch_gaps"]
    assert gaps["count"] == 10 and abs(gaps["p50_us"] - 8) < 1e-6  # 9 gaps of 8 us, then 139 us to the copy
    (t,) = f["transfers"]["rows"]
    assert (t["direction"], t["memory"], t["line"], t["bytes"]) == ("H2D", "pageable", 7, 1_000_000)
    assert abs(t["GBps"] - 40.0) < 1e-9
    bi = f["busy_idle"]
    assert abs(bi["window_s"] - 200e-6) < 1e-12 and abs(bi["busy_s"] - 45e-6) < 1e-12
    # idle before each kernel: issued at launch start (t+2), GPU idle since the last end; host-late part counted
    assert 0 < bi["idle_host_s"] < bi["idle_s"]
    assert f["host_syncs"]["total"] == 0
