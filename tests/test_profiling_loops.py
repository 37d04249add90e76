"""Loop-nest verdicts: independent maps, reductions and recurrences told apart from the source alone,
and the sequential ones never advised as "one GPU thread per iteration"."""

import time

import numpy as np
import pytest

from gpuspeed.profiling import hotspots
from gpuspeed.profiling.loops import loop_nests

SHAPES = {
    "map": ("def f(a, out, n):\n    for i in range(n):\n        out[i] = a[i] * 2 + 1\n", "parallel-map"),
    "map_2d": ("def f(a, n):\n    for i in range(n):\n        for j in range(n):\n            a[i, j] += 1\n",
               "parallel-map"),
    "sum": ("def f(a, n):\n    s = 0.0\n    for i in range(n):\n        s += a[i] * a[i]\n    return s\n",
            "reduction"),
    "sum_assign": ("def f(a, n):\n    s = 0.0\n    for i in range(n):\n        s = s + a[i]\n    return s\n",
                   "reduction"),
    "max": ("def f(a, n):\n    m = a[0]\n    for i in range(n):\n        m = max(m, a[i])\n    return m\n",
            "reduction"),
    "histogram": ("def f(b, h, n):\n    for i in range(n):\n        h[b[i]] += 1\n", "reduction"),
    "recurrence": ("def f(a, n):\n    x = 1.0\n    for i in range(n):\n        x = x * 0.5 + 1\n        a[i] = x\n",
                   "sequential-loop"),
    "prefix": ("def f(a, n):\n    for i in range(1, n):\n        a[i] = a[i - 1] + a[i]\n", "sequential-loop"),
    "compaction": ("def f(a, out, n):\n    k = 0\n    for i in range(n):\n        if a[i] > 0:\n"
                   "            out[k] = a[i]\n            k += 1\n    return k\n", "sequential-loop"),
    "newton": ("def f(a, x):\n    err = 1.0\n    while err > 1e-9:\n        x = 0.5 * (x + a / x)\n"
               "        err = abs(x * x - a)\n    return x\n", "sequential-loop"),
    "rows_scan": ("def f(a, n):\n    for i in range(n):\n        for j in range(1, n):\n"
                  "            a[i, j] = a[i, j - 1] * 0.5 + a[i, j]\n", "parallel-map"),
    "private_inner_recurrence": ("def f(a, out, n):\n    for i in range(n):\n        x = 0.0\n"
                                 "        for j in range(n):\n            x = x * 0.5 + a[i, j]\n        out[i] = x\n",
                                 "parallel-map"),
    "while_counter": ("def f(a, b, n):\n    i = 0\n    while i < n:\n        a[i] = b[i] * 2\n        i += 1\n",
                      "parallel-map"),
    "array_calls": ("def f(xs, w):\n    out = []\n    for x in xs:\n        out.append(np.tanh(x @ w))\n"
                    "    return out\n", "vectorize"),
    "rnn": ("def f(x, w, n):\n    for i in range(n):\n        x = np.tanh(x @ w)\n    return x\n", "sequential-loop"),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_loop_kind(name):
    src, kind = SHAPES[name]
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == kind, (name, loop["dependences"])
    if kind == "sequential-loop":
        assert loop["verdict"].startswith("sequential") and "one thread per" not in loop["verdict"]
        assert loop["dependences"]["recurrences"]


def test_recurrence_named_at_its_line():
    src, _ = SHAPES["recurrence"]
    (loop,) = loop_nests(src, 10, {}, 0.0)
    (rec,) = loop["dependences"]["recurrences"]
    assert (rec["name"], rec["line"], rec["code"]) == ("x", 13, "x = x * 0.5 + 1")
    (red,) = loop_nests(SHAPES["sum"][0], 1, {}, 0.0)[0]["dependences"]["reductions"]
    assert (red["name"], red["op"], red["line"]) == ("s", "+", 4)


def test_time_stepped_stencil_points_at_the_parallel_inner_loop():
    src = ("def f(u, new, n, steps):\n    for t in range(steps):\n        for i in range(1, n - 1):\n"
           "            new[i] = (u[i - 1] + u[i + 1]) / 2\n        u, new = new, u\n    return u\n")
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == "sequential-loop" and loop["inner"] == [{"line": 3, "kind": "parallel-map"}]
    assert "inner loop at line 3" in loop["verdict"]


def _recurrence(a, n):
    x = 1.0
    for i in range(n):
        x = x * 0.5 + 1
        a[i % 8] = x
    return x


def test_hot_loop_of_a_profiled_recurrence_is_sequential():
    res = hotspots.analyze(_recurrence, (np.zeros(8), 20000), {}, line_backend="settrace")
    (loop,) = [lp for lp in res["hot_loops"] if lp["function"] == "_recurrence"]
    assert loop["kind"] == "sequential-loop" and loop["dependences"]["recurrences"][0]["name"] == "x"


def _sleeper():
    time.sleep(0.02)  # waiting by choice: charged to this line in full
    return 1


def test_settrace_timer_keeps_voluntary_waits():
    codes = [_sleeper.__code__]
    acc = hotspots._line_times_settrace(codes, _sleeper, (), {})
    line = _sleeper.__code__.co_firstlineno + 1
    assert acc[(_sleeper.__code__.co_filename, line)][1] >= 0.019


def test_slice_stencil_steps_are_sequential_with_array_work_inside():
    src = ("def f(u, alpha, steps):\n    for _ in range(steps):\n"
           "        lap = u[:-2, 1:-1] + u[2:, 1:-1] - 2.0 * u[1:-1, 1:-1]\n"
           "        u[1:-1, 1:-1] = u[1:-1, 1:-1] + alpha * lap\n    return u\n")
    (loop,) = loop_nests(src, 1, {}, 0.0)
    assert loop["kind"] == "sequential-loop" and "CUDA graph" in loop["verdict"]


def test_a_slow_moment_at_calibration_does_not_wipe_out_a_later_runs_hot_loop(monkeypatch):
    """The settrace timer subtracts its own cost per hit (~300 ns, where the loop's line does tens of ns). A
    calibration taken in a slower moment (here a clock running 3x during a first run) must not be reused by a
    later run: it would subtract more than that run paid and leave the hot loop with no time at all."""
    real = time.perf_counter
    with monkeypatch.context() as m:
        m.setattr(time, "perf_counter", lambda: 3 * real())
        hotspots.analyze(_recurrence, (np.zeros(8), 2000), {}, line_backend="settrace")
    res = hotspots.analyze(_recurrence, (np.zeros(8), 20000), {}, line_backend="settrace")
    assert [lp["function"] for lp in res["hot_loops"]] == ["_recurrence"], res["hot_loops"]


def test_a_loops_share_counts_its_header_line():
    # the `for` line (next() on a zip, the loop's own overhead) was left out: a loop whose lines were all of the
    # function's time was reported at 74 %
    from gpuspeed.profiling.loops import loop_nests

    src = "def f(g, v, out):\n    for a, b in zip(g, v):\n        out[a] += b\n    return out\n"
    nests = loop_nests(src, 1, {2: 0.26, 3: 0.74}, 1.0)
    assert len(nests) == 1 and nests[0]["time_s"] == pytest.approx(1.0)
    assert nests[0]["share_of_function"] == pytest.approx(1.0)
