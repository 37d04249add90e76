"""gpuspeed.kernel.instructions: PTX opcodes classed by kind, innermost loops found, and the mix of real PTX that
the installed Triton compiles for an H100/H200 (sm_90) with no GPU here (compiling needs none; a fresh process, as
other test files set TRITON_INTERPRET=1, under which @triton.jit compiles nothing)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuspeed.kernel import instructions, verdict

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("opcode,kind", [
    ("fma.rn.f64", "fp64"), ("setp.le.f64", "fp64"), ("mul.f64", "fp64"), ("add.rn.f32", "fp32"),
    ("ex2.approx.ftz.f32", "fp32"), ("fma.rn.bf16x2", "fp16/bf16"), ("add.s32", "integer/logic"),
    ("and.b32", "integer/logic"), ("shr.u32", "integer/logic"), ("and.pred", "predicate logic"),
    ("selp.f64", "select"), ("popc.b32", "bit counting"), ("vote.sync.ballot.b32", "warp vote"),
    ("shfl.sync.bfly.b32", "warp shuffle"), ("cvt.rzi.s32.f64", "conversion"), ("ld.global.v4.b32", "global memory"),
    ("ld.global.nc.b64", "global memory"), ("st.shared.b32", "shared memory"), ("ld.local.u32", "local memory"),
    ("ld.param.b64", "move"), ("atom.shared.add.u32", "shared atomic"), ("atom.relaxed.sys.shared.add.u32",
                                                                           "shared atomic"),
    ("atom.global.gpu.acq_rel.add.u64", "global atomic"), ("red.global.add.f32", "global atomic"),
    ("bar.sync", "barrier"), ("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "tensor core"),
    ("bra.uni", "branch"), ("mov.u32", "move"), ("cp.async.cg.shared.global", "shared memory"),
    ("griddepcontrol.wait", "other"), ("neg.f64", "move"), ("abs.ftz.f32", "move"), ("neg.s32", "integer/logic"),
])
def test_kind_of(opcode, kind):
    assert instructions.kind_of(opcode) == kind


NESTED = """
.visible .entry k(
)
{
	.reg .b32 	%r<9>;
	mov.u32 	%r1, 0;
$L__BB0_1:                              // outer
	add.s32 	%r2, %r2, 1;
$L__BB0_2:                              // inner
	fma.rn.f64 	%fd1, %fd1, %fd2, %fd3;
	fma.rn.f64 	%fd1, %fd1, %fd2, %fd3;
	vote.sync.ballot.b32 	%r3, %p1, -1;
	@%p2 bra 	$L__BB0_2;
	shl.b32 	%r4, %r4, 1;
	@%p3 bra 	$L__BB0_1;
	bra.uni 	$L__BB0_4;
$L__BB0_4:
	st.global.b32 	[%rd1], %r4;
	@%p4 bra 	$L__BB0_4;
	ret;
}
"""


def test_mix_counts_the_innermost_loop_only():
    # the outer loop holds the inner one (not innermost); a forward branch is no loop; the store loop is a second one
    assert len(instructions.innermost_loops(NESTED)) == 2
    m = instructions.mix(NESTED)  # the larger of the two: the fma loop, not the 2-instruction store loop
    assert m["scope"] == "largest innermost loop" and m["loops"] == 2
    assert m["kinds"] == {"fp64": 2, "warp vote": 1, "branch": 1}  # the predicated branch counts, its @%p is dropped
    assert m["shares"]["fp64"] == pytest.approx(0.5)
    assert instructions.summary(m) == "fp64 50 %, warp vote 25 %, branch 25 %"
    flat = instructions.mix(NESTED.replace("@%p2 bra 	$L__BB0_2;", "").replace("@%p3 bra 	$L__BB0_1;", "")
                            .replace("@%p4 bra 	$L__BB0_4;", ""))
    assert flat["scope"] == "whole kernel (no loop)" and flat["kinds"]["global memory"] == 1
    assert instructions.mix("") is None and instructions.mix(None) is None
    assert instructions.ptx_of(None, "triton") is None


def test_own_work_verdict_names_the_mix_and_the_triton_lever():
    la = {"kernel": "k", "backend": "triton", "grid": [2112, 1, 1], "num_warps": 4, "threads_per_block": 128,
          "registers": 56, "spills": 0, "occupancy": {"pct": 56.25, "limiter": "registers", "blocks_per_sm": 4,
                                                      "active_warps_per_sm": 36, "max_warps_per_sm": 64},
          "instruction_mix": {"scope": "largest innermost loop", "loops": 1, "instructions": 100,
                              "kinds": {}, "shares": {"integer/logic": 0.62, "fp64": 0.10, "warp vote": 0.09,
                                                      "bit counting": 0.08, "move": 0.05, "select": 0.06}}}
    facts = {"gpu": True, "launches": [la], "main": la, "sms": 132, "pct_of_roof": 43.0, "bound": "memory",
             "roof": "copy", "time_s": 2e-4, "occupancy_pct": 56.25, "limiter": "registers", "copy_pct": 94.0,
             "triton_version": "3.6.0"}
    rule, said, lever = verdict.judge(facts)
    assert rule == "own_work"
    assert said.endswith("its loop body (PTX): integer/logic 62 %, fp64 10 %, warp vote 9 %, bit counting 8 %, "
                         "select 6 %")
    assert "hardware counters" not in said
    assert "Triton 3.7 and later" in lever and "warp ballots are 9 % of its loop" in lever
    assert "inline PTX" in lever  # where Triton cannot be upgraded (the H200 machine's 3.6)
    # a Triton that already counts with shared atomics, a Numba kernel, or a loop with few ballots: no upgrade advice
    for change in ({"triton_version": "3.9.0"}, {"triton_version": "3.10.1"}, {"triton_version": None}):
        assert "Triton 3.7" not in verdict.judge({**facts, **change})[2]
    numba = dict(la, backend="numba")
    assert "Triton 3.7" not in verdict.judge({**facts, "launches": [numba], "main": numba})[2]
    few = dict(la, instruction_mix=dict(la["instruction_mix"], shares={"integer/logic": 0.9, "warp vote": 0.02}))
    assert "Triton 3.7" not in verdict.judge({**facts, "launches": [few], "main": few})[2]
    # without a mix the verdict says what it cannot tell
    bare = dict(la, instruction_mix=None)
    assert "hardware counters" in verdict.judge({**facts, "launches": [bare], "main": bare})[1]


COMPILE = textwrap.dedent('''
    import json, sys
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gpuspeed.kernel import instructions

    @triton.jit
    def horner(x_ptr, out_ptr, n, STEPS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        acc = x
        for _ in range(STEPS):  # a constexpr count: unrolled, so STEPS=1 leaves no loop in the PTX
            acc = acc * x + 0.5
        tl.store(out_ptr + offs, acc, mask=offs < n)

    @triton.jit
    def hist(x_ptr, out_ptr, n, BINS: tl.constexpr, BLOCK: tl.constexpr):
        acc = tl.zeros((BINS,), dtype=tl.int32)
        for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n, other=0)
            acc += tl.histogram(x, BINS)
        tl.atomic_add(out_ptr + tl.arange(0, BINS), acc)

    def ptx(fn, sig, const):
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4, "num_stages": 1})
        return k.asm["ptx"]

    out = {"version": triton.__version__}
    p = ptx(horner, {"x_ptr": "*fp64", "out_ptr": "*fp64", "n": "i32", "STEPS": "constexpr", "BLOCK": "constexpr"},
            {"STEPS": 1, "BLOCK": 256})
    out["horner"] = instructions.mix(p)
    p = ptx(hist, {"x_ptr": "*i32", "out_ptr": "*i32", "n": "i32", "BINS": "constexpr", "BLOCK": "constexpr"},
            {"BINS": 256, "BLOCK": 1024})
    out["hist"] = instructions.mix(p)
    print(json.dumps(out))
''')


def compile_for_sm90(tmp_path, source: str) -> dict:
    """Runs a script that compiles Triton kernels for sm_90 in a fresh process (no TRITON_INTERPRET) and returns the
    JSON it prints last; skips where this Triton cannot compile for sm_90 here."""
    pytest.importorskip("triton")
    script = tmp_path / "compile_sm90.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                         cwd=tmp_path)
    if run.returncode != 0:
        if "GPUTarget" in run.stderr or "ptxas" in run.stderr.lower():
            pytest.skip("this Triton cannot compile for sm_90 here: " + run.stderr.strip().splitlines()[-1])
        raise AssertionError(run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_mix_of_ptx_the_installed_triton_compiles(tmp_path):
    got = compile_for_sm90(tmp_path, COMPILE)
    horner = got["horner"]
    assert horner["scope"] == "whole kernel (no loop)"  # STEPS=1: no loop left
    assert horner["kinds"].get("fp64", 0) >= 1 and horner["kinds"]["global memory"] >= 1
    hist = got["hist"]
    assert hist["scope"] == "largest innermost loop" and hist["loops"] >= 1
    major, minor = (int(x) for x in got["version"].split(".")[:2])
    if (major, minor) >= (3, 7):  # triton-lang/triton#9517: one shared-memory atomic per element
        # (3.7.1 still ballots beside its atomics: 64 warp votes and 8 shared atomics in this loop; 3.9 has none)
        assert hist["kinds"].get("shared atomic", 0) >= 1
    else:  # ballots and popc per element
        assert hist["kinds"]["warp vote"] >= 8 and hist["kinds"]["bit counting"] >= 8


def test_compute_bound_verdict_counts_the_fmas():
    # the H200 mandelbrot at 64x its pixels: 8 fp64 instructions a step, 3 of them FMAs, full occupancy
    mix = {"scope": "largest innermost loop", "loops": 1, "instructions": 15,
           "kinds": {"fp64": 8, "select": 3, "integer/logic": 3, "branch": 1},
           "shares": {"fp64": 8 / 15, "select": 0.2, "integer/logic": 0.2, "branch": 1 / 15}, "fma": {"fp64": 3}}
    la = {"kernel": "k", "backend": "triton", "grid": [1280, 15, 1], "num_warps": 4, "threads_per_block": 128,
          "registers": 26, "spills": 0, "occupancy": {"pct": 100.0, "limiter": "warps", "blocks_per_sm": 16,
                                                      "active_warps_per_sm": 64, "max_warps_per_sm": 64},
          "instruction_mix": mix}
    facts = {"gpu": True, "launches": [la], "main": la, "sms": 132, "pct_of_roof": 28.0, "bound": "compute",
             "roof": "fp64", "time_s": 1e-4, "occupancy_pct": 100.0, "limiter": "warps", "copy_pct": None}
    rule, said, lever = verdict.judge(facts)
    assert rule == "compute_mix"
    assert said.startswith("compute-bound at 28 % of the fp64 roof with 100 % occupancy; its loop body (PTX): fp64 53 %")
    assert said.endswith("3 of its 8 fp64 instructions are FMAs (the roof counts each as an FMA's 2 flops)")
    assert "FMA wherever" in lever and "loads in flight" not in lever
    # no instruction of the roof's precision in the loop, a memory-bound kernel, or no mix: the latency rule as before
    assert verdict.judge({**facts, "roof": "fp32"})[0] == "latency"
    assert verdict.judge({**facts, "bound": "memory", "roof": "copy"})[0] == "latency"
    bare = dict(la, instruction_mix=None)
    assert verdict.judge({**facts, "launches": [bare], "main": bare})[0] == "latency"
    assert verdict.judge({**facts, "pct_of_roof": 60.0})[0] == "tune"


HISTOGRAM = textwrap.dedent('''
    import json, os, subprocess
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gpuspeed.examples.hand_kernels import histogram as H
    from gpuspeed.kernel import instructions

    sig = {"x_ptr": "*fp64", "edges_ptr": "*fp64", "range_ptr": "*fp64", "out_ptr": "*i64", "n": "i32", "bins": "i32",
           "BINS": "constexpr", "ARITH": "constexpr", "SMEM": "constexpr", "BLOCK": "constexpr", "PER_SM": "constexpr"}
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    out = {}
    for bins in (256, 1024, 8):
        k = triton.compile(ASTSource(fn=H.histogram_kernel.fn, signature=sig, constexprs={
            "BINS": bins, "ARITH": True, "SMEM": True, "BLOCK": 2048, "PER_SM": 16}), target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4, "num_stages": 1, "enable_fp_fusion": False})
        ptx = k.asm["ptx"]
        row = {"decl": ptx.count(".shared .align 16 .b32 gpuspeed_counts["), "red": ptx.count("red.shared.add.u32"),
               "ballot": ptx.count("vote.sync.ballot"), "dynamic": k.metadata.shared,
               "mix": instructions.mix(ptx)["kinds"], "static": None}
        if os.path.exists(tool):
            with open("h.cubin", "wb") as f:
                f.write(k.asm["cubin"])
            usage = subprocess.run([tool, "--dump-resource-usage", "h.cubin"], capture_output=True, text=True).stdout
            row["static"] = int(usage.split("SHARED:")[1].split()[0])
        out[bins] = row
    print(json.dumps(out))
''')


def test_histogram_counts_in_shared_memory_through_inline_ptx(tmp_path):
    # the Triton histogram's GPU path: Triton 3.6 lowers tl.histogram to warp ballots, so the kernel declares its own
    # shared-memory counts in inline PTX and bumps them with one red.shared per sample; ptxas must take that PTX
    # (one declaration however the code is unrolled) and the array must be in the cubin's static shared memory
    got = compile_for_sm90(tmp_path, HISTOGRAM)
    for bins, words in (("256", 1024), ("1024", 4096), ("8", 1024)):
        row = got[bins]
        assert row["decl"] == 1, row
        assert row["red"] >= 16 and row["ballot"] == 0, row  # 2048 samples over 128 threads: 16 bumps a thread
        assert row["mix"].get("shared atomic", 0) >= 16 and "warp vote" not in row["mix"]
        if row["static"] is not None:
            assert row["static"] >= 4 * words, row  # Triton's metadata.shared does not hold it


def test_mix_counts_each_statement_of_an_inline_ptx_line():
    # inline PTX (tl.inline_asm_elementwise) puts a block of statements on one line: each is an instruction
    ptx = "\n".join(["$L__BB0_1:",
                     "\t{ .reg .pred p; .reg .u32 a; setp.ge.s32 p, %r25, 0; mov.u32 a, cnt; "
                     "@p red.shared.add.u32 [a], 1; mov.u32 %r24, 0; }",
                     "\tadd.f64 \t%fd1, %fd2, %fd3; // a comment; with a semicolon",
                     "\t@%p1 bra \t$L__BB0_1;"])
    m = instructions.mix(ptx)
    assert m["scope"] == "largest innermost loop"
    assert m["kinds"] == {"move": 2, "integer/logic": 1, "shared atomic": 1, "fp64": 1, "branch": 1}
