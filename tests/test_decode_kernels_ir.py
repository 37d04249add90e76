"""V5's Triton kernels build for the signature torch.compile gives them: inductor types a Python float argument
as fp64 (the attention's scale, the GEMV's eps). Triton's front end (source to IR) runs here without a GPU, in a
fresh process so TRITON_INTERPRET (which test_decode_kernels sets) does not swap in the interpreter."""

import importlib.util
import subprocess
import sys
import textwrap

import pytest

# found, not imported: triton imported here, before test_decode_kernels sets TRITON_INTERPRET, would decorate its
# language functions for the compiler, and that module's interpreter tests would then fail in the same process
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ.pop("TRITON_INTERPRET", None)
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from gpuspeed.decode.kernels import attention, gemv

    target = GPUTarget("cuda", 90, 32)
    try:
        backend = make_backend(target)
    except Exception as exc:
        print("SKIP", type(exc).__name__, exc)
        sys.exit(0)
    options = backend.parse_options({})

    def front_end(kernel, sig, constexprs):
        ctx = ir.context()
        ir.load_dialects(ctx)
        backend.load_dialects(ctx)
        src = ASTSource(kernel, sig, constexprs=constexprs)
        src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), ctx)

    flt = sys.argv[1]
    for ieee in (0, 1):
        dt = "fp32" if ieee else "bf16"
        front_end(attention._kernel(), {
            "q_ptr": "*" + dt, "k_ptr": "*" + dt, "v_ptr": "*" + dt, "pos_ptr": "*i64", "o_ptr": "*fp32",
            "lse_ptr": "*fp32", "G": "i32", "HKV": "i32", "scale": flt, "sq_b": "i32", "sq_h": "i32",
            "sk_b": "i32", "sk_h": "i32", "sk_l": "i32", "sv_b": "i32", "sv_h": "i32", "sv_l": "i32",
            "n_splits": "i32", "D": "constexpr", "G_PAD": "constexpr", "CHUNK": "constexpr", "BLOCK_L": "constexpr",
            "IEEE": "constexpr"}, {"D": 64, "G_PAD": 16, "CHUNK": 256, "BLOCK_L": 64, "IEEE": ieee})
    for pro in (0, 1, 2):
        for one_pass in ((0, 1) if pro == 1 else (0,)):
            front_end(gemv._kernel(), {
                "x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "nw_ptr": "*bf16", "res_ptr": "*bf16",
                "N": "i32", "K": "i32", "stride_wn": "i32", "K_PER_SPLIT": "i32", "eps": flt, "BLOCK_N": "constexpr",
                "BLOCK_K": "constexpr", "PRO": "constexpr", "DIRECT": "constexpr", "RES": "constexpr",
                "ONE_PASS": "constexpr", "PDL": "constexpr"},
                {"BLOCK_N": 8, "BLOCK_K": 512, "PRO": pro, "DIRECT": 1, "RES": 1, "ONE_PASS": one_pass,
                 "PDL": pro % 2})  # griddepcontrol (programmatic dependent launch) in half the forms
    from gpuspeed.decode.kernels import int8_gemv
    for pro, one_pass, direct, prefetch, x64, affine in ((0, 0, 1, 1, 0, 0), (1, 1, 1, 1, 1, 1), (1, 0, 0, 0, 1, 0),
                                                         (2, 0, 1, 0, 1, 1), (2, 0, 1, 1, 0, 1)):
        front_end(int8_gemv._kernel(), {
            "x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*fp32", "out_ptr": "*bf16", "nw_ptr": "*bf16",
            "res_ptr": "*bf16", "N": "i32", "K": "i32", "KW": "i32", "stride_qn": "i32", "W_PER_SPLIT": "i32",
            "eps": flt, "BLOCK_N": "constexpr", "BLOCK_W": "constexpr", "PRO": "constexpr", "DIRECT": "constexpr",
            "RES": "constexpr", "ONE_PASS": "constexpr", "PDL": "constexpr", "PREFETCH": "constexpr",
            "ASM": "constexpr", "X64": "constexpr", "AFFINE": "constexpr"},
            {"BLOCK_N": 8, "BLOCK_W": 256, "PRO": pro, "DIRECT": direct, "RES": direct, "ONE_PASS": one_pass,
             "PDL": 1 - pro % 2, "PREFETCH": prefetch, "ASM": 1, "X64": x64, "AFFINE": affine})  # inline PTX
    from gpuspeed.decode.kernels import step_attention
    # (dtype, ieee, dot, g_pad, block_l, splits, pdl): the split form's fence, tickets and merge, and PDL
    for dt, ieee, dot, g_pad, block_l, splits, pdl in (("bf16", 0, 1, 16, 64, 1, 0), ("fp32", 1, 0, 4, 16, 1, 1),
                                                       ("fp32", 1, 1, 16, 64, 1, 0), ("bf16", 0, 1, 16, 32, 4, 1),
                                                       ("fp32", 1, 0, 1, 64, 8, 0)):
        front_end(step_attention._kernel(), {
            "qkv_ptr": "*" + dt, "cos_ptr": "*" + dt, "sin_ptr": "*" + dt, "pos_ptr": "*i64", "kc_ptr": "*" + dt,
            "vc_ptr": "*" + dt, "out_ptr": "*" + dt, "cnt_ptr": "*i32", "part_ptr": "*fp32", "ml_ptr": "*fp32",
            "G": "i32", "HKV": "i32", "Q_ROWS": "i32", "KV_ROWS": "i32",
            "s_qkv_b": "i32", "s_c_b": "i32", "s_c_h": "i32", "s_c_l": "i32", "s_out_b": "i32", "scale": flt,
            "D": "constexpr", "G_PAD": "constexpr", "BLOCK_L": "constexpr", "IEEE": "constexpr", "DOT": "constexpr",
            "SPLITS": "constexpr", "FENCE": "constexpr", "PDL": "constexpr"},
            {"D": 64, "G_PAD": g_pad, "BLOCK_L": block_l, "IEEE": ieee, "DOT": dot, "SPLITS": splits, "FENCE": 1,
             "PDL": pdl})
    print("OK")
""")


@pytest.mark.parametrize("flt", ["fp64", "fp32"])
def test_kernels_build_with_inductors_float_arguments(flt):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, flt], capture_output=True, text=True, timeout=120)
    out = proc.stdout.strip()
    if out.startswith("SKIP"):
        pytest.skip(f"Triton's CUDA back end is not usable here: {out}")
    assert proc.returncode == 0 and out.endswith("OK"), proc.stderr[-1500:]
