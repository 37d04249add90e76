"""V5's kernel choices: which weight shapes run as the Triton GEMV (with the layer's norm, SiLU and residual
fused in) and which decode attention a cache length gets.

choose() returns (Options fields, notes). On a GPU it measures, at the model's own shapes and inside a CUDA
graph as the V5 step runs, cuBLAS (F.linear) against the Triton split-K GEMV configs, and SDPA against
split-sequence flash-decoding. A Triton config is
kept for a shape only if every fused form that shape uses passes gpuspeed.check against float64 and the
plain kernel is no slower than cuBLAS (the fusion's saved kernels come on top); flash-decoding only if it
passes its check and is faster than SDPA. On the CPU torch's ops stay. Decisions are kept per shape, so
later engines of the same model reuse them.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from gpuspeed.decode.kernels import gemv as G, int8_gemv as I8  # the modules (their names stay the modules')
from gpuspeed.errors import one_line

# gpuspeed.decode.model imports this package (fused_gemv): names from model are imported inside functions

_decisions: dict = {}  # (kind, shape..., dtype, device name) -> (choice, details)
_runner_up: dict = {}  # gemv keys where cuBLAS won -> the fastest Triton config that passed its checks


def _rotate_for(nbytes: int, l2: int) -> int:
    """Argument copies so a timed call never finds its weights in L2 (decode reads each weight once)."""
    return int(min(16, max(2, math.ceil(3 * l2 / max(nbytes, 1)))))


def _bench(fn, *args, rotate: int):
    """GPU time per call inside a CUDA graph, where V5's step runs: timed with events, one eager call is its
    host launch cost (the first H200 run timed every Triton GEMV at 70-80 us and SDPA at ~200 us that way, a
    few us of kernel each), which a replay does not pay, so the host decided every choice."""
    from gpuspeed import bench

    return bench(fn, *args, rotate=rotate, budget_s=0.3, warmup_s=0.1, max_noise=0.02, mode="graph")


def _weight(n: int, k: int, dtype, device, quant: str | None, seed: int):
    """A random [n, k] weight as the decode step holds it (a tensor in `dtype`, or quant.Int8Weight) and its
    float64 value (the dequantized int8 one)."""
    from gpuspeed.decode.quant import quantize

    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(n, k, device=device, generator=g) * 0.02
    if quant == "int8":
        qw = quantize(w)
        return qw, qw.dequantize(torch.float64)
    w = w.to(dtype)
    return w, w.double()


def fused_gemv(x: torch.Tensor, w, cfg: tuple, **fused) -> torch.Tensor:
    """The Triton GEMV of weight w (a tensor: gemv.py; an int8 quant.Int8Weight: int8_gemv.py) at config cfg, with
    the fused forms' keywords (norm=, eps=, silu_mul=, residual=, pdl=)."""
    if isinstance(w, torch.Tensor):
        return G.gemv(x, w, *cfg, **fused)
    return I8.int8_gemv(x, w.q, w.scale, *cfg, **fused)


def check_fused(n: int, k: int, cfg: tuple, uses: set, dtype, device, quant: str | None = None) -> tuple[bool, str]:
    """Every fused form `uses` names ("plain", "norm", "residual", "silu_residual") against float64 (quant="int8":
    the int8 GEMV against the float64 product of its dequantized weights)."""
    from gpuspeed.decode.model import rms_norm
    from gpuspeed.verify import check

    w, wd = _weight(n, k, dtype, device, quant, seed=n + k)
    g = torch.Generator(device=device).manual_seed(n + k + 1)
    x = torch.randn(1, 1, k, device=device, generator=g).to(dtype)
    nw = (torch.rand(k, device=device, generator=g) + 0.5).to(dtype)
    res = torch.randn(1, 1, n, device=device, generator=g).to(dtype)
    gu = torch.randn(1, 1, 2 * k, device=device, generator=g).to(dtype)
    d = torch.float64
    forms = {
        "plain": (lambda: fused_gemv(x, w, cfg), lambda: F.linear(x.to(d), wd)),
        "norm": (lambda: fused_gemv(x, w, cfg, norm=nw, eps=1e-5),
                 lambda: F.linear(rms_norm(x.to(d), nw.to(d), 1e-5), wd)),
        "residual": (lambda: fused_gemv(x, w, cfg, residual=res), lambda: res.to(d) + F.linear(x.to(d), wd)),
        "silu_residual": (lambda: fused_gemv(gu, w, cfg, silu_mul=True, residual=res),
                          lambda: res.to(d) + F.linear(F.silu(gu[..., :k].to(d)) * gu[..., k:].to(d), wd)),
    }
    for form in sorted(uses | {"plain"}):
        mine, ref = forms[form]
        res_ = check(mine(), ref())
        if not res_.passed:
            return False, f"{form}: {res_.summary}"
    return True, ""


def _baseline(w, x, rot: int, tried: dict):
    """What the Triton GEMV must beat at batch 1: cuBLAS (F.linear) for a plain weight; for int8, the compiled
    dequantize-then-linear (inductor fuses the int8 -> dtype cast into its batch-1 reduction), eager where
    compile is unavailable."""
    if isinstance(w, torch.Tensor):
        t = _bench(F.linear, x, w, rotate=rot).median
        tried["cublas_us"] = t * 1e6
        return t, "cuBLAS"
    from gpuspeed.decode.quant import dequant_linear

    try:
        compiled = torch.compile(dequant_linear, fullgraph=True, dynamic=False)
        t = _bench(compiled, x, w.q, w.scale, rotate=rot).median
        tried["compiled_torch_us"] = t * 1e6
        return t, "compiled dequant-matmul"
    except Exception as exc:  # compile unavailable: eager torch is the baseline
        t = _bench(dequant_linear, x, w.q, w.scale, rotate=rot).median
        tried["eager_torch_us"], tried["compile_error"] = t * 1e6, type(exc).__name__
        return t, "eager dequant-matmul"


def gemv_key(n: int, k: int, dtype, uses: set, quant: str | None = None) -> tuple:
    """The key of a GEMV decision in _decisions and _runner_up (this GPU's name in it)."""
    return ("gemv", n, k, dtype, tuple(sorted(uses)), torch.cuda.get_device_name()) + ((quant,) if quant else ())


def choose_gemv(n: int, k: int, dtype, uses: set, notes: list, quant: str | None = None) -> tuple | None:
    """The fastest correct Triton config for W [n, k] at batch 1 (quant="int8": an int8 weight, the int8 GEMV's
    configs against the compiled dequantize-then-linear), or None when the library form (cuBLAS) is faster."""
    from gpuspeed import device as _device
    from gpuspeed.decode.quant import Int8Weight

    key = gemv_key(n, k, dtype, uses, quant)
    if key in _decisions:
        return _decisions[key][0]
    w, _ = _weight(n, k, dtype, "cuda", quant, seed=n + k)
    x = torch.randn(1, 1, k, device="cuda", dtype=dtype)
    nbytes = w.nbytes if isinstance(w, Int8Weight) else w.numel() * w.element_size()
    rot = _rotate_for(nbytes, _device.l2_bytes())
    tensors = (w,) if isinstance(w, torch.Tensor) else (w.q, w.scale)  # what the timing rotates

    def as_weight(*t):
        return t[0] if len(t) == 1 else Int8Weight(*t)

    tried: dict = {}
    base, base_name = _baseline(w, x, rot, tried)
    # the Triton side is timed in the costliest fused form the shape runs in, against the library form alone: a
    # win here is a win before counting the norm / SiLU / add kernels the fusion removes
    nw = torch.rand(k, device="cuda", dtype=dtype) + 0.5
    res = torch.randn(1, 1, n, device="cuda", dtype=dtype)
    gu = torch.randn(1, 1, 2 * k, device="cuda", dtype=dtype)
    if "norm" in uses:
        form, first, fused = "norm", x, dict(norm=nw, eps=1e-5)
    elif "silu_residual" in uses:
        form, first, fused = "silu_residual", gu, dict(silu_mul=True, residual=res)
    elif "residual" in uses:
        form, first, fused = "residual", x, dict(residual=res)
    else:
        form, first, fused = "plain", x, {}
    configs = G.CONFIGS if quant is None else I8.CONFIGS if I8.supported(w.q) else []
    timed = []
    for cfg in configs:  # time every config in its fused form, then check the fastest ones until one passes
        try:
            m = _bench(lambda h, *t, cfg=cfg: fused_gemv(h, as_weight(*t), cfg, **fused), first, *tensors, rotate=rot)
            tried[str(cfg)] = m.median * 1e6
            timed.append((m.median, cfg))
        except Exception as exc:  # a config that fails to compile or run is skipped
            tried[str(cfg)] = f"{type(exc).__name__}"
    best, best_t = None, None
    for t_cfg, cfg in sorted(timed):
        if t_cfg > base:
            break
        try:
            ok, why = check_fused(n, k, cfg, uses, dtype, "cuda", quant)
        except Exception as exc:  # a fused form that fails to compile or run: this config is out
            ok, why = False, one_line(exc, 60)
        if ok:
            best, best_t = cfg, t_cfg
            break
        tried[str(cfg)] = f"wrong ({why[:80]})"
    if best is None and timed:
        best_t = min(timed)[0]
        # the library form won: the fastest Triton config that passes its checks is still kept apart, for the V5
        # step whose Triton kernels all use programmatic dependent launch (variants.Fast.choose_insides), where a
        # slightly slower GEMV that prefetches its weights and absorbs the norm can win the whole step
        for _t, cfg in sorted(timed)[:3]:
            try:
                ok, _why = check_fused(n, k, cfg, uses, dtype, "cuda", quant)
            except Exception:
                ok = False
            if ok:
                _runner_up[key] = cfg
                tried["runner_up"] = str(cfg)
                break
    use = best if best_t is not None and best_t <= base else None
    t = best_t if use else base
    tried[("cublas" if quant is None else "library") + "_GBps"] = nbytes / base / 1e9
    tried["GBps"] = nbytes / t / 1e9
    tried["choice"] = str(use) if use else base_name
    what = "GEMV" if quant is None else f"{quant} GEMV"
    notes.append(f"{what} {n}x{k} ({', '.join(sorted(uses))}): {'Triton ' + str(use) if use else base_name} "
                 f"{t * 1e6:.1f} us, {nbytes / t / 1e9:.0f} GB/s ({base_name} {base * 1e6:.1f} us, best Triton with "
                 f"{form} fused {best_t * 1e6 if best_t else float('nan'):.1f} us)")
    _decisions[key] = (use, tried)
    return use


def choose_attention(batch: int, n_heads: int, n_kv: int, head_dim: int, max_len: int, dtype, notes: list) -> bool:
    """True when flash-decoding beats SDPA on a full cache of max_len (and matches it)."""
    from gpuspeed.decode.kernels.attention import decode_attention
    from gpuspeed.decode.model import attention as sdpa_attention
    from gpuspeed.verify import check

    key = ("attn", batch, n_heads, n_kv, head_dim, max_len, dtype, torch.cuda.get_device_name())
    if key in _decisions:
        return _decisions[key][0]
    q = torch.randn(batch, n_heads, 1, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, n_kv, max_len, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    pos = torch.tensor([max_len - 1], device="cuda")
    mask = torch.arange(max_len, device="cuda")[None, :] <= pos[:, None]
    ref = sdpa_attention(q.double(), k.double(), v.double(), mask)
    use, details = None, {}
    try:
        ok = check(decode_attention(q, k, v, mask, pos), ref)
        base = _bench(sdpa_attention, q, k, v, mask, rotate=2)
        mine = _bench(decode_attention, q, k, v, mask, pos, rotate=2)
        use = ok.passed and mine.median < base.median
        details = {"sdpa_us": base.median * 1e6, "flash_decoding_us": mine.median * 1e6, "check": ok.summary}
        notes.append(f"decode attention over {max_len} keys: {'flash-decoding' if use else 'SDPA'} "
                     f"(SDPA {base.median * 1e6:.1f} us, flash-decoding {mine.median * 1e6:.1f} us"
                     f"{'' if ok.passed else ', flash-decoding FAILED its check'})")
    except Exception as exc:
        notes.append(f"flash-decoding unavailable: {one_line(exc, 120)}")
    _decisions[key] = (use, details)
    return use


def choose_step_attention(batch: int, n_heads: int, n_kv: int, head_dim: int, max_len: int, dtype, flash: bool,
                          notes: list) -> tuple | None:
    """The fused step kernel's config (RoPE + cache write + attention, kernels/step_attention.py: the fastest of its
    CONFIGS that matches float64) when it beats the same step compiled from torch's ops (inductor's RoPE/cache-write
    kernels and the attention chosen so far) on a full cache of max_len; else None."""
    from gpuspeed.decode.kernels import step_attention as SA
    from gpuspeed.decode.model import named_config, rope_tables
    from gpuspeed.verify import check

    key = ("step_attn", batch, n_heads, n_kv, head_dim, max_len, dtype, torch.cuda.get_device_name())
    if key in _decisions:
        return _decisions[key][0]
    use, details = None, {}
    try:
        args = named_config("tiny", n_heads=n_heads, n_kv_heads=n_kv, dim=n_heads * head_dim, head_dim=head_dim)
        cos, sin = rope_tables(args, max_len, "cuda", dtype)
        qkv = torch.randn(batch, 1, (n_heads + 2 * n_kv) * head_dim, device="cuda", dtype=dtype)
        kc = torch.randn(batch, n_kv, max_len, head_dim, device="cuda", dtype=dtype)
        vc = torch.randn_like(kc)
        pos = torch.tensor([max_len - 1], device="cuda")
        want = SA.reference(qkv.double(), cos.double(), sin.double(), pos, kc.double(), vc.double())
        tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        attn = None
        if flash:
            from gpuspeed.decode.kernels.attention import decode_attention as attn

        def torch_step(qkv, cos, sin, pos, kc, vc):
            return SA.reference(qkv, cos, sin, pos, kc, vc, attention_fn=attn)

        compiled = torch.compile(torch_step, fullgraph=True, dynamic=False)
        compiled(qkv, cos, sin, pos, kc, vc)
        base = _bench(compiled, qkv, cos, sin, pos, kc, vc, rotate=2)
        details = {"compiled_torch_us": base.median * 1e6}
        best, best_t, failed = None, None, []
        counter = SA.new_counter(batch, n_kv, "cuda")  # split configs' tickets, as the static cache holds them
        for cfg in SA.CONFIGS:
            try:
                # twice on the same counter: a split config that left it unreset would fail the second check
                for _ in range(2):
                    ok = check(SA.step_attention(qkv, cos, sin, pos, kc.clone(), vc.clone(), *cfg, counter=counter),
                               want, **tol)
                    if not ok.passed:
                        break
                if not ok.passed:
                    details[str(cfg)], details[f"{cfg} check"] = "wrong", ok.summary
                    failed.append(str(cfg))
                    continue
                t = _bench(lambda *a, cfg=cfg: SA.step_attention(*a, *cfg, counter=counter), qkv, cos, sin, pos,
                           kc, vc, rotate=2).median
            except Exception as exc:  # a config that does not build (registers, shared memory) is skipped
                details[str(cfg)] = type(exc).__name__
                continue
            details[str(cfg)] = t * 1e6
            if best_t is None or t < best_t:
                best, best_t, details["check"] = cfg, t, ok.summary
        use = best if best_t is not None and best_t < base.median else None
        if best_t is not None:
            details["fused_us"] = best_t * 1e6
        fused = f"fused {best_t * 1e6:.1f} us {best}" if best_t is not None else "no fused config ran"
        notes.append(f"decode step attention over {max_len} keys: {'one fused kernel' if use else 'compiled torch ops'}"
                     f" (compiled RoPE + cache write + {'flash-decoding' if flash else 'SDPA'} {base.median * 1e6:.1f} us,"
                     f" {fused}{'; FAILED its check: ' + ', '.join(failed) if failed else ''})")
    except Exception as exc:
        notes.append(f"fused step attention unavailable: {one_line(exc, 120)}")
    _decisions[key] = (use, details)
    return use


def gemv_uses(args) -> dict:
    """The weight shapes of a decode step and the fused forms each runs in (fused QKV and gate/up)."""
    a = args
    uses: dict = {}
    for shape, form in [((a.q_rows + 2 * a.kv_rows, a.dim), "norm"), ((a.dim, a.q_rows), "residual"),
                        ((2 * a.ffn_dim, a.dim), "norm"), ((a.dim, a.ffn_dim), "silu_residual"),
                        ((a.vocab_size, a.dim), "norm")]:
        uses.setdefault(shape, set()).add(form)
    return uses


def choices() -> dict:
    """Every decision made so far in this process, as plain data (the results record it)."""
    out = {}
    for key, (choice, details) in _decisions.items():
        if key[0] == "gemv":
            _, n, k, dtype, uses, _dev = key[:6]
            kind = f"int8 weights, {str(dtype).replace('torch.', '')} inputs" if key[6:] == ("int8",) else \
                str(dtype).replace('torch.', '')
            name = f"gemv {n}x{k} {kind} ({', '.join(uses)})"
        elif key[0] == "step_attn":
            _, b, h, hkv, d, length, dtype, _dev = key
            name = f"step attention batch {b} heads {h}/{hkv} dim {d} keys {length} {str(dtype).replace('torch.', '')}"
        else:
            _, b, h, hkv, d, length, dtype, _dev = key
            name = f"attention batch {b} heads {h}/{hkv} dim {d} keys {length} {str(dtype).replace('torch.', '')}"
        out[name] = {"choice": str(choice), **{k: v for k, v in details.items() if k != "choice"}}
    return out


def all_triton(model, table: dict) -> dict:
    """`table` (shape -> Triton config) with every shape the library form won filled in by its checked Triton
    runner-up: the GEMV table of a step whose kernels all launch with PDL. Shapes without a checked config stay
    out."""
    out = dict(table)
    quant = "int8" if getattr(model, "quant", None) == "int8" else None
    for (n, k), uses in gemv_uses(model.args).items():
        key = gemv_key(n, k, model.dtype, uses, quant)
        if (n, k) not in out and key in _runner_up:
            out[(n, k)] = _runner_up[key]
    return out


def choose(model, batch: int, max_len: int) -> tuple[dict, list]:
    """Options fields for V5 on this model, batch and cache length ({"gemv": table, "attention": fn}), notes."""
    notes: list[str] = []
    if model.device.type != "cuda":
        notes.append("CPU: torch's F.linear and SDPA (the Triton kernels are GPU choices)")
        return {}, notes
    try:
        import triton  # noqa: F401
    except ImportError:
        notes.append("Triton is not installed: torch's F.linear and SDPA")
        return {}, notes
    a = model.args
    fields: dict = {}
    if batch == 1 and getattr(model, "quant", None) == "int8":
        from gpuspeed.decode.quant import int8_weights

        # quant.choose() measured each int8 shape in its fused forms when the weights were quantized
        table = {tuple(w.shape): w.cfg for w in int8_weights(model) if w.cfg is not None}
        if table:
            fields["gemv"] = table
    elif batch == 1:
        table = {}
        for (n, k), uses in sorted(gemv_uses(a).items()):
            cfg = choose_gemv(n, k, model.dtype, uses, notes)
            if cfg is not None:
                table[(n, k)] = cfg
        if table:
            fields["gemv"] = table
    flash = choose_attention(batch, a.n_heads, a.n_kv_heads, a.head_dim, max_len, model.dtype, notes)
    if flash:
        from gpuspeed.decode.kernels.attention import decode_attention

        fields["attention"] = decode_attention
    cfg = choose_step_attention(batch, a.n_heads, a.n_kv_heads, a.head_dim, max_len, model.dtype, flash, notes) \
        if model.tp is None else None
    if cfg is not None:
        from gpuspeed.decode.kernels.step_attention import step_attention

        fields["step_attention"] = functools.partial(step_attention, block_scale=cfg[0], num_warps=cfg[1],
                                                     splits=cfg[2])
    return fields, notes
