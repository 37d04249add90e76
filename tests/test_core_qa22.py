"""QA round 22, core: a demanding user's pass over check, profile, explain, doctor, roofline, launch and profile's
CLI on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gpuspeed
from gpuspeed import check
from gpuspeed.errors import UserError


def _x(n: int = 8, seed: int = 7) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


# -- True-or-False options take NumPy 2's bool (its type is named "bool", NumPy 1's "bool_") --------------------------


def test_profile_takes_a_numpy_bool_for_hotspots():
    # hotspots=np.True_ was refused as "not True or False": profile looked for the type name NumPy 1 gave it
    rep = gpuspeed.profile(torch.sum, _x(), steps=1, warmup=0, hotspots=np.False_)
    assert rep.steps == 1


@pytest.mark.parametrize("value", ["no", 0, None])
def test_profile_and_explain_refuse_a_flag_that_is_not_true_or_false_in_one_wording(value):
    from gpuspeed.graph_breaks import explain

    with pytest.raises(UserError, match=r"profile\(\): hotspots takes True or False"):
        gpuspeed.profile(torch.sum, _x(), steps=1, hotspots=value)
    with pytest.raises(UserError, match=r"explain\(\): check_fullgraph takes True or False"):
        explain(torch.sum, _x(), variants=[], check_fullgraph=value)


# -- check(None, None): two functions that both forgot their `return` ------------------------------------------------


@pytest.mark.parametrize("nothing", [None, (None, None), [None]])
def test_check_of_nothing_against_nothing_does_not_pass(nothing):
    # `assert check(f(x), ref(x))` passed when both functions forgot their `return`: "PASS: nothing to compare"
    r = check(nothing, nothing)
    assert not r.passed and not r
    assert "return" in r.summary and "\n" not in r.summary, r.summary


def test_check_of_empty_results_and_of_a_none_beside_an_array_still_passes():
    # a search that found nothing ([] against []), and a function whose second result is None on purpose
    assert check([], []).passed and check({}, {}).passed
    x = np.random.default_rng(1).standard_normal(3)
    assert check((x, None), (x.copy(), None)).passed


def test_verify_function_still_compares_the_arguments_of_an_in_place_pair():
    # the in-place path rests on both returning None: their argument arrays are compared instead
    from gpuspeed.verify import verify_function

    def scale(out, x):
        np.multiply(x, 2.0, out=out)

    def scale_wrong(out, x):
        np.multiply(x, 2.5, out=out)

    def inputs(seed):
        x = np.random.default_rng(seed).standard_normal(5)
        return np.empty_like(x), x

    good = verify_function(scale, scale, inputs, seeds=[1, 2])
    assert all(r.passed for r in good), [r.summary for r in good]
    assert "argument arrays compared" in good[0].summary
    bad = verify_function(scale_wrong, scale, inputs, seeds=[1])
    assert not bad[0].passed


# -- doctor: triton installed as the `pytorch-triton` distribution (torch's nightly and ROCm wheels) -----------------


def _only_distributions(monkeypatch, tmp_path, dists: dict[str, str]) -> None:
    """sys.path holding only these installed distributions (name -> version), as dist-info folders."""
    import sys

    for name, version in dists.items():
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])


def test_doctor_reads_the_triton_version_of_a_pytorch_triton_install(monkeypatch, tmp_path):
    # versions() asked importlib.metadata for the distribution "triton" alone: a pytorch-triton install read None,
    # so results files said no triton where torch.compile wrote Triton kernels
    from gpuspeed import device

    _only_distributions(monkeypatch, tmp_path, {"pytorch-triton": "3.1.0+cf34004b8a"})
    assert device.versions()["triton"] == "3.1.0+cf34004b8a"
    # a pytorch-triton install without its files: reinstall that distribution, not `pip install triton`
    why = device._not_found("triton")
    assert why.startswith("pytorch-triton 3.1.0+cf34004b8a is installed but `import triton` finds no module"), why
    assert "--force-reinstall pytorch-triton" in why


def test_doctor_says_triton_is_not_installed_when_no_distribution_provides_it(monkeypatch, tmp_path):
    from gpuspeed import device

    _only_distributions(monkeypatch, tmp_path, {})
    assert device.versions()["triton"] is None
    assert device._not_found("triton") == "not installed (pip install triton)"


# -- profile --json on the CPU: no sync wait it never measured ---------------------------------------------------------


def _reads_back_twice(x):
    total = 0.0
    for i in range(2):
        total += (x[i] * 2).sum().item()
    return total


def test_profile_json_on_the_cpu_gives_no_sync_wait_it_did_not_measure():
    # the console and Markdown showed '-' for a CPU run's sync wait, but the JSON still said wait_s 0.0 and
    # host_sync_wait_s 0.0: a free sync, read by a script, where on a GPU it waits for all the work queued before it
    res = gpuspeed.profile(_reads_back_twice, _x(4 * 4).reshape(4, 4), steps=1, hotspots=False)
    if res.findings["gpu"]:
        pytest.skip("a GPU run measures the wait")
    groups = res.findings["host_syncs"]["groups"]
    assert groups and all(g["wait_s"] is None for g in groups), groups
    summary = res.summary()  # what --json and profile.json hold
    assert summary["host_syncs"] == 2 and summary["host_sync_wait_s"] is None, summary
    assert "0.0 ns" not in str(res) and "| - |" in res.markdown()


# -- roofline: a CPU matmul above its compute ceiling is not blamed on a clock state ----------------------------------


def test_a_cpu_point_above_the_compute_ceiling_names_the_shared_host_not_a_clock_state():
    # `gpuspeed roofline` on a busy 2-core host placed mm fp32 256 at 915 % of an fp32 ceiling measured while other
    # processes held the cores (a BLAS call's threads waited ms for them), and said "measured in a slower clock state"
    from gpuspeed.roofline.place import above_roof_note

    note = above_roof_note("compute", "cpu", 915.0)
    assert note.startswith("above roof: faster than the measured compute ceiling") and "other work" in note, note
    assert "clock state" in above_roof_note("compute", "cuda", 115.0)  # a GPU's boost clock: the reason there


# -- launch: the fusion study's bytes of reduce-overhead on the CPU ----------------------------------------------------


def test_fusion_counts_reduce_overheads_copy_in_only_where_a_cuda_graph_makes_one():
    # `gpuspeed launch` on the CPU counted reduce-overhead's bytes twice (16000 for N=1000 against compiled's 8000):
    # the copy into a CUDA graph's static input, which a CPU run (no CUDA graph) never makes, so its GB/s and % of the
    # copy roof read double for the same time
    from gpuspeed.launch.fusion import point_bytes

    n, k = 1000, 8
    assert point_bytes("copy", n, k, "cpu") == 2 * 4 * n
    assert point_bytes("eager", n, k, "cpu") == point_bytes("captured", n, k, "cpu") == 2 * k * 4 * n
    assert point_bytes("reduce-overhead", n, k, "cpu") == point_bytes("compiled", n, k, "cpu") == 2 * 4 * n
    assert point_bytes("reduce-overhead", n, k, "cuda") == 4 * 4 * n  # the graph's copy-in: one more read and write
    assert point_bytes("captured-compiled", n, k, "cuda") == 2 * 4 * n


# -- profile: a loop of tensor operators is array work, whatever the source looks like --------------------------------


def _halves(x, n):
    for _ in range(n):
        x = x * 0.5 + 1
    return x


def test_profile_advises_a_loop_of_tensor_operators_as_array_work_not_numba():
    # `x = x * 0.5 + 1` over a torch tensor, 20 times: read from the source alone as scalar code (no torch.* call, no
    # slice), so profile advised "compile it as a loop (Numba @njit on the CPU)", which cannot take a tensor, on the
    # GPU too; the trace places torch ops on the loop's line
    res = gpuspeed.profile(_halves, _x(64), 20, steps=1, warmup=0)
    loop = next(lp for lp in res.hotspots["hot_loops"] if lp["function"] == "_halves")
    assert loop["kind"] == "sequential-loop" and loop["on_arrays"], loop
    assert "Numba" not in loop["verdict"] and "torch.compile" in loop["verdict"], loop["verdict"]
    rec = next(r for r in res.recommendations if r["finding"] == "python_loop")
    assert "Numba" not in rec["text"], rec["text"]
    listed = next(lp for f in res.hotspots["lines"]["functions"] for lp in f["loops"] if f["function"] == "_halves")
    assert listed["verdict"] == loop["verdict"]  # the function's own loop list says the same


# -- explain: a graph's ops counted as they are, method calls too -----------------------------------------------------


def _sin_break_cos(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos() * 2


def test_explain_counts_a_graphs_tensor_method_calls_as_ops():
    # ops_per_graph came from dynamo's own list, which holds call_function nodes only: x.sin() and y.cos() are
    # call_method nodes, so `gpuspeed launch --explain --json` said [0, 1], a first graph with nothing in it
    from gpuspeed.graph_breaks import explain

    exp = explain(_sin_break_cos, _x(), variants=[], check_fullgraph=False)
    assert exp.graph_count == 2 and exp.ops_per_graph == [1, 2], exp.ops_per_graph


def test_launch_report_says_why_the_captured_chain_has_no_time_on_the_cpu():
    # launch.md's 1000-op chain table showed "| captured | - | - | - |  |" on the CPU: the row's reason (no CUDA
    # device to capture on) was in launch.json only
    from gpuspeed.launch import run_launch
    from gpuspeed.launch.report import to_markdown

    doc = run_launch(device="cpu", ks=[1, 2], ns=[1000], variants=["eager"], chain_k=1, tiny_k=10, budget_s=0.01)
    row = next(r for r in doc["rows"] if r["study"] == "chain" and r["variant"] == "captured")
    assert row.get("skipped"), row
    line = next(ln for ln in to_markdown(doc).splitlines() if ln.startswith("| captured |"))
    assert f"skipped: {row['skipped']}" in line, line


# -- profile: a mistyped option is named as one ------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "bad"), [(["profile", "-f", "work.py:step", "-i", "x=float32[4]", "--step", "2"],
                                           "--step"), (["profile", "--no-hotspot", "work.py"], "--no-hotspot")])
def test_profile_names_a_mistyped_option(argv, bad, tmp_path, capsys, monkeypatch):
    # the command passes unknown options on to the script, so `--step 2` (for --steps) with --function said "give
    # either a script to run or --function", and `--no-hotspot script.py` said "no such file: --no-hotspot"
    from gpuspeed.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "work.py").write_text("def step(x):\n    return x * 2\n")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"gpuspeed: error: no such option: {bad}"), err


def test_profile_takes_numpy_whole_numbers_for_steps_and_warmup():
    # steps=np.int64(2) was refused as "needs whole numbers", which bench(min_samples=np.int64(5)) and
    # peak_memory(warmup=np.int64(1)) take; the result holds plain ints (its JSON is the same)
    res = gpuspeed.profile(torch.sum, _x(), steps=np.int64(2), warmup=np.int64(0), hotspots=False)
    assert res.steps == 2 and type(res.steps) is int and type(res.params["warmup"]) is int
    with pytest.raises(UserError, match="whole numbers"):
        gpuspeed.profile(torch.sum, _x(), steps=2.0, hotspots=False)


def test_profile_markdown_of_a_cpu_run_keeps_its_top_ops():
    # the console showed "Top ops (host time)" on a CPU run (what it has instead of kernels), but profile.md and the
    # optimize report's profile section left the table out: the op-level timing of a CPU run was in the JSON only
    res = gpuspeed.profile(_reads_back_twice, _x(4 * 4).reshape(4, 4), steps=1, hotspots=False)
    if res.findings["gpu"]:
        pytest.skip("a GPU run lists its kernels")
    md = res.markdown()
    assert "# Top ops (host time)" in md, md
    top = res.findings["top_ops"][0]
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| `{top['name']}` |"))
    assert f"| {top['calls_per_step']:g} |" in row, row


@pytest.mark.gpu
def test_profile_on_a_gpu_measures_sync_waits_and_reads_a_tensor_loop_as_array_work():
    # the GPU side of two CPU fixes: a GPU run's sync wait stays a measured number (null is for CPU runs only), and a
    # loop of tensor operators on CUDA tensors gets the array-work verdict, not Numba's
    x = _x(1 << 16).cuda()
    res = gpuspeed.profile(_halves, x, 20, steps=2, warmup=1)
    assert res.findings["gpu"]
    loop = next(lp for lp in res.hotspots["hot_loops"] if lp["function"] == "_halves")
    assert loop["on_arrays"] and "Numba" not in loop["verdict"], loop["verdict"]
    synced = gpuspeed.profile(_reads_back_twice, x.reshape(256, 256), steps=2, hotspots=False)
    groups = synced.findings["host_syncs"]["groups"]
    assert groups and all(isinstance(g["wait_s"], float) and g["wait_s"] >= 0 for g in groups), groups
    assert isinstance(synced.summary()["host_sync_wait_s"], float)


def test_kernel_mode_with_cupti_recording_nothing_is_one_line_not_an_index_error():
    """On the H100 a worker whose CUPTI failed to start ('CUPTI_ERROR_NOT_INITIALIZED') handed bench(mode='kernel')
    a session with no activities: an IndexError from the marker arithmetic. It is one line naming the cause."""
    from gpuspeed.errors import UserError
    from gpuspeed.timing.kernel import first_call_after_marks

    with pytest.raises(UserError, match=r"recorded 0 GPU activities and 0 of its own 2 markers: CUPTI.*mode='events'"):
        first_call_after_marks([])
