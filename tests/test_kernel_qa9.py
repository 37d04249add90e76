"""`gpuspeed kernel` QA, round 9: a user's own Triton launchers under the interpreter (an unmasked store past the
end, the masked ones beside it) and the occupancy formula against hand-computed cases for an RTX 4070 (sm_89),
an RTX 30xx (sm_86) and an H100/H200 (sm_90).

The interpreted launchers run in a fresh process (`python -m gpuspeed kernel ... --device cpu`): the interpreters
must be on before Triton defines the kernels.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuspeed.kernel.occupancy import KNOWN, known_limits, occupancy

ROOT = Path(__file__).resolve().parents[1]

LAUNCHERS = '''
import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def scale(x, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(o + offs, tl.load(x + offs, mask=m, other=0.0) * 2.0, mask=m)


@triton.jit
def scale_unmasked_store(x, o, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n, other=0.0)
    tl.store(o + offs, v * 2.0)  # no mask: the last program writes past the end of o


def masked(x):
    o = torch.empty_like(x)
    scale[(triton.cdiv(x.numel(), 1024),)](x, o, x.numel(), BLOCK=1024)
    return o


def unmasked(x):
    o = torch.empty_like(x)
    scale_unmasked_store[(triton.cdiv(x.numel(), 1024),)](x, o, x.numel(), BLOCK=1024)
    return o


def wrapped(x):  # the launcher catches and re-raises: the cause is still named
    try:
        return unmasked(x)
    except Exception as exc:
        raise RuntimeError("my launcher failed") from exc


def original(x):
    return 2.0 * x


masked.gpuspeed_inputs = unmasked.gpuspeed_inputs = wrapped.gpuspeed_inputs = "torch"
variants = {"masked": masked, "unmasked": unmasked}
TOLERANCE = dict(rtol=1e-6, atol=0.0)


def inputs(rng):
    return (rng.standard_normal(127).astype(np.float32),)
'''


def _kernel_cli(tmp_path, target, *extra):
    pytest.importorskip("triton")
    f = tmp_path / "user_kernels.py"
    f.write_text(LAUNCHERS)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    return subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", f"{f}:{target}", "--device", "cpu", *extra],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("target", ["unmasked", "wrapped", "variants.unmasked"])
def test_an_unmasked_store_past_the_end_is_one_line_not_a_heap_corruption(tmp_path, target):
    # the Triton interpreter stores through raw host pointers: 897 floats written past a 127-float tensor corrupted
    # the heap, and the command died with glibc's "double free or corruption (!prev)" (exit 134, no report), or
    # passed with the verdict "an unmasked load or store past an array goes unseen"
    r = _kernel_cli(tmp_path, target)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert len(errors) == 1, r.stderr[-2000:]
    assert "scale_unmasked_store: a tl.store" in errors[0] and "outside every tensor argument" in errors[0]
    assert "program_id (0, 0, 0)" in errors[0] and "Traceback" not in r.stderr


def test_a_masked_kernel_passes_the_bounds_check_and_its_json_says_so(tmp_path):
    # the masked lanes' addresses run past the end too (BLOCK 1024 over 127 floats): only live lanes are held
    r = _kernel_cli(tmp_path, "variants.masked", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["check"]["passed"] is True and d["launches"][0]["grid"] == [1, 1, 1]
    assert d["rule"] == "no_gpu" and "does not check bounds" not in d["verdict"]
    r = _kernel_cli(tmp_path, "masked")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "its loads and stores inside its arrays (nothing checked its output)" in r.stdout


# --- occupancy by NVIDIA's formula (CUDA occupancy calculator / cuda_occupancy.h): registers allocated per warp
# in units of 256, in 4 sub-partitions of 16384; shared memory per block + 1 KB reserved, rounded to 128 B
ADA, AMPERE, HOPPER = KNOWN["8.9"], KNOWN["8.6"], KNOWN["9.0"]


@pytest.mark.parametrize("limits,threads,regs,smem,blocks,limiter", [
    # RTX 4070 (sm_89): 48 warps, 24 blocks, 64K registers, 100 KB shared per SM (99 KB per block)
    (ADA, 32, 16, 0, 24, "blocks"),               # 24 one-warp blocks: 24 of 48 warps
    (ADA, 64, 32, 0, 24, "warps"),                # 24 x 2 warps = 48: the warps and the block cap tie
    (ADA, 128, 64, 0, 8, "registers"),            # 2048 regs/warp: 8 per sub-partition = 32 warps = 8 blocks
    (ADA, 256, 40, 0, 6, "warps"),                # 1280 regs/warp: 12 per sub-partition = 48 warps // 8 = 6, tie
    (ADA, 96, 168, 0, 4, "registers"),            # 5376 regs/warp: 3 per sub-partition = 12 warps // 3 = 4
    (ADA, 128, 32, 32 * 1024, 3, "shared_memory"),  # 33 KB a block: 102400 // 33792 = 3
    (ADA, 128, 32, 49 * 1024 - 1024, 2, "shared_memory"),  # 48 KB + 1 KB reserved = 49 KB: 2 blocks
    (ADA, 128, 32, 99 * 1024, 1, "shared_memory"),  # the 99 KB opt-in maximum: 100 KB with the reserve, 1 block
    (ADA, 128, 32, 99 * 1024 + 1, 0, "shared_memory"),  # past the opt-in maximum: cannot launch
    (ADA, 1024, 32, 0, 1, "warps"),               # 32 warps of 48: 67 %
    (ADA, 768, 40, 0, 2, "warps"),                # 24 warps a block, 1280 regs/warp: 12 per sub-partition = 2
    (ADA, 1024, 65, 0, 0, "registers"),           # 2304/warp x 32 warps > 64K per block
    # RTX 30xx (sm_86): 16 blocks per SM, not 24
    (AMPERE, 32, 16, 0, 16, "blocks"),
    (AMPERE, 192, 32, 0, 8, "warps"),             # 6 warps a block: 48 // 6 = 8
    (AMPERE, 128, 32, 20 * 1024, 4, "shared_memory"),  # 21 KB a block: 102400 // 21504 = 4
    # H100 / H200 (sm_90): 64 warps, 32 blocks, 228 KB per SM
    (HOPPER, 128, 32, 100 * 1024, 2, "shared_memory"),  # 101 KB a block: 233472 // 103424 = 2
    (HOPPER, 128, 72, 0, 7, "registers"),         # 2304/warp: 7 per sub-partition = 28 warps // 4 = 7
    (HOPPER, 64, 24, 0, 32, "warps"),             # 32 x 2 warps = 64: all warps, the block cap ties
    (HOPPER, 128, 32, 227 * 1024, 1, "shared_memory"),  # the 227 KB opt-in maximum + 1 KB reserved: one block
])
def test_occupancy_matches_nvidias_formula(limits, threads, regs, smem, blocks, limiter):
    occ = occupancy(threads, regs, smem, limits)
    assert (occ["blocks_per_sm"], occ["limiter"]) == (blocks, limiter), occ
    warps = -(-threads // 32)
    assert occ["active_warps_per_sm"] == blocks * warps
    assert occ["pct"] == pytest.approx(100.0 * blocks * warps / limits.max_warps_per_sm)


@pytest.mark.parametrize("cc,threads,regs,smem,blocks,limiter", [
    # a T4 / RTX 20xx (sm_75): 32 warps and 16 blocks per SM, 64 KB shared, no reserve, 256 B units. The table
    # lacked it: on such a GPU without cupy the limits fell back to sm_90's 32 blocks and 1 KB reserve, so 32-thread
    # blocks read 100 % occupancy (32 blocks) where the hardware holds 16 (50 %)
    ("7.5", 32, 16, 0, 16, "blocks"),
    ("7.5", 128, 32, 16 * 1024, 4, "shared_memory"),  # 65536 // 16384 = 4 (3 with a 1 KB reserve)
    ("7.5", 32, 32, 1000, 16, "blocks"),            # 1000 B rounds to 1024: 64 would fit, the block cap holds 16
    ("7.0", 256, 64, 0, 4, "registers"),            # V100: 2048 regs/warp: 8 per sub-partition = 32 warps // 8
    ("8.7", 32, 16, 0, 16, "blocks"),               # Jetson Orin: 16 blocks, 48 warps
    ("12.0", 32, 16, 0, 32, "blocks"),              # RTX 50xx: 32 one-warp blocks of 48 warps
    ("12.0", 128, 32, 48 * 1024, 2, "shared_memory"),  # 100 KB per SM, 49 KB a block with the reserve
    ("10.0", 128, 32, 100 * 1024, 2, "shared_memory"),  # B200: 228 KB per SM, as sm_90
])
def test_occupancy_for_other_common_gpus_comes_from_the_table(cc, threads, regs, smem, blocks, limiter):
    limits = known_limits(f"sm_{cc.replace('.', '')}")
    assert limits is not None and limits.cc == cc
    occ = occupancy(threads, regs, smem, limits)
    assert (occ["blocks_per_sm"], occ["limiter"]) == (blocks, limiter), occ
    assert occ["pct"] == pytest.approx(100.0 * blocks * -(-threads // 32) / limits.max_warps_per_sm)
