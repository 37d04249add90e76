"""QA pass 21 on `gpuspeed kernel FILE.py:NAME`: names that miss, a --ceilings that names a folder, Triton programs
that race, a bfloat16 tensor handed to a Numba kernel, and (library and GPU) what a launcher returning no array
updates in place. The CLI cases run in one child process (a `python -m gpuspeed` costs seconds of imports) made once
for the file: the command in-process, once per case, with the interpreters on; each test reads its cases' results."""

import textwrap

import pytest
from kernel_cli_helpers import kernel_cli_runs, one_error

LAUNCHERS = """
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


    def quadruple(x):
        return double(double(x))


    class Launchers:
        @staticmethod
        def doubled(x):
            return double(x)
    """

RACES = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def racy_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        acc = tl.load(out_ptr)  # every program reads the running sum and writes it back: a GPU loses updates
        tl.store(out_ptr, acc + tl.sum(v))


    @triton.jit
    def atomic_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0)))


    @triton.jit
    def smooth_in_place(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = (offs > 0) & (offs < n - 1)
        left, right = tl.load(x_ptr + offs - 1, mask=m), tl.load(x_ptr + offs + 1, mask=m)
        tl.store(x_ptr + offs, (left + right) * 0.5, mask=m)  # a neighbour program's edge reads it


    @triton.jit
    def any_positive(x_ptr, flag_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        hit = tl.max((tl.load(x_ptr + offs, mask=offs < n, other=-1.0) > 0).to(tl.int32))
        if hit > 0:
            tl.store(flag_ptr, 1)  # one value stored by many programs: no race


    @triton.jit
    def partial_sums(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(part_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0)))


    @triton.jit
    def total(part_ptr, out_ptr, m, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr, tl.sum(tl.load(part_ptr + offs, mask=offs < m, other=0.0)))


    def grid(x):
        return (triton.cdiv(x.numel(), 64),)


    def racy(x):
        out = torch.zeros(1, dtype=x.dtype)
        racy_sum[grid(x)](x, out, x.numel(), BLOCK=64)
        return out


    def atomic(x):
        out = torch.zeros(1, dtype=x.dtype)
        atomic_sum[grid(x)](x, out, x.numel(), BLOCK=64)
        return out


    def smooth(x):
        smooth_in_place[grid(x)](x, x.numel(), BLOCK=64)
        return x


    def flag(x):
        f = torch.zeros(1, dtype=torch.int32)
        any_positive[grid(x)](x, f, x.numel(), BLOCK=64)
        return f


    def two_pass(x):  # the second launch reads what the first wrote: launches are ordered
        part, out = torch.empty(grid(x)[0], dtype=x.dtype), torch.empty(1, dtype=x.dtype)
        partial_sums[grid(x)](x, part, x.numel(), BLOCK=64)
        total[(1,)](part, out, part.numel(), BLOCK=triton.next_power_of_2(part.numel()))
        return out
    """

NUMBA_TORCH = """
    import torch
    from numba import cuda


    @cuda.jit
    def twice(a, out):
        i = cuda.grid(1)
        if i < a.size:
            out[i] = a[i] * 2


    def launch(a):
        out = torch.empty_like(a)
        twice[(a.numel() + 31) // 32, 32](a, out)
        return out
    """

FILES = {"launchers.py": LAUNCHERS, "folder/roofline.json": "{}", "races.py": RACES, "numba_torch.py": NUMBA_TORCH}
X = ("--input", "x=float32[100]")
CASES = {
    "far name": ("launchers.py:triple", *X),
    "far name in a class": ("launchers.py:Launchers.tripled", *X),
    "ceilings folder": ("launchers.py:double", *X, "--ceilings", "folder"),
    **{f"race {name}": (f"races.py:{name}", "--input", "x=float32[300]") for name in (
        "racy", "atomic", "smooth", "flag", "two_pass")},
    **{f"numba {dtype}": ("numba_torch.py:launch", "--input", f"a={dtype}[40]") for dtype in ("bfloat16", "float16")},
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict:
    """Every case run as `gpuspeed kernel ARGV --device cpu` in one child process with the interpreters on:
    case -> a CompletedProcess-like result (returncode, stdout, stderr)."""
    here = tmp_path_factory.mktemp("kernel_qa21")
    for name, text in FILES.items():
        (here / name).parent.mkdir(parents=True, exist_ok=True)
        (here / name).write_text(textwrap.dedent(text))
    runs = [[*argv, "--device", "cpu"] for argv in CASES.values()]
    return dict(zip(CASES, kernel_cli_runs(here, runs, timeout=600), strict=True))


def test_a_name_close_to_none_says_which_launchers_the_file_has(cli):
    # `launchers.py:triple` said only "launchers.py has no 'triple'": no launcher is named close to it, and the user
    # was left to open the file; the launchers it defines are named (not its kernel, nor imported modules)
    line = one_error(cli["far name"])
    assert "launchers.py has no 'triple'" in line, line
    assert "launchers.py:double" in line and "launchers.py:quadruple" in line, line
    assert "scale_kernel" not in line and "Launchers" not in line.split("no 'triple'")[1], line


def test_a_name_missing_from_a_class_says_what_the_class_holds(cli):
    # `Launchers.tripled` said "launchers.py has no 'Launchers.tripled'", with no word of Launchers.doubled
    line = one_error(cli["far name in a class"])
    assert "launchers.py:Launchers.doubled" in line, line


def test_ceilings_naming_a_folder_is_not_said_to_be_missing(cli):
    # `--ceilings folder` (where `gpuspeed roofline --out folder` wrote folder/roofline.json) said "ceilings file
    # folder does not exist": it does, as a folder; the line now says so and names the roofline.json inside it
    line = one_error(cli["ceilings folder"])
    assert "does not exist" not in line and "folder" in line, line
    assert "folder/roofline.json" in line, line


# --- a launcher that returns no array: what it writes into its arguments, read and written or only written

def _in_place_scale(x):
    x.mul_(2.5)


def _scale_into(x, out):
    torch = pytest.importorskip("torch")
    torch.mul(x, 2.5, out=out)


def _accumulate(x, out):
    out.add_(x)


def _fill(out):
    out.fill_(7.0)


def _first_half(x, out):
    out[: out.shape[0] // 2] = x[: out.shape[0] // 2] * 2  # the other half untouched, neither read nor written


def test_the_arguments_a_call_reads_and_writes_are_measured_on_copies():
    # a launcher returning None was counted its arguments once (inputs read once + no output): an in-place x *= 2.5
    # at full bandwidth sat at half of the copy roof; which arguments it also reads is now measured on copies
    torch = pytest.importorskip("torch")
    import numpy as np

    from gpuspeed.kernel.traffic import read_and_written, read_and_written_bytes

    g = torch.Generator().manual_seed(21)
    x, out = torch.randn(37, generator=g), torch.randn(37, generator=g)
    kept_x, kept_out = x.clone(), out.clone()
    assert read_and_written(_in_place_scale, (x,), {})[0] is x
    assert read_and_written(_scale_into, (x, out), {}) == []  # out= only written
    assert read_and_written(_accumulate, (x, out), {})[0] is out  # out += x reads out
    assert read_and_written(_fill, (out,), {}) == []
    assert read_and_written(_first_half, (x, out), {}) == []
    assert read_and_written(_accumulate, (), {"x": x, "out": out})[0] is out  # by keyword too
    assert read_and_written(_in_place_scale, (x[::2],), {})[0].shape == (19,)
    assert torch.equal(x, kept_x) and torch.equal(out, kept_out)  # the arguments themselves are left as they were
    assert read_and_written_bytes(_accumulate, (x, x), {}) == 37 * 4  # one tensor passed twice: its memory once
    flags = torch.rand(16, generator=g) > 0.5
    assert read_and_written_bytes(torch.Tensor.logical_not_, (flags,), {}) == 16
    perm = torch.randperm(20, generator=g)  # an index array updated in place: its values stay valid indices
    assert read_and_written_bytes(lambda p: p.copy_(p[p]), (perm,), {}) == 20 * 8
    a = np.random.default_rng(21).standard_normal(11)
    assert read_and_written_bytes(np.negative, (a,), {"out": a}) == 88  # NumPy: one array as input and out=


IN_PLACE_TRITON = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.5, mask=m)


    @triton.jit
    def accumulate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=m) + tl.load(x_ptr + offs, mask=m), mask=m)


    def grid(x):
        return (triton.cdiv(x.numel(), 1024),)


    def in_place(x):
        scale_kernel[grid(x)](x, x, x.numel(), BLOCK=1024)


    def into(x, out):
        scale_kernel[grid(x)](x, out, x.numel(), BLOCK=1024)


    def accumulate(x, out):
        accumulate_kernel[grid(x)](x, out, x.numel(), BLOCK=1024)


    def returning(x):
        scale_kernel[grid(x)](x, x, x.numel(), BLOCK=1024)
        return x
    """


@pytest.mark.gpu
def test_on_a_gpu_a_launcher_returning_none_counts_what_it_updates_in_place_twice(tmp_path):
    import importlib.util

    import torch

    from gpuspeed import kernel_report

    (tmp_path / "in_place_launchers.py").write_text(textwrap.dedent(IN_PLACE_TRITON))
    spec = importlib.util.spec_from_file_location("in_place_launchers", tmp_path / "in_place_launchers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    n = (1 << 24) + 5
    x, out = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    quick = {"budget_s": 0.5}
    cases = {"in_place": ((x.clone(),), 2), "into": ((x, out.clone()), 2), "accumulate": ((x, out.clone()), 3),
             "returning": ((x.clone(),), 2)}
    for name, (args, arrays) in cases.items():
        rep = kernel_report(getattr(mod, name), *args, bench_kw=quick)
        assert rep.placement["bytes"] == arrays * 4 * n, (name, rep.placement["bytes"], rep.placement["bytes_source"])
        assert ("in place" in rep.placement["bytes_source"]) == (name in ("in_place", "accumulate")), name


def test_programs_of_one_triton_launch_that_race_are_refused_under_the_interpreter(cli):
    # `acc = tl.load(out); tl.store(out, acc + tl.sum(v))` from every program, and an in-place stencil whose
    # programs read their neighbours' edges, ran under the interpreter (one program after another) and were said to
    # run and return; on a GPU the programs run at once and the sum loses updates. Refused now, as the CUDA
    # simulator refuses threads of two blocks that race on an array argument
    line = one_error(cli["race racy"])
    assert "racy_sum: a data race between programs on out_ptr[0]" in line and "tl.atomic_add" in line, line
    line = one_error(cli["race smooth"])
    assert "smooth_in_place: a data race between programs on x_ptr[" in line and "reads it" in line, line


def test_atomics_one_flag_value_and_two_launches_are_no_race(cli):
    for case in ("race atomic", "race flag", "race two_pass"):
        r = cli[case]
        assert r.returncode == 0 and "race" not in r.stderr, (case, r.stderr[-2000:])
        assert "verdict: ran under the interpreters" in r.stdout, (case, r.stdout)


def test_a_bfloat16_tensor_handed_to_a_numba_kernel_is_refused_in_words(cli):
    # the simulator was handed the bf16 tensor itself (NumPy has no view of it) and failed at `i < a.size` with
    # "'<' not supported between instances of 'int' and 'builtin_function_or_method'", then advised --backend numpy,
    # whose arrays have no bfloat16 either
    line = one_error(cli["numba bfloat16"])
    assert "twice: argument a is a torch.bfloat16 tensor" in line and "float32 or float16" in line, line
    assert "--backend" not in line and "builtin_function" not in line, line
    # an H100's numba-cuda launched a kernel on a bf16 tensor without an error (db263c5): the refusal is the
    # simulator's, and says so
    assert "under the CUDA simulator" in line and "refuses on a GPU" not in line, line
    r = cli["numba float16"]
    assert r.returncode == 0 and "verdict: ran under the interpreters" in r.stdout, r.stderr[-2000:]
