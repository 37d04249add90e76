"""The bundled examples' hand kernels on the GPU, at the examples' default `inputs(rng)` shapes: every variant
(autotuned) and every Triton config, against the example's float64 `original` through gpuspeed.check on
three fresh seeds, outputs poisoned first; Numba kernels launched on torch's current stream."""

from __future__ import annotations

import functools
import importlib
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from gpuspeed import check, poison  # noqa: E402

EXAMPLES = ["row_normalize_loop", "pairwise_distance", "heat_stencil", "histogram", "mandelbrot", "row_stats"]
SEEDS = (11, 22, 33)
VARIANTS = [(ex, v) for ex in EXAMPLES for v in importlib.import_module(f"gpuspeed.examples.{ex}").variants]


@functools.lru_cache(maxsize=None)
def _case(example: str, seed: int):
    """(host args, the original's output): the original is slow, so each seed's is computed once."""
    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    args = ex.inputs(np.random.default_rng(seed))
    ref = ex.original(*[np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args])
    return args, ref


def _device(args):
    return tuple(torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a for a in args)


def _host(out):
    if isinstance(out, tuple):
        return tuple(o.cpu().numpy() for o in out)
    return out.cpu().numpy()


def _launcher(example: str, variant: str):
    fn = importlib.import_module(f"gpuspeed.examples.{example}").variants[variant]
    module, name = fn.target
    return importlib.import_module(module), getattr(importlib.import_module(module), name)


def _fp32(example: str, variant: str) -> bool:
    """A variant declared precision = "float32": given float32 inputs (as optimize casts them), float32 out."""
    return getattr(importlib.import_module(f"gpuspeed.examples.{example}").variants[variant], "precision", None) == "float32"


def _demote(dev):
    return tuple(d.float() if torch.is_tensor(d) and d.dtype == torch.float64 else d for d in dev)


def _host64(out):
    """Host arrays cast back to float64, as the optimize worker's fetch does for a float32 candidate."""
    host = _host(out)
    return tuple(h.astype(np.float64) for h in host) if isinstance(host, tuple) else host.astype(np.float64)


def _poisoned_out(example: str, dev_args):
    if example == "row_normalize_loop":
        return poison(torch.empty_like(dev_args[0]))  # the inputs' dtype: float32 for the float32 variant
    if example == "row_stats":
        return tuple(poison(torch.empty(dev_args[0].shape[0], dtype=torch.float64, device="cuda")) for _ in range(3))
    if example == "pairwise_distance":
        return poison(torch.empty((dev_args[0].shape[0], dev_args[1].shape[0]), dtype=torch.float64, device="cuda"))
    if example == "mandelbrot":
        return poison(torch.empty((len(dev_args[1]), len(dev_args[0])), dtype=torch.int64, device="cuda"))
    return None


@pytest.mark.parametrize("example,variant", VARIANTS, ids=[f"{e}-{v}" for e, v in VARIANTS])
def test_variant_matches_the_original_at_default_shapes(example, variant):
    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    tol = getattr(ex, "TOLERANCE", {})
    _, launcher = _launcher(example, variant)
    fp32 = _fp32(example, variant)
    for seed in SEEDS:
        args, ref = _case(example, seed)
        dev = _demote(_device(args)) if fp32 else _device(args)
        before = [d.clone() if torch.is_tensor(d) else d for d in dev]
        out = _poisoned_out(example, dev)
        got = launcher(*dev, **({"out": out} if out is not None else {}))
        if fp32:
            assert all(g.dtype == torch.float32 for g in (got if isinstance(got, tuple) else (got,)))
        res = check(_host64(got) if fp32 else _host(got), ref, **tol)
        assert res.passed, (seed, res.summary)
        assert all(torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(dev, before, strict=True))
    # and through the variants dict from host arrays, as a user would call it (a float32 variant casts them itself)
    args, ref = _case(example, SEEDS[0])
    assert check((_host64 if fp32 else _host)(ex.variants[variant](*args)), ref, **tol).passed


TRITON = [(e, v) for e, v in VARIANTS if v.startswith("triton")]


@pytest.mark.parametrize("example,variant", TRITON, ids=[f"{e}-{v}" for e, v in TRITON])
def test_every_triton_config_is_correct_on_the_gpu(example, variant):
    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    module, launcher = _launcher(example, variant)
    fp32 = _fp32(example, variant)
    args, ref = _case(example, SEEDS[0])
    dev = _demote(_device(args)) if fp32 else _device(args)
    for cfg in getattr(module, "CONFIGS_F32" if fp32 else "CONFIGS"):
        out = _poisoned_out(example, dev)
        got = launcher(*dev, config=cfg, **({"out": out} if out is not None else {}))
        res = check(_host64(got) if fp32 else _host(got), ref, **getattr(ex, "TOLERANCE", {}))
        assert res.passed, (str(cfg), res.summary)


@pytest.mark.parametrize("example", [e for e, v in VARIANTS if v == "numba_cuda"])
def test_numba_kernels_run_on_torchs_current_stream(example):
    pytest.importorskip("numba_cuda")
    _, launcher = _launcher(example, "numba_cuda")
    args, ref = _case(example, SEEDS[1])
    dev = _device(args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # the inputs are poisoned, then written only after a long sleep on this stream: a kernel launched on
        # any other stream would run during the sleep and read the poison
        src = tuple(poison(torch.empty_like(d)) if torch.is_tensor(d) else d for d in dev)
        torch.cuda._sleep(100_000_000)
        for s, d in zip(src, dev, strict=True):
            if torch.is_tensor(s):
                s.copy_(d)
        host = _host(launcher(*src))  # the copy back is ordered on this stream too
    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    assert check(host, ref, **getattr(ex, "TOLERANCE", {})).passed


def test_heat_step_kernel_every_config_on_an_odd_grid():
    # one launch of each config, PDL on and off, on a grid past the tiles in both directions; then 3 steps
    from gpuspeed.examples import heat_stencil as ex
    from gpuspeed.examples.hand_kernels import heat_stencil as hs, launch

    grid, alpha, _ = ex.inputs(np.random.default_rng(SEEDS[0]), scale=0.3)  # 1121 x 1121: odd, past the tiles
    ref = ex.original(grid, alpha, 1)
    src = torch.from_numpy(grid).cuda()
    coeff = torch.tensor([alpha], dtype=torch.float64, device="cuda")
    n_rows, n_cols = src.shape
    for pdl in sorted({False, hs._pdl(0)}):
        for cfg in hs.CONFIGS:
            dst = poison(torch.empty_like(src))
            launch(hs.heat_step_kernel, lambda meta: (triton_cdiv(n_rows, meta["BLOCK_M"]), triton_cdiv(n_cols, meta["BLOCK_N"])),
                   src, dst, coeff, n_rows, n_cols, config=cfg, PDL=pdl, **({"launch_pdl": True} if pdl else {}))
            res = check(dst.cpu().numpy(), ref, **ex.TOLERANCE)
            assert res.passed, (str(cfg), pdl, res.summary)
        src32, coeff32 = src.float(), coeff.float()
        for cfg in hs.CONFIGS_F32:  # strips of 4 rows: 1121 rows end in a strip of one
            dst = poison(torch.empty_like(src32))
            launch(hs.heat_step_f32_kernel, lambda meta: (triton_cdiv(n_rows, meta["BLOCK_M"]),
                                                          triton_cdiv(n_cols, meta["BLOCK_N"])),
                   src32, dst, coeff32, n_rows, n_cols, config=cfg, PDL=pdl, **({"launch_pdl": True} if pdl else {}))
            res = check(dst.double().cpu().numpy(), ref, **ex.TOLERANCE)
            assert res.passed, (str(cfg), pdl, res.summary)
    assert check(_host(hs.heat_triton(src, alpha, 3)), ex.original(grid, alpha, 3), **ex.TOLERANCE).passed
    assert check(_host64(hs.heat_triton_fp32(src.float(), alpha, 3)), ex.original(grid, alpha, 3), **ex.TOLERANCE).passed
    assert check(_host(hs.heat_numba(src, alpha, 3)), ex.original(grid, alpha, 3), **ex.TOLERANCE).passed


def triton_cdiv(a, b):
    return -(-a // b)


def _edge_samples(bins, lo, hi, seed):
    """Normal samples with, in front, values on every edge (hi too), an ulp either side of each, NaN, infinities
    and values just outside the range: where an index estimate is off by one bin or a value is dropped."""
    x = np.random.default_rng(seed).standard_normal(100_003) * 1.5
    edges = np.linspace(lo, hi, bins + 1) if lo < hi else np.linspace(lo - 0.5, hi + 0.5, bins + 1)
    k = len(edges)
    x[:k] = edges
    x[k:2 * k] = np.nextafter(edges, np.inf)
    x[2 * k:3 * k] = np.nextafter(edges, -np.inf)
    x[3 * k:3 * k + 5] = [np.nan, edges[0] - 1e-9, edges[-1] + 1e-9, np.inf, -np.inf]
    return x


@pytest.mark.parametrize("bins,lo,hi", [(256, -4.0, 4.0), (37, -2.5, 3.1), (7, 1.0, 1.0), (1000, -3.3, 2.9)])
@pytest.mark.parametrize("variant", ["triton", "numba_cuda"])
def test_histogram_bins_values_on_and_beside_every_edge_as_numpy(variant, bins, lo, hi, monkeypatch):
    # on the GPU: an earlier Triton kernel was exact on these under the interpreter and one bin off on the H200
    if variant == "numba_cuda":
        pytest.importorskip("numba_cuda")
    from gpuspeed.examples.hand_kernels import histogram as H

    x = _edge_samples(bins, lo, hi, SEEDS[0])
    ref = np.histogram(x, bins=bins, range=(lo, hi))[0]
    dev = torch.from_numpy(x).cuda()
    if variant == "triton":
        for cfg in [None, *H.CONFIGS]:
            got = H.histogram_triton(dev, bins, lo, hi, config=cfg).cpu().numpy()
            assert np.array_equal(got, ref), (str(cfg), np.nonzero(got != ref)[0][:8])
        # the gathered-edges path (taken where i * step + lo would not give np.linspace's edges)
        real = H._edges_host
        monkeypatch.setattr(H, "_edges_host", lambda *a: real(*a)[:4] + (False,))
        monkeypatch.setattr(H, "_EDGES", {})
        got = H.histogram_triton(dev, bins, lo, hi).cpu().numpy()
        assert np.array_equal(got, ref), ("gathered edges", np.nonzero(got != ref)[0][:8])
    else:
        got = H.histogram_numba(dev, bins, lo, hi).cpu().numpy()
        assert np.array_equal(got, ref), np.nonzero(got != ref)[0][:8]


@pytest.mark.parametrize("example", sorted({e for e, v in VARIANTS if _fp32(e, v)}))
def test_float32_variant_through_the_optimize_variant_backend(example):
    # as the optimize worker builds it: float64 host inputs cast to float32 and moved once, the output fetched back
    # in the original's float64 and checked under the example's TOLERANCE
    from gpuspeed.optimize.backends import variant as vb
    from gpuspeed.optimize.workload import out_dtypes

    ex = importlib.import_module(f"gpuspeed.examples.{example}")
    args, ref = _case(example, SEEDS[1])
    impl = vb.build(ex, precision="float32", out_dtypes=out_dtypes(ref), variant="triton_fp32", device="cuda")
    dev = impl.prepare(args)
    assert all(d.dtype == torch.float32 and d.is_cuda for d in dev if torch.is_tensor(d))
    out = impl.fetch(impl.run(*dev))
    assert out.dtype == np.float64
    assert check(out, ref, **ex.TOLERANCE).passed


def test_heat_graph_replays_each_call_on_its_own_input():
    # the stencil launchers replay a CUDA graph: a second grid must be copied in (not the first one's result
    # returned again), each call must return its own tensor, and the caller's grid must stay unwritten
    from gpuspeed.examples.hand_kernels import heat_stencil as H

    ex = importlib.import_module("gpuspeed.examples.heat_stencil")
    tol = getattr(ex, "TOLERANCE", {})
    launchers = [(H.heat_triton, False), (H.heat_triton_fp32, True)]
    if importlib.util.find_spec("numba_cuda") is not None:
        launchers.append((H.heat_numba, False))
    for launcher, fp32 in launchers:
        results = []
        for seed in SEEDS:
            args, ref = _case("heat_stencil", seed)
            dev = _demote(_device(args)) if fp32 else _device(args)
            before = dev[0].clone()
            results.append((launcher(*dev), ref))
            assert torch.equal(dev[0], before)
        assert len({r.data_ptr() for r, _ in results}) == len(SEEDS)
        for got, ref in results:  # checked after all calls: a later replay must not overwrite an earlier result
            assert check(_host64(got) if fp32 else _host(got), ref, **tol).passed
    ran = {key[0] for key in H._GRAPHS}  # the graph path ran, not the eager one
    assert "heat_step_f32_kernel" in ran and (len(launchers) == 2 or "heat_step_numba_kernel" in ran), ran
    # other step counts are graphs of their own (under 3: no graph; 3: a graph of one step between the eager first
    # and last), each called twice: the second call's first step writes into the graph's own input buffer
    for steps in (1, 2, 3, 4, 5):
        for launcher, _ in launchers:
            got = []
            for seed in SEEDS[:2]:
                args, _ = _case("heat_stencil", seed)
                ref = ex.original(np.array(args[0], copy=True), args[1], steps)
                got.append((launcher(_device(args)[0], args[1], steps), ref))
            for out, ref in got:
                assert check(_host(out), ref, **tol).passed, (launcher.__name__, steps)
