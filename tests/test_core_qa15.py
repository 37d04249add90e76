"""QA round 15, core: the public API as a script or a notebook calls it (bench, check, peak_memory, results files read
back), and the CLI's JSON."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import gpuspeed


# -- check() on a large output: float64 work a chunk at a time -----------------------------------------------------

def test_check_of_a_large_array_holds_no_whole_array_float64_temporaries():
    # check() compared a whole leaf in float64 at once: ~86 bytes of temporaries an element (the guard assumed 40), so
    # a 400M-element output with 22 GiB free passed the guard and the OOM killer ended the process; and every fresh
    # temporary page-faulted in: 7 s for 20M elements. Now the comparison runs a chunk at a time.
    n = 2_000_000
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(n)
    out = ref.astype(np.float32)
    out[123_457] += 1.0  # one element far off: found, and placed, across chunks
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        r = gpuspeed.check(out, ref)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert not r.passed and r.n_over_tol == 1 and r.worst_index == (123_457,), r.summary
    assert peak < 4 * n, f"check() held {peak / n:.1f} bytes an element beyond its inputs"


# -- a roofline results file read back: a hand-edited ceiling is refused in one line, not a TypeError later ----------

def _cpu_roofline_doc(**edits) -> dict:
    """A roofline results document of this machine's CPU, as `gpuspeed roofline --json` writes one, with the ceiling
    rows' fields changed as given (name -> {field: value})."""
    import torch

    from gpuspeed.device import get_device

    info = get_device("cpu")
    rows = [{"section": "ceiling", "name": "copy", "kind": "memory", "value": 20.0},
            {"section": "ceiling", "name": "fp32", "kind": "compute", "value": 0.5},
            {"section": "ceiling", "name": "l2", "kind": "memory", "value": None, "error": "no L2 on a CPU run"}]
    for row in rows:
        row.update(edits.get(row["name"], {}))
    return {"study": "roofline", "schema": 1, "created": "2026-12-06T00:00:00+00:00", "command": ["gpuspeed", "roofline"],
            "git": "0" * 40, "device": info.to_dict(), "versions": {"torch": torch.__version__},
            "params": {"quick": True, "device": "cpu", "device_name": info.name}, "summary": {}, "rows": rows,
            "notes": []}


def test_ceilings_from_a_results_file_place_a_call_as_written():
    import torch

    from gpuspeed.roofline import place
    from gpuspeed.roofline.study import ceilings_from_results

    x = torch.randn(64, 64)
    p = place(torch.mm, x, x, ceilings=ceilings_from_results(_cpu_roofline_doc()), budget_s=0.1)
    assert p.roof_TFLOPs is not None and p.pct_of_roof > 0


@pytest.mark.parametrize("edit, words", [
    ({"copy": {"value": "20.0"}}, r"ceiling 'copy'.*value.*'20.0'"),  # a string: TypeError in place()
    ({"fp32": {"value": "0.5"}}, r"ceiling 'fp32'.*value"),
    ({"fp32": {"value": -0.5}}, r"ceiling 'fp32'.*value.*-0.5"),  # "-0.0029 times this device's fp32 ceiling"
    ({"copy": {"value": -20.0}}, r"ceiling 'copy'.*value"),  # left out of the roof in silence
    ({"fp32": {"value": True}}, r"ceiling 'fp32'.*value.*True"),  # read as 1 TFLOP/s
    ({"fp32": {"value": [0.5]}}, r"ceiling 'fp32'.*value"),
    ({"copy": {"value": None}, "fp32": {"value": None}}, r"no measured ceiling"),  # every % of roof None, no word
    ({"copy": {"name": None}}, r"name"),  # Ceiling(**row) TypeError
    ({"fp32": {"kind": "flops"}}, r"ceiling 'fp32'.*kind.*'flops'"),
])
def test_a_hand_edited_ceiling_is_refused_in_one_line(edit, words):
    from gpuspeed.errors import UserError
    from gpuspeed.roofline.study import ceilings_from_results

    doc = _cpu_roofline_doc(**edit)
    if edit.get("copy", {}).get("name", "copy") is None:
        del doc["rows"][0]["name"]
    with pytest.raises(UserError, match=words) as e:
        ceilings_from_results(doc)
    assert "\n" not in str(e.value)


# -- bench() of a call faster than the clock: its batches and what the record says of them -------------------------

@pytest.mark.alone  # the warm-up's estimate of one call against the samples' median: a neighbour's load moves one
def test_a_call_faster_than_the_clock_is_batched_as_the_record_says():
    # a 30 ns call was timed 888 calls a sample (~30 us, not the ~200 us the README promises), the note said "one takes
    # ~0.22 us" beside a median of 33 ns (the clock's own cost, read in the warm-up), and calls_per_sample said 1
    import re

    m = gpuspeed.bench(lambda: None, device="cpu", budget_s=0.5)
    note = next(n for n in m.notes if "back-to-back" in n)
    batch = int(re.search(r"mean of (\d+) back-to-back", note).group(1))
    assert m.calls_per_sample == batch > 1, (m.calls_per_sample, note)
    assert m.median * batch > 60e-6, (m.median, batch)  # ~200 us of calls a sample
    one = float(re.search(r"one takes ~([0-9.e+-]+) us", note).group(1)) * 1e-6
    assert one / 3 < m.median < one * 3, (one, m.median, note)


# -- verify_function() of two in-place functions with no array to write into --------------------------------------

def _append_one(values):
    values.append(1.0)


def _append_two(values):
    values.append(2.0)


def test_verify_function_never_passes_on_nothing_compared():
    # both return None and no argument is an array: every seed read "PASS: nothing to compare", the wrong one too
    from gpuspeed.errors import UserError
    from gpuspeed.verify import verify_function

    with pytest.raises(UserError, match=r"returned None.*no argument is an array") as e:
        verify_function(_append_one, _append_two, lambda seed: ([0.0],), seeds=(1,))
    assert "\n" not in str(e.value)


def _grow(values):
    values.append(np.ones(3))


def _keep(values):
    pass


def test_verify_function_of_arguments_changed_in_structure_fails_in_words():
    # fn added an array to a list argument, the reference did not: an IndexError from pairing the arguments' leaves
    from gpuspeed.verify import verify_function

    (r,) = verify_function(_grow, _keep, lambda seed: ([np.zeros(2)],), seeds=(1,))
    assert not r.passed and "argument" in r.summary, r.summary


# -- bench(rotate=N) of a broadcast (stride-0) argument: its copies are a few bytes ---------------------------------

@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_rotate_of_an_expanded_argument_is_not_refused_for_its_shape(lib):
    # a bias expanded to 10**10 elements is 4 bytes of memory, and clone_tree copies those 4 bytes; the rotate guard
    # counted its shape's 37 GiB and refused: "rotate=2 makes 1 copies of the arguments: 37.3 GiB of host memory"
    if lib == "torch":
        import torch

        wide = torch.ones(1).expand(10**10)
    else:
        wide = np.broadcast_to(np.ones(1, dtype=np.float32), (10**10,))
    m = gpuspeed.bench(lambda a: a[0], wide, rotate=2, device="cpu", budget_s=0.05)
    assert m.rotate == 2


# -- Measurement records read back (a results file's, hand-edited or of an older version) --------------------------

def _record() -> dict:
    return gpuspeed.bench(lambda: sum(range(100)), device="cpu", budget_s=0.05).to_dict()


def test_a_measurement_record_without_its_statistics_reads_them_off_its_samples():
    # "Reads records of any version: missing ones take their defaults": a record without p10/p90 (or any statistic)
    # was a TypeError "missing 1 required positional argument"
    from gpuspeed import Measurement

    full = _record()
    older = {k: v for k, v in full.items() if k not in ("p10", "p90", "iqr", "mean")}
    m = Measurement.from_dict(older)
    assert m.p10 == pytest.approx(full["p10"]) and m.p90 == pytest.approx(full["p90"])
    assert m.iqr == pytest.approx(full["iqr"]) and m.median == full["median"]


@pytest.mark.parametrize("edit, words", [
    ({"median": "1e-3"}, r"median.*number"),  # TypeError inside format_time
    ({"samples": "x"}, r"samples.*list"),  # ValueError: could not convert string to float
    ({"samples": [1e-3, "x"]}, r"samples.*list"),
    ({"name": None, "drop": "name"}, r"lacks name"),  # TypeError: missing 1 required positional argument
])
def test_a_hand_edited_measurement_record_is_refused_in_one_line(edit, words):
    from gpuspeed import Measurement
    from gpuspeed.errors import UserError

    d = _record()
    d.update({k: v for k, v in edit.items() if k != "drop"})
    d.pop(edit.get("drop"), None)
    with pytest.raises(UserError, match=words) as e:
        Measurement.from_dict(d)
    assert "\n" not in str(e.value)


def test_measurement_from_json_of_broken_text_is_one_line():
    from gpuspeed import Measurement
    from gpuspeed.errors import UserError

    for text in ("{bad", "[1, 2]"):
        with pytest.raises(UserError, match="Measurement"):
            Measurement.from_json(text)


def test_a_measurement_shown_in_a_notebook_is_not_its_samples():
    # a notebook cell ending in `m` shows repr(m): the dataclass repr listed every sample, up to 2000 floats
    m = gpuspeed.bench(lambda: None, device="cpu", max_noise=1e-6, min_samples=500, max_samples=500, budget_s=5)
    assert m.n == 500
    assert len(repr(m)) < 1500 and "median=" in repr(m), len(repr(m))


# -- pytest --gpubench-json to a place no file can be made: refused before the session, not after it ---------------

def test_gpubench_json_where_no_file_can_be_made_is_refused_before_any_test(tmp_path, plugin_args):
    # os.access() says yes to root for any existing folder, /proc included: the session's timing ran to its end and
    # then "gpubench: ERROR: cannot write /proc/x/out.json" (under a container's root user, as on most GPU hosts)
    import subprocess
    import sys

    (tmp_path / "test_user.py").write_text("def test_x(gpubench):\n    raise AssertionError('must not run')\n")
    run = subprocess.run([sys.executable, "-m", "pytest", *plugin_args, "-p", "no:cacheprovider", "-p", "no:xdist",
                          "test_user.py", "--gpubench-json=/proc/gpuspeed-test/out.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout[-2000:] + run.stderr[-2000:]
    assert "--gpubench-json" in run.stderr and "must not run" not in run.stdout


def test_plotting_a_hand_edited_roofline_file_is_refused_in_one_line(tmp_path):
    # the notebook's plot(read_results(SAVED)): a ceiling's value written as a string was a TypeError inside matplotlib
    from gpuspeed.errors import UserError
    from gpuspeed.roofline.plot import plot

    assert all(p.is_file() for p in plot(_cpu_roofline_doc(), tmp_path))
    with pytest.raises(UserError, match=r"ceiling 'copy'.*value") as e:
        plot(_cpu_roofline_doc(copy={"value": "20.0"}), tmp_path, stem="edited")
    assert "\n" not in str(e.value) and not (tmp_path / "edited.png").exists()


def test_check_of_host_arrays_larger_than_the_free_memory_allows_copies_of_runs(monkeypatch):
    # NumPy arrays already on the host are compared in place, a chunk at a time: they need no copy, yet the guard
    # counted one of each and refused 1 GiB of arrays with 256 MiB free ("compare it in slices")
    import gpuspeed.inputs

    n = 1 << 26
    out, ref = np.zeros(n), np.zeros(n)  # calloc'd: untouched pages take no memory
    monkeypatch.setattr(gpuspeed.inputs, "host_available_bytes", lambda: 1 << 28)
    r = gpuspeed.check(out, ref, atol=0)
    assert r.passed and r.leaves[0].n_elements == n, r.summary
    with pytest.raises(gpuspeed.UserError, match="compare it in slices"):  # a strided view is flattened into a copy
        gpuspeed.check(np.broadcast_to(np.float64(0), (2 * n,)), np.zeros(2 * n))


@pytest.mark.gpu
@pytest.mark.alone  # fills the GPU: under xdist another worker's test would run out of memory
def test_check_of_a_bf16_cuda_tensor_on_a_full_gpu_makes_no_copy_there():
    # check() made the float32 copy of a bf16 output on the GPU, before moving it to the host: on a GPU with less free
    # memory than twice the output (a model's activations beside it) check() itself raised CUDA out of memory
    import torch

    out = torch.zeros(1 << 28, dtype=torch.bfloat16, device="cuda")  # 512 MiB
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(free - (700 << 20), dtype=torch.uint8, device="cuda")  # ~700 MiB left: no 1 GiB float32 copy
    try:
        r = gpuspeed.check(out, torch.zeros(1 << 28, dtype=torch.float64), atol=0)
    finally:
        del filler
    assert r.passed, r.summary


# -- place(): a point far past any cache's speed is not called cache-resident -------------------------------------

def test_a_call_that_moves_none_of_its_bytes_is_not_placed_as_cache_resident():
    # a call that returns a view or does nothing was placed at ~60000 % of the memory roof with the note "cache-resident
    # data (the working set sat in cache...)": no cache is 600x faster than memory; its bytes were never moved
    import torch

    from gpuspeed.roofline import place
    from gpuspeed.roofline.study import ceilings_from_results

    x = torch.randn(512, 512)
    p = place(lambda t: t.t(), x, flops=1, ceilings=ceilings_from_results(_cpu_roofline_doc()), budget_s=0.1)
    assert p.pct_of_roof > 5000, p.pct_of_roof
    assert not any("cache-resident" in n or "sat in cache" in n for n in p.notes), p.notes
    assert any("bytes=" in n and "fewer" in n for n in p.notes), p.notes
    from gpuspeed.roofline.report import pct_text  # the tables' % of roof column

    assert "cache" not in pct_text(p.to_dict()) and "fewer" in pct_text(p.to_dict())


def test_a_fast_call_timed_one_by_one_behind_a_custom_flush_says_the_clock_is_in_its_time():
    # with flush=callable each sample is one call (the flush goes before every call): a 30 ns call read 271 ns, the
    # clock's own cost, with no word, where the same call without the flush read 31 ns
    m = gpuspeed.bench(lambda: None, device="cpu", flush=lambda: None, budget_s=0.2)
    assert m.calls_per_sample == 1
    assert any("clock" in n and "ns" in n for n in m.notes), m.notes


# -- --out=~/x: the user's home, not a folder named '~' -----------------------------------------------------------------


def test_out_with_a_tilde_is_the_users_home_for_every_command(tmp_path, monkeypatch, capsys):
    """`--out=~/runs/a` (bash expands no ~ after '=') made a folder literally named '~' in the working directory and
    wrote the results there. check_out_dir expands it, and decode and roofline, which passed the raw string on, write
    where it points."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from decode_cli_helpers import TINY, cli

    from gpuspeed.results import check_out_dir

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert check_out_dir("~/runs/x") == home / "runs" / "x" and (home / "runs" / "x").is_dir()
    rc, cap = cli(["--model", "tiny", "--prompt-len", "4", *TINY, "--out", "~/runs/decode"], capsys)
    assert rc == 0, cap.err
    assert (home / "runs" / "decode" / "decode.json").is_file()
    assert not (work / "~").exists(), sorted(p.name for p in work.iterdir())
