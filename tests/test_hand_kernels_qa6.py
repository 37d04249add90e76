"""QA of the hand kernels' launchers (gpuspeed/examples/hand_kernels) on a user's odd inputs, against each example's
`original`: `out=` buffers the kernel would write wrongly or past the end (refused in one line), inputs the
original refuses or reads otherwise (a w of another length, points of another dimension, a fractional step
count), float32 and integer inputs, overflowing values, infinities, float32 histogram samples on the edges,
empty inputs on the Numba path, and the stencil's graph key.

As in test_example_kernels.py the interpreters (TRITON_INTERPRET=1, NUMBA_ENABLE_CUDASIM=1) must be on before
Triton and Numba define the kernels, so the checks run in one child process (this file run as a script) that
prints one JSON line per case.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None


# ---- the child process ------------------------------------------------------------------------------

def _refused(fn, *args, **kw) -> str | None:
    """The one-line ValueError/TypeError message fn raised, None where it ran."""
    try:
        fn(*args, **kw)
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        return msg if "\n" not in msg else "MULTI-LINE: " + msg
    return None


def _case_out_buffers() -> dict:
    """Each `out` the kernel would write wrongly (a transposed or strided buffer, another dtype) or past the end
    (another shape) is refused in one line naming `out`; a right one, poisoned, is fully written."""
    import torch

    from gpuspeed import poison
    from gpuspeed.examples import mandelbrot as MB
    from gpuspeed.examples import pairwise_distance as PD
    from gpuspeed.examples import row_normalize_loop as RN
    from gpuspeed.examples import row_stats as RS
    from gpuspeed.examples.hand_kernels import mandelbrot as mb
    from gpuspeed.examples.hand_kernels import pairwise_distance as pd
    from gpuspeed.examples.hand_kernels import row_normalize as rn
    from gpuspeed.examples.hand_kernels import row_stats as rs

    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 7))
    w = rng.uniform(0.5, 1.5, 7)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((6, 3))
    xs, ys = np.linspace(-2, 0.5, 6), np.linspace(-1, 1, 5)
    f64, i64 = torch.float64, torch.int64
    bad = {
        "row_normalize": (lambda o: rn.normalize_rows_triton(x, config=rn.CONFIGS[0], out=o),
                          [torch.empty(7, 9, dtype=f64).T, torch.empty(9, 14, dtype=f64)[:, ::2],
                           torch.empty(9, 7, dtype=torch.float32), torch.empty(9, 7, dtype=i64)]),
        "pairwise": (lambda o: pd.pairwise_triton(a, b, config=pd.CONFIGS[0], out=o),
                     [torch.empty(6, 5, dtype=f64).T, torch.empty(5, 12, dtype=f64)[:, :6],
                      torch.empty(5, 6, dtype=torch.float32)]),
        "mandelbrot": (lambda o: mb.mandelbrot_triton(xs, ys, 9, config=mb.CONFIGS[0], out=o),
                       [torch.empty(6, 5, dtype=i64).T, torch.empty(5, 6, dtype=torch.int32),
                        torch.empty(5, 6, dtype=f64)]),
        "row_stats": (lambda o: rs.row_stats_triton(x, w, config=rs.CONFIGS[0], out=o),
                      [tuple(torch.empty(18, dtype=f64)[::2] for _ in range(3)),
                       tuple(torch.empty(9, dtype=torch.float32) for _ in range(3)),
                       tuple(torch.empty(9, dtype=f64) for _ in range(2))]),
    }
    said = {name: [_refused(fn, o) for o in outs] for name, (fn, outs) in bad.items()}
    refused = all(m is not None and m.startswith("out") for ms in said.values() for m in ms)
    # wrong shapes too: refused before any launch (on the GPU a launch would write past the end)
    shapes = [_refused(lambda o: rn.normalize_rows_triton(x, config=rn.CONFIGS[0], out=o), torch.empty(8, 7, dtype=f64)),
              _refused(lambda o: pd.pairwise_triton(a, b, config=pd.CONFIGS[0], out=o), torch.empty(5, 7, dtype=f64)),
              _refused(lambda o: mb.mandelbrot_triton(xs, ys, 9, config=mb.CONFIGS[0], out=o),
                       torch.empty(4, 6, dtype=i64))]
    refused = refused and all(m is not None and m.startswith("out") and "shape" in m for m in shapes)
    # a right buffer, poisoned, is fully written (a column slice of a wider one too, for the row kernel)
    o1 = poison(torch.empty(9, 14, dtype=f64))[:, :7]
    o2 = poison(torch.empty(5, 6, dtype=f64))
    o3 = poison(torch.empty(5, 6, dtype=i64))
    o4 = tuple(poison(torch.empty(9, dtype=f64)) for _ in range(3))
    ok = (np.allclose(rn.normalize_rows_triton(x, config=rn.CONFIGS[0], out=o1).numpy(), RN.original(x), atol=1e-9)
          and np.allclose(pd.pairwise_triton(a, b, config=pd.CONFIGS[0], out=o2).numpy(), PD.original(a, b))
          and np.array_equal(mb.mandelbrot_triton(xs, ys, 9, config=mb.CONFIGS[0], out=o3).numpy(),
                             MB.original(xs, ys, 9))
          and all(np.allclose(g.numpy(), r) for g, r in zip(rs.row_stats_triton(x, w, config=rs.CONFIGS[0], out=o4),
                                                            RS.original(x, w), strict=True)))
    return {"id": "out-buffers", "passed": bool(refused and ok), "summary": f"{said} {shapes} written {ok}"}


def _case_row_stats() -> dict:
    """row_stats: a w that is not one weight per column is refused (the kernels would read past its end); rows whose
    centred squares overflow give std inf as the original does (not NaN from inf * 0 in the Triton kernel's padding
    columns); integer x and w are summed in float64, not in integer/float32 Triton arithmetic; float32 x and w give
    float32 statistics, as the original does."""
    from gpuspeed.examples import row_stats as RS
    from gpuspeed.examples.hand_kernels import row_stats as rs

    rng = np.random.default_rng(1)
    cfg = rs.CONFIGS[0]
    x = rng.standard_normal((4, 30))
    w = rng.uniform(0.5, 1.5, 30)
    said = [_refused(rs.row_stats_triton, x, w[:29], config=cfg), _refused(rs.row_stats_triton, x, np.tile(w, (4, 1)),
                                                                            config=cfg)]
    refused = all(m is not None and m.startswith("w must") for m in said)

    def same(xx, ww, exact_dtype=True):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = RS.original(xx, ww)
        got = [t.numpy() for t in rs.row_stats_triton(xx, ww, config=cfg)]
        return all((g.dtype == r.dtype or not exact_dtype) and np.allclose(g, r, rtol=1e-5, atol=1e-7, equal_nan=True)
                   for g, r in zip(got, ref, strict=True))

    huge = same(x * 1e200, w) and same(rng.standard_normal((2, 2500)) * 1e200, rng.uniform(0.5, 1.5, 2500))
    ints = same(rng.integers(-5_000_000, 5_000_000, (4, 40)) + 10**9, rng.integers(1, 3, 40))
    f32 = same(x.astype(np.float32), w.astype(np.float32))
    return {"id": "row-stats", "passed": bool(refused and huge and ints and f32),
            "summary": f"refused {said}; overflow {huge}; ints {ints}; float32 {f32}"}


def _case_row_stats_numba_inf() -> dict:
    """The Numba kernel's shift (the mean of a row's first 32 values) is infinite where one of them is: the row's
    mean came out NaN where the original's is inf."""
    from gpuspeed.examples import row_stats as RS
    from gpuspeed.examples.hand_kernels import row_stats as rs

    if not HAS_NUMBA_CUDA:
        return {"id": "row-stats-numba-inf", "skipped": "numba-cuda is not installed"}
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 40))
    x[0, 3], x[1, 0] = np.inf, -np.inf
    w = rng.uniform(0.5, 1.5, 40)
    with np.errstate(all="ignore"):
        ref = RS.original(x, w)
    got = [t.numpy() for t in rs.row_stats_numba(x, w)]
    ok = all(np.array_equal(g, r, equal_nan=True) for g, r in zip(got[:2], ref[:2], strict=True))
    return {"id": "row-stats-numba-inf", "passed": bool(ok), "summary": f"got {got[:2]} want {ref[:2]}"}


def _case_pairwise_and_normalize() -> dict:
    """pairwise: points of another dimension are refused (the kernel read b at a's stride, past its end); float32
    points give float32 distances. row_normalize: float32 rows give float32 rows (np.empty_like(x))."""
    from gpuspeed.examples import pairwise_distance as PD
    from gpuspeed.examples import row_normalize_loop as RN
    from gpuspeed.examples.hand_kernels import pairwise_distance as pd
    from gpuspeed.examples.hand_kernels import row_normalize as rn

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((4, 2))
    said = _refused(pd.pairwise_triton, a, b, config=pd.CONFIGS[0])
    a32, b32 = a.astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    got = pd.pairwise_triton(a32, b32, config=pd.CONFIGS[0]).numpy()
    pair = got.dtype == np.float32 and np.allclose(got, PD.original(a32, b32), rtol=1e-6)
    x32 = rng.standard_normal((3, 2100)).astype(np.float32)  # the chunked path
    got = rn.normalize_rows_triton(x32, config=rn.CONFIGS[0]).numpy()
    norm = got.dtype == np.float32 and np.allclose(got, RN.original(x32), rtol=1e-5, atol=1e-5)
    ok = said is not None and said.startswith("a and b") and pair and norm
    return {"id": "pairwise-normalize", "passed": bool(ok), "summary": f"refused {said!r}; f32 {pair} {norm}"}


def _histogram_edge_samples(dtype) -> np.ndarray:
    edges = np.linspace(-3.3, 2.9, 18).astype(dtype)
    x = np.concatenate([edges, np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf),
                        np.array([np.nan, np.inf, -5.0, 3.0], dtype=dtype)])
    return x.astype(dtype)


def _case_histogram() -> dict:
    """np.histogram bins float32 samples against float32 edges and range: float32 samples on and beside those edges
    must land where NumPy puts them (the launchers binned them against float64 edges); so must float64 samples
    under a float32 range (linspace in float32). bins < 1 and a range too narrow for the index estimate are
    refused in one line."""
    from gpuspeed.examples import histogram as HG
    from gpuspeed.examples.hand_kernels import histogram as hg

    runs = []
    fns = [lambda *a: hg.histogram_triton(*a, config=hg.CONFIGS[0])]
    if HAS_NUMBA_CUDA:
        fns.append(hg.histogram_numba)
    for fn in fns:
        for x, lo, hi in ((_histogram_edge_samples(np.float32), -3.3, 2.9),
                          (_histogram_edge_samples(np.float64), np.float32(-3.3), np.float32(2.9))):
            runs.append(bool(np.array_equal(fn(x, 17, lo, hi).numpy(), HG.original(x, 17, lo, hi))))
    said = [_refused(hg.histogram_triton, np.zeros(3), 0, 0.0, 1.0),
            _refused(hg.histogram_triton, np.zeros(3), 3, 1e-310, 3e-310)]
    ok = all(runs) and all(m is not None for m in said)
    return {"id": "histogram", "passed": bool(ok), "summary": f"runs {runs}; refused {said}"}


def _case_mandelbrot_and_heat_args() -> dict:
    """mandelbrot: a fractional max_iter steps as the original's `while n < max_iter` does (to its ceiling), and
    Python lists (which the original takes) work; heat: a fractional step count is refused (the original's range()
    refuses it), not truncated."""
    from gpuspeed.examples import mandelbrot as MB
    from gpuspeed.examples.hand_kernels import heat_stencil as hs
    from gpuspeed.examples.hand_kernels import mandelbrot as mb

    xs, ys = list(np.linspace(-2.1, 0.6, 9)), list(np.linspace(-1.2, 1.2, 5))
    mand = bool(np.array_equal(mb.mandelbrot_triton(xs, ys, 7.5, config=mb.CONFIGS[0]).numpy(),
                               MB.original(xs, ys, 7.5)))
    said = _refused(hs.heat_triton, np.ones((4, 4)), 0.2, 2.5, config=hs.CONFIGS[0])
    return {"id": "mandelbrot-heat-args", "passed": mand and said is not None, "summary": f"{mand} {said!r}"}


def _case_heat_graph_key() -> dict:
    """The stencil's CUDA graph reads the alpha tensor it was captured with, so a graph kept for one alpha must not
    be replayed for another: alpha is part of the graph's key (the graph path, with _graphed recorded here)."""
    import torch

    from gpuspeed.examples.hand_kernels import heat_stencil as hs

    keys = []
    saved = hs._eager, hs._graphed
    hs._eager = lambda u: False
    hs._graphed = lambda key, steps_fn, u, steps: keys.append(key) or steps_fn(u, steps)
    try:
        grid = torch.rand(6, 7, dtype=torch.float64)
        for alpha in (0.2, 0.1):
            hs.heat_triton(grid, alpha, 4, config=hs.CONFIGS[0])
    finally:
        hs._eager, hs._graphed = saved
    ok = len(keys) == 2 and keys[0] != keys[1]
    return {"id": "heat-graph-key", "passed": ok, "summary": f"keys {keys}"}


def _case_numba_empty() -> dict:
    """An empty input launches no Numba kernel (a grid with no blocks is an invalid launch on the GPU): the
    launchers return the original's empty result without reaching their kernels."""
    from gpuspeed.examples.hand_kernels import heat_stencil as hs
    from gpuspeed.examples.hand_kernels import mandelbrot as mb
    from gpuspeed.examples.hand_kernels import pairwise_distance as pd

    if not HAS_NUMBA_CUDA:
        return {"id": "numba-empty", "skipped": "numba-cuda is not installed"}

    def boom(*_a, **_k):
        raise AssertionError("a Numba kernel was launched on an empty input")

    saved = pd.numba_kernel, mb._numba_kernel, hs._numba_kernel
    pd.numba_kernel = mb._numba_kernel = hs._numba_kernel = boom
    try:
        shapes = [tuple(pd.pairwise_numba(np.zeros((0, 3)), np.ones((4, 3))).shape),
                  tuple(mb.mandelbrot_numba(np.array([]), np.linspace(0, 1, 3), 5).shape),
                  tuple(hs.heat_numba(np.zeros((0, 5)), 0.2, 3).shape)]
        ok = shapes == [(0, 4), (3, 0), (0, 5)]
        summary = f"shapes {shapes}"
    except AssertionError as exc:
        ok, summary = False, str(exc)
    finally:
        pd.numba_kernel, mb._numba_kernel, hs._numba_kernel = saved
    return {"id": "numba-empty", "passed": ok, "summary": summary}


# out-buffers last: without its fix an out-of-bounds write can kill the child, which would hide the other cases
CASES = {"row-stats": _case_row_stats, "row-stats-numba-inf": _case_row_stats_numba_inf,
         "pairwise-normalize": _case_pairwise_and_normalize, "histogram": _case_histogram,
         "mandelbrot-heat-args": _case_mandelbrot_and_heat_args, "heat-graph-key": _case_heat_graph_key,
         "numba-empty": _case_numba_empty, "out-buffers": _case_out_buffers}


def child_main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    for cid, fn in CASES.items():
        try:
            line = fn()
        except Exception as exc:  # noqa: BLE001 - reported to the parent as this case's failure
            import traceback

            line = {"id": cid, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        print(json.dumps(line, default=str), flush=True)
    return 0


# ---- the tests --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def child_results(interpreter_child):
    return interpreter_child(__file__, timeout=300)


@pytest.mark.parametrize("case", list(CASES))
def test_launcher_on_odd_inputs_matches_the_original_or_refuses(child_results, case):
    d = child_results.get(case)
    assert d is not None, f"{case}: no result from the child (it died before this case?)"
    if "skipped" in d:
        pytest.skip(d["skipped"])
    assert "error" not in d, d.get("traceback", d.get("error"))
    assert d["passed"], d["summary"]


@pytest.mark.gpu
def test_heat_graph_replays_with_each_calls_alpha():
    """On the GPU the middle steps replay from a graph: a second call with another alpha must step with it."""
    import torch

    from gpuspeed.examples import heat_stencil as HS
    from gpuspeed.examples.hand_kernels import heat_stencil as hs

    grid = np.random.default_rng(4).random((64, 80))
    for fn in (hs.heat_triton, hs.heat_numba) if HAS_NUMBA_CUDA else (hs.heat_triton,):
        for alpha in (0.2, 0.05, 0.2):
            got = fn(torch.from_numpy(grid).cuda(), alpha, 6).cpu().numpy()
            assert np.allclose(got, HS.original(grid, alpha, 6), rtol=1e-12, atol=1e-12), (fn.__name__, alpha)


@pytest.mark.gpu
def test_numba_launchers_return_empty_results_on_the_gpu():
    pytest.importorskip("numba_cuda")
    import torch

    from gpuspeed.examples.hand_kernels import heat_stencil as hs
    from gpuspeed.examples.hand_kernels import mandelbrot as mb
    from gpuspeed.examples.hand_kernels import pairwise_distance as pd

    assert tuple(pd.pairwise_numba(torch.zeros(0, 3, device="cuda"), torch.ones(4, 3, device="cuda")).shape) == (0, 4)
    assert tuple(mb.mandelbrot_numba(torch.zeros(0, device="cuda"), torch.ones(3, device="cuda"), 5).shape) == (3, 0)
    assert tuple(hs.heat_numba(torch.zeros(0, 5, device="cuda"), 0.2, 3).shape) == (0, 5)


if __name__ == "__main__":
    sys.exit(child_main())
