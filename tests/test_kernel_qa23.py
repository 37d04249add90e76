"""QA pass 23 on `gpuspeed kernel`: the bytes of a launcher that runs one kernel several times over the same buffers
(kernel/chunks.py). Launches that together cover a buffer in parts (a chunked launcher) count it once; launches that
each cover all of it (sweeps: two steps of an iteration) count it each time; where their sizes tell neither, each is
counted and the report says so."""

import numpy as np
import pytest
from kernel_cli_helpers import run_script


def _launches(grids, block, offsets, x, o, meta_name="BLOCK"):
    """The Launch records a Triton launcher of `kern(x, o, start, n, BLOCK)` makes, one per grid, as Capture takes
    them (its arguments' bytes and layout)."""
    from gpuspeed.kernel.capture import Launch, arg_bytes
    from gpuspeed.kernel.chunks import layout

    return [Launch(kernel="kern", backend="triton", grid=[g, 1, 1], meta={meta_name: block},
                   arg_bytes=arg_bytes([x, o, start, x.size, block]),
                   layout=layout(zip(("x", "o", "start", "n", meta_name), (x, o, start, x.size, block), strict=True),
                                 {meta_name}))
            for g, start in zip(grids, offsets, strict=True)]


def _buffers(n):
    rng = np.random.default_rng(23)
    return rng.standard_normal(n).astype(np.float32), np.empty(n, np.float32)


def test_two_sweeps_over_a_buffer_of_whole_blocks_count_it_twice():
    # two launches of one kernel over all of x and o (an iteration index, or another alpha), n a multiple of BLOCK:
    # their sizes (n each) were within "the buffer + one launch" of the buffer, so they were taken for two chunks and
    # the 2 x 8n bytes they move counted as 8n: the % of roof read half what it is
    from gpuspeed.kernel.report import call_bytes

    n = 64 * 16
    x, o = _buffers(n)
    nbytes, how = call_bytes(None, 8 * n, _launches([16, 16], 64, [0, 1], x, o))
    assert nbytes == 2 * 8 * n, (nbytes, how)
    assert "in parts" not in how, how


def test_launches_covering_a_fraction_of_the_buffer_are_not_said_to_cover_it_in_parts():
    # a grid-stride kernel launched twice on a fixed grid of 128 threads over 1024 elements: each call is a sweep, but
    # their sizes (256 in all) added up to "no more than the buffer", so the report said they cover its 1024
    # elements in parts and counted the buffers once; nothing shows that: each is counted, and --bytes is named
    from gpuspeed.kernel.report import call_bytes

    n = 1024
    x, o = _buffers(n)
    nbytes, how = call_bytes(None, 8 * n, _launches([2, 2], 64, [0, 1], x, o))
    assert nbytes == 2 * 8 * n, (nbytes, how)
    assert "in parts" not in how and "--bytes" in how, how


def test_chunks_whose_masked_blocks_overhang_are_counted_each_time_and_said():
    # 4 chunks of 150 rows of 600 columns, one program a row of BLOCK 1024 lanes (the rest masked off): their sizes
    # (600 x 1024 lanes) pass the buffer's 360000 elements by more than one launch's, so they were taken for sweeps and
    # counted 4 times without a word; it cannot be told from their sizes: counted each time, and said
    from gpuspeed.kernel.report import call_bytes

    rows, cols = 600, 600
    x, o = _buffers(rows * cols)
    nbytes, how = call_bytes(None, 8 * rows * cols, _launches([150] * 4, 1024, [0, 150, 300, 450], x, o))
    assert nbytes == 4 * 8 * rows * cols, (nbytes, how)
    assert "--bytes" in how, how


def test_chunks_and_sweeps_as_they_were():
    # what chunks.py told apart right stays so: 4 chunks of 256 over 1000 elements count once; 3 sweeps each
    from gpuspeed.kernel.report import FLOOR, call_bytes

    n = 1000
    x, o = _buffers(n)
    nbytes, how = call_bytes(None, 8 * n, _launches([4] * 4, 64, [0, 256, 512, 768], x, o))
    assert nbytes == 8 * n and how.startswith(FLOOR) and "4 launches of kern cover" in how, (nbytes, how)
    assert call_bytes(None, 8 * n, _launches([16] * 3, 64, [0, 1, 2], x, o)) == (
        3 * 8 * n, "each of its 3 launches moving its array arguments once")


TWO_STEPS = """
    import numpy as np
    import torch
    import triton
    import triton.language as tl

    from gpuspeed.kernel.capture import Capture
    from gpuspeed.kernel.report import call_bytes


    @triton.jit
    def axpy(x, y, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y + offs, tl.load(y + offs, mask=m) + a * tl.load(x + offs, mask=m), mask=m)


    def two_steps(x, y):  # y += 0.5 x, then y += 0.25 x: two sweeps over both buffers
        for a in (0.5, 0.25):
            axpy[(triton.cdiv(x.numel(), 128),)](x, y, a, x.numel(), BLOCK=128)
        return y


    x, y = torch.ones(1024), torch.zeros(1024)
    with Capture() as cap:
        two_steps(x, y)
    print(call_bytes(None, 2 * 4096, cap.launches)[0])
    """


def test_a_captured_two_step_launcher_counts_both_steps(tmp_path):
    pytest.importorskip("triton")
    r = run_script(tmp_path, TWO_STEPS)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == str(2 * 2 * 4096), r.stdout


def test_one_kernel_run_on_a_buffer_and_on_its_first_half_counts_each_run_unsaid():
    # kern(x, o) then kern(x[:500], o2), each grid covering all it is handed: 12000 bytes move; their sizes (1024 +
    # 512) were taken for parts of x's 1000 elements and the union (10000) counted, said to "cover in parts"
    from gpuspeed.kernel.report import call_bytes

    n = 1000
    x, o = _buffers(n)
    o2 = np.empty(n // 2, np.float32)
    runs = _launches([8], 128, [0], x, o) + _launches([4], 128, [0], x[: n // 2], o2)
    nbytes, how = call_bytes(None, 10 * n, runs)
    assert nbytes == 12 * n, (nbytes, how)
    assert how == "each of its 2 launches moving its array arguments once", how


SCALE = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


    def double(x):
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        return out
    """


def test_a_scalar_input_where_a_tensor_belongs_is_not_blamed_on_the_array_library(tmp_path):
    # --input x=float:2.0 to a launcher of a tensor: the error said "its --input arrays were torch arrays ...:
    # --backend numpy for NumPy arrays", though no array was made and no --backend would help
    from kernel_cli_helpers import kernel_cli, one_error

    line = one_error(kernel_cli(tmp_path, {"scale.py": SCALE}, "scale.py:double", "--input", "x=float:2.0"))
    assert "double raised TypeError" in line and "--backend" not in line, line


TWO_STEP_LAUNCHER = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def axpy(x, y, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y + offs, tl.load(y + offs, mask=m) + a * tl.load(x + offs, mask=m), mask=m)


    def three_steps(x, y):  # three launches of one geometry: one row of three
        for a in (0.5, 0.5, 0.25):
            axpy[(triton.cdiv(x.numel(), 128),)](x, y, a, x.numel(), BLOCK=128)
        return y
    """


def test_json_gives_the_launch_counts_the_human_output_gives(tmp_path):
    # the human output said "launches: 3 in one call, 1 distinct"; --json had neither number, only per-row counts
    import json

    from kernel_cli_helpers import kernel_cli

    files = {"steps.py": TWO_STEP_LAUNCHER}
    args = ("steps.py:three_steps", "--input", "x=float32[1000]", "--input", "y=float32[1000]")
    human = kernel_cli(tmp_path, files, *args)
    assert human.returncode == 0, human.stderr[-2000:]
    assert "launches: 3 in one call, 1 distinct" in human.stdout, human.stdout
    r = kernel_cli(tmp_path, files, *args, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["launch_count"] == 3 and d["distinct_launches"] == 1, {k: d.get(k) for k in ("launch_count", "launches")}
