"""Triton kernels for the roofline: read, write and copy streams, FMA chains, the AI sweep, elementwise ops.

Every kernel works on contiguous tiles of BLOCK elements with no mask (sizes are multiples of BLOCK),
so Triton sees 16-byte aligned, contiguous accesses and emits 16-byte vector loads and stores. They run
under TRITON_INTERPRET=1 on the CPU for correctness tests. Import this module only where Triton is
installed; `launch_*` functions allocate nothing except where they say so.
"""

from __future__ import annotations

import triton
import triton.language as tl

FMA_UNROLL = 64  # FMAs per chain per loop trip: long enough that loop overhead is noise


EVICT_POLICIES = ("", "evict_first", "evict_last")  # L2 eviction hints of the loads ("": none)


@triton.jit
def _read_kernel(x_ptr, partial_ptr, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # a cache hint: measured every way, as each helps on some chips and hurts on others
    x = tl.load(x_ptr + offs, eviction_policy=EVICT)
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _read_persistent_kernel(x_ptr, partial_ptr, n_per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n_per_program):  # the launcher makes n_tiles a multiple of the grid
        offs = (pid + i * nprog) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs).to(tl.float32)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _write_kernel(y_ptr, value, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, (tl.zeros([BLOCK], dtype=tl.float32) + value).to(y_ptr.dtype.element_ty))


@triton.jit
def _copy_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr, EVICT: tl.constexpr, STREAM_STORE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, eviction_policy=EVICT)
    if STREAM_STORE:  # st.global.cs: the output is not read again, don't keep it in L2
        tl.store(y_ptr + offs, x, cache_modifier=".cs")
    else:
        tl.store(y_ptr + offs, x)


@triton.jit
def _fma_kernel(out_ptr, a, b, n_outer, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    # Each element is one FMA chain; each thread holds BLOCK / threads independent chains.
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = offs.to(out_ptr.dtype.element_ty) * 1e-9
    av = tl.cast(a, out_ptr.dtype.element_ty)
    bv = tl.cast(b, out_ptr.dtype.element_ty)
    for _ in range(n_outer):
        for _u in tl.static_range(UNROLL):
            x = x * av + bv  # contracted to one FMA (NVPTX fuses mul+add by default)
    tl.store(out_ptr + offs, x)  # written, so the chains cannot be folded away


@triton.jit
def _sweep_kernel(x_ptr, y_ptr, a, b, n_outer, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                  ADD_ONLY: tl.constexpr):
    # Reads one element, does 1 add (ADD_ONLY) or UNROLL * n_outer FMAs on it in fp32, writes one.
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, eviction_policy="evict_last").to(tl.float32)  # as EW_EVICT: the faster stream
    if ADD_ONLY:
        x = x + b
    else:
        for _ in range(n_outer):
            for _u in tl.static_range(UNROLL):
                x = x * a + b  # one FMA after contraction
    tl.store(y_ptr + offs, x.to(y_ptr.dtype.element_ty))


@triton.jit
def _sin_short(x):
    # sin(x) in fp32 to 2.3e-6 relative: enough for a bf16/fp16 result (half an ulp is 2^-9 / 2^-12
    # relative), at half of libdevice sinf's instructions and all on the FMA/ALU pipes. k = round(x / pi)
    # by the 1.5 * 2^23 trick (no FRND; the low bit of t is k's parity), Cody-Waite reduction by
    # pi = 3.140625 + 9.6765e-4 (k * 3.140625 is exact for |k| < 2^16), the odd Taylor polynomial to x^9
    # on [-pi/2, pi/2] (relative error r^10 / 11! <= 2.3e-6; the kernel is close to instruction-bound, so
    # a term more costs bandwidth), and sin(r + k pi) = (-1)^k sin(r) by flipping the sign bit.
    t = x * 0.3183098861837907 + 12582912.0
    k = t - 12582912.0
    r = tl.fma(-k, 3.140625, x)
    r = tl.fma(-k, 9.676535897932795e-04, r)
    r2 = r * r
    p = r2 * 2.7557319223985893e-06 - 1.984126984126984e-04
    p = p * r2 + 8.333333333333333e-03
    p = p * r2 - 0.16666666666666666
    s = r + r * r2 * p
    flip = (t.to(tl.int32, bitcast=True) & 1) << 31
    return (s.to(tl.int32, bitcast=True) ^ flip).to(tl.float32, bitcast=True)


@triton.jit
def _elementwise_kernel(x_ptr, z_ptr, y_ptr, a, b, c, d, BLOCK: tl.constexpr, OP: tl.constexpr,
                        EVICT: tl.constexpr):
    # One read of x (and z for add), one write of y, math in fp32. OP: "add" (y = x + z), "sin", or "chain"
    # (the fused y = sin(x * a + b) * c + d). sin is computed to the precision of y: libdevice sinf for
    # fp32, _sin_short for 16-bit outputs (sinf's ~40 instructions per element would cap a bf16 stream
    # below the memory roof). Arguments past 2^15 take libdevice sinf in either case (a per-tile branch).
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, eviction_policy=EVICT).to(tl.float32)
    if OP == "add":
        y = x + tl.load(z_ptr + offs, eviction_policy=EVICT).to(tl.float32)
    else:
        if OP == "chain":
            x = x * a + b
        if y_ptr.dtype.element_ty == tl.float32:
            y = tl.sin(x)
        else:
            if tl.max(tl.abs(x), axis=0) < 32768.0:  # a NaN tile may go either way: both keep the NaN
                y = _sin_short(x)
            else:
                y = tl.sin(x)
        if OP == "chain":
            y = y * c + d
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty))


def _tiles(n: int, block: int) -> int:
    if n % block:
        raise ValueError(f"size {n} is not a multiple of BLOCK={block}")
    return n // block


def _policy(evict: str) -> str:
    if evict not in EVICT_POLICIES:
        raise ValueError(f"eviction policy {evict!r}: use one of {EVICT_POLICIES}")
    return evict


def launch_read(x, partial, *, block: int, num_warps: int, evict: str = ""):
    """Sum each BLOCK of x into partial[i] (partial holds numel/BLOCK floats)."""
    _read_kernel[(_tiles(x.numel(), block),)](x, partial, BLOCK=block, EVICT=_policy(evict), num_warps=num_warps)
    return partial


def launch_read_persistent(x, partial, *, block: int, num_warps: int):
    """Persistent grid: partial.numel() programs stride over the tiles of x (an equal share each)."""
    n_tiles = _tiles(x.numel(), block)
    if n_tiles % partial.numel():
        raise ValueError(f"{n_tiles} tiles do not divide among {partial.numel()} programs")
    _read_persistent_kernel[(partial.numel(),)](x, partial, n_tiles // partial.numel(), BLOCK=block,
                                                num_warps=num_warps)
    return partial


def launch_write(y, value: float, *, block: int, num_warps: int):
    _write_kernel[(_tiles(y.numel(), block),)](y, value, BLOCK=block, num_warps=num_warps)
    return y


def launch_copy(x, y, *, block: int, num_warps: int, evict: str = "", stream_store: bool = False):
    _copy_kernel[(_tiles(x.numel(), block),)](x, y, BLOCK=block, EVICT=_policy(evict), STREAM_STORE=stream_store,
                                               num_warps=num_warps)
    return y


def launch_fma(out, a: float, b: float, n_outer: int, *, block: int, num_warps: int, unroll: int = FMA_UNROLL):
    """out.numel() chains of n_outer * unroll FMAs each: 2 * that many FLOPs per element."""
    _fma_kernel[(_tiles(out.numel(), block),)](out, a, b, n_outer, BLOCK=block, UNROLL=unroll,
                                                num_warps=num_warps)
    return out


def sweep_shape(flops_per_element: int) -> tuple[bool, int, int]:
    """(add_only, unroll, n_outer) giving exactly `flops_per_element` (1, or an even count)."""
    if flops_per_element == 1:
        return True, 1, 1
    if flops_per_element < 2 or flops_per_element % 2:
        raise ValueError("flops per element must be 1 or even")
    fmas = flops_per_element // 2
    unroll = 1
    while unroll * 2 <= min(fmas, 32) and fmas % (unroll * 2) == 0:
        unroll *= 2
    return False, unroll, fmas // unroll


def launch_sweep(x, y, flops_per_element: int, a: float, b: float, *, block: int, num_warps: int):
    add_only, unroll, n_outer = sweep_shape(flops_per_element)
    _sweep_kernel[(_tiles(x.numel(), block),)](x, y, a, b, n_outer, BLOCK=block, UNROLL=unroll,
                                                ADD_ONLY=add_only, num_warps=num_warps)
    return y


# Elementwise launch config: the fastest streams measured (docs/notes/studies.md). The 16-bit sin runs one
# warp per tile so its per-tile max stays inside the warp (no shared memory, no barrier).
EW_BLOCK, EW_WARPS, EW_EVICT = 1024, 4, "evict_last"
EW_WARPS_SHORT_SIN = 1


def launch_elementwise(op: str, x, y, z=None, *, coeffs=(1.0, 0.0, 1.0, 0.0), block: int = EW_BLOCK,
                       num_warps: int | None = None, evict: str = EW_EVICT):
    """y = x + z ("add"), sin(x) ("sin") or sin(x * a + b) * c + d ("chain", coeffs = a, b, c, d)."""
    if op not in ("add", "sin", "chain"):
        raise ValueError(f"unknown elementwise op {op!r}")
    if (op == "add") != (z is not None):
        raise ValueError("add takes z; sin and chain do not")
    if num_warps is None:
        num_warps = EW_WARPS_SHORT_SIN if op != "add" and y.element_size() < 4 else EW_WARPS
    a, b, c, d = (float(v) for v in coeffs)
    _elementwise_kernel[(_tiles(x.numel(), block),)](x, x if z is None else z, y, a, b, c, d, BLOCK=block, OP=op,
                                                      EVICT=_policy(evict), num_warps=num_warps)
    return y


def launch_chain(x, y, a: float, b: float, c: float, d: float, **kw):
    """The fused elementwise chain y = sin(x * a + b) * c + d."""
    return launch_elementwise("chain", x, y, coeffs=(a, b, c, d), **kw)


# ---------------------------------------------------------------------------------------------------
# The same FMA chains in CUDA C++, compiled at run time by NVRTC through CuPy (a second opinion on the
# FP32 peak, mixbench-style: 8 independent chains per thread). Optional: CuPy may be missing.
# ---------------------------------------------------------------------------------------------------

CUDA_FMA_CHAINS = 8
CUDA_FMA_UNROLL = 64
_CUDA_FMA_SRC = r"""
extern "C" __global__ void fma_chains(float* out, float a, float b, int n_outer) {
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float x0 = tid * 1e-9f, x1 = x0 + 1e-3f, x2 = x0 + 2e-3f, x3 = x0 + 3e-3f;
    float x4 = x0 + 4e-3f, x5 = x0 + 5e-3f, x6 = x0 + 6e-3f, x7 = x0 + 7e-3f;
    for (int i = 0; i < n_outer; ++i) {
#pragma unroll
        for (int j = 0; j < 64; ++j) {
            x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
            x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
        }
    }
    out[tid] = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
}
"""


def cuda_fma_launcher():
    """A function (out_torch_tensor, a, b, n_outer, threads) -> out running the CUDA FMA chains."""
    import cupy
    import numpy as np

    kernel = cupy.RawKernel(_CUDA_FMA_SRC, "fma_chains")

    def launch(out, a: float, b: float, n_outer: int, threads: int = 256):
        if out.numel() % threads:
            raise ValueError("out size must be a multiple of the block size")
        arr = cupy.asarray(out)  # shares the torch allocation (CUDA array interface)
        kernel((out.numel() // threads,), (threads,), (arr, np.float32(a), np.float32(b), np.int32(n_outer)))
        return out

    return launch
