"""Hand-tuned Triton and Numba CUDA kernels for the bundled examples, one module per example.

Each module holds the kernel first and its thin launcher after it, as the Triton tutorials do. The
examples reach them through `lazy(...)` so that importing an example never imports Triton or Numba.
A launcher takes the example's arguments as torch tensors on the GPU (the optimize worker moves
them once: `gpuspeed_inputs = "torch"`) or as host NumPy arrays (moved here), and returns torch
tensors in the original's dtypes. On the CPU the kernels run only under their interpreters:
TRITON_INTERPRET=1 (Triton) and NUMBA_ENABLE_CUDASIM=1 (Numba CUDA), for correctness, not speed.
"""

from __future__ import annotations

import functools
import importlib
import os


# the examples' inputs(rng, scale) for their hand kernels under the interpreters (no GPU: `gpuspeed kernel`,
# benchmarks/kernels.py): the simulator runs each Numba thread as a Python thread, so a tenth of the typical size
# takes minutes (row_stats' Numba kernel: over 5 a call)
INTERPRETED_SCALE = 0.002


class KernelUnavailable(ImportError):
    """No device to run the kernel on (an ImportError, so the optimize worker records 'unavailable')."""


def require_numba(cuda) -> None:
    """A Numba launcher's first step: its module's `cuda` is None where numba-cuda is not installed, which
    would otherwise surface as an AttributeError deep in the launch."""
    if cuda is None:
        raise KernelUnavailable("numba-cuda is not installed (pip install numba-cuda): the Numba CUDA kernels need it")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def cudasim() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def lazy(module: str, name: str, precision: str | None = None):
    """A variant callable that imports `gpuspeed.examples.hand_kernels.<module>` on its first call. Without a CUDA
    device it refuses in one line (an ImportError: the optimize worker records the candidate 'unavailable'),
    interpreters or not: interpreted kernels are for tests, and would make a CPU run of optimize crawl.
    precision="float32": a kernel computing in float32 (optimize casts its float64 inputs before the timing and
    judges it under the example's TOLERANCE, as its own float32 candidates)."""

    def variant(*args):
        import torch

        if not torch.cuda.is_available():  # even under the interpreters: as a candidate it would time nothing real
            raise KernelUnavailable("no CUDA device: the hand kernels run on the GPU (their launchers in "
                                    f"gpuspeed.examples.hand_kernels.{module} run under TRITON_INTERPRET=1 / "
                                    "NUMBA_ENABLE_CUDASIM=1 for tests)")
        fn = getattr(importlib.import_module(f"gpuspeed.examples.hand_kernels.{module}"), name)
        return fn(*args)

    variant.__name__ = variant.__qualname__ = name
    variant.__doc__ = f"{name} from gpuspeed.examples.hand_kernels.{module} (imported on first call)."
    variant.target = (f"gpuspeed.examples.hand_kernels.{module}", name)  # where the launcher lives (benchmarks/kernels.py)
    variant.gpuspeed_inputs = "torch"  # the optimize worker moves the inputs to the GPU once, outside the timing
    if precision:
        variant.precision = precision
    return variant


AUTOTUNE_BUDGET_S = 0.25  # bench() budget per config: ~10x a 20 us kernel's noise-limited samples, 2 s for 8 configs


def autotune_bench(kernel_call, quantiles=None, **_):
    """Triton's autotuner times each config through gpuspeed.bench, the project's one timing path, as the
    kernels' reported times are: CUDA events, its L2 flush, the stream held while the launcher issues, and
    noise-based stopping. triton.testing.do_bench flushes L2 by writing 256 MB, which leaves L2 dirty for
    the timed config to write back, and can rank configs otherwise: under do_bench the float64 stencil's
    pick, timed by bench, ran 778, 804 and 854 us in three H200 runs (kernels_9200d2d.json,
    kernels_dc8f3c6.json, kernels_f869982.json). Returns [median ms] per quantile asked."""
    from gpuspeed.timing import bench

    m = bench(kernel_call, mode="events", hide_launch_latency=True, budget_s=AUTOTUNE_BUDGET_S, name="autotune")
    ms = m.median * 1e3
    return [ms] * len(quantiles) if quantiles else ms


def autotune(configs, key, **kw):
    """triton.autotune with autotune_bench as its timer (the hand kernels' decorator)."""
    import triton

    return triton.autotune(configs=configs, key=key, do_bench=autotune_bench, **kw)


def device_tensor(x, interpreter: bool):
    """x as a torch tensor where the kernel can read it: NumPy arrays are moved to the GPU (or kept on the
    host under an interpreter); a host tensor without an interpreter is refused with a one-line reason."""
    import numpy as np
    import torch

    if not isinstance(x, torch.Tensor):  # a NumPy array, or a list or scalar as the original takes them
        x = torch.from_numpy(np.ascontiguousarray(x))
        if torch.cuda.is_available() and not interpreter:
            x = x.cuda()
    if x.device.type != "cuda" and not interpreter:
        raise KernelUnavailable("the hand kernels need a CUDA device (or TRITON_INTERPRET=1 / NUMBA_ENABLE_CUDASIM=1 "
                                "on the CPU)")
    return x.contiguous()


def result_dtype(*tensors):
    """The original's floating dtype for these inputs (NumPy's promotion: float32 inputs give float32 results),
    float64 where none is floating: the launchers compute in float64 and store in this dtype."""
    import numpy as np
    import torch

    if any(t.dtype == torch.bfloat16 for t in tensors):  # no NumPy dtype: the original could not take it
        return torch.float64
    dt = np.result_type(*(torch.empty(0, dtype=t.dtype).numpy().dtype for t in tensors))
    return torch.from_numpy(np.empty(0, dtype=dt)).dtype if dt.kind == "f" else torch.float64


def check_out(out, shape, dtype, device, name: str = "out", row_stride: bool = False):
    """Refuses, in one line, an `out` buffer the kernel would write wrongly or past the end: it must be a torch
    tensor of exactly `shape`, `dtype` and `device`, contiguous (row_stride: only its last axis need be)."""
    import torch

    shape = tuple(int(s) for s in shape)
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor of shape {shape} and dtype {dtype}, got {type(out).__name__}")
    dense = (out.stride(-1) == 1 or out.shape[-1] <= 1) if row_stride and out.dim() else out.is_contiguous()
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or not dense:
        raise ValueError(f"{name} must be a {'row-major' if row_stride else 'contiguous'} {dtype} tensor of shape "
                         f"{shape} on {device}, got {out.dtype} {tuple(out.shape)} strides {out.stride()} "
                         f"on {out.device}")
    return out


def launch(kernel, grid, *args, config=None, **kw):
    """Launch an autotuned Triton kernel. On the GPU without `config` the autotuner picks (once per key);
    with `config` (a triton.Config), or under the interpreter (which cannot time configs), its plain JIT
    function runs with that config (the interpreter: the first)."""
    if config is None and not interpreting():
        return kernel[grid](*args, **kw)
    if interpreting():
        from gpuspeed.compat import triton_interpreter_index

        triton_interpreter_index()  # triton 3.6's interpreter with NumPy >= 2.4: loops over runtime bounds
    cfg = config if config is not None else kernel.configs[0]
    meta = dict(kw, **cfg.kwargs)
    shape = grid(meta) if callable(grid) else grid
    return kernel.fn[shape](*args, **meta, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


@functools.lru_cache(maxsize=None)
def sm_count(index: int = 0) -> int:
    """Streaming multiprocessors of the GPU (4 without one: the interpreters' stand-in)."""
    from gpuspeed import device

    if not device.cuda_available():
        return 4
    return device.get_device("cuda", index).sms


def numba_array(t):
    """A torch tensor as Numba sees it: a zero-copy CUDA array view, or a NumPy view under the simulator."""
    if cudasim():
        return t.numpy()
    from numba import cuda

    # sync=False: the kernel runs on the tensor's own stream (numba_stream), so the interface's stream
    # synchronize (a host wait on every call) is not needed
    return cuda.as_cuda_array(t.detach(), sync=False)


def numba_stream():
    """torch's current stream for a Numba launch, so events recorded by torch (gpuspeed.bench) time it and a
    CUDA graph capture sees it (0, the default stream, under the simulator)."""
    if cudasim():
        return 0
    import torch
    from numba import cuda

    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)
