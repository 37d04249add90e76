"""QA round 12 on the instruments: explain(), launch, roofline, profile (CPU unless marked gpu)."""

import re
import textwrap

import pytest
import torch

from gpuspeed.cli import main
from gpuspeed.errors import UserError
from gpuspeed.graph_breaks import _default_calls, explain
from gpuspeed.profiling import profile


# -- explain(): the changed-input calls change the batch, not a broadcast bias or a weight ----------------------


def _biased(x, *, bias):
    return x * 2 + bias


def _affine(x, w, b):
    return x @ w + b


def test_explain_changes_the_batch_of_its_inputs_not_a_broadcast_bias_or_a_weight():
    # every tensor's first dim was doubled, a `bias=` of shape (8,) beside x (4, 8) too: calls 2 and 3 failed
    # ('The size of tensor a (8) must match ...') and the recompiles of a new batch size were never counted
    exp = explain(_biased, torch.randn(4, 8), bias=torch.randn(8), check_fullgraph=False)
    # (a note that explain() reset dynamo's caches comes where an earlier test in this process compiled something)
    assert exp.calls == 4 and not [n for n in exp.notes if "reset torch._dynamo's caches" not in n], exp
    assert exp.recompiles >= 1 and any("size" in r for r in exp.recompile_reasons), exp
    # positionally the same: a weight (8, 3) and a bias (3,) beside x (4, 8) keep their shapes
    calls = _default_calls((torch.randn(4, 8), torch.randn(8, 3), torch.randn(3)), {})
    assert [[t.shape for t in a] for a, _ in calls][1:] == [[(8, 8), (8, 3), (3,)], [(12, 8), (8, 3), (3,)]]
    assert all(_affine(*a).shape == (a[0].shape[0], 3) for a, _ in calls)
    # inputs sharing the batch (a mask passed by keyword, a second positional batch) still change with it
    x, mask = torch.randn(5, 3), torch.rand(5) > 0.5
    calls = _default_calls((x, torch.randn(3)), {"mask": mask})
    assert [a[0].shape[0] for a, _ in calls] == [5, 10, 15] and [k["mask"].shape[0] for _, k in calls] == [5, 10, 15]
    assert all(a[1].shape == (3,) for a, _ in calls) and not torch.equal(calls[0][0][1], torch.zeros(3))
    # all by keyword: the tensor with the most dimensions is the batch, whatever order the keywords come in
    calls = _default_calls((), {"bias": torch.randn(8), "x": torch.randn(4, 8)})
    assert [(k["x"].shape[0], k["bias"].shape[0]) for _, k in calls] == [(4, 8), (8, 8), (12, 8)]


# -- launch: absurd sizes and budgets are refused in one line, before anything runs ------------------


@pytest.mark.parametrize("argv, match", [
    (["--ns", "1e30"], r"--ns goes up to 1e\+10 elements"),  # it printed a 23-digit GiB figure
    (["--ns", "1000,1e12"], r"--ns goes up to 1e\+10 elements .*, got 1e\+12$"),
    (["--budget", "1e30"], r"--budget is seconds per measurement, at most 3600"),  # it ran, for ever
])
def test_launch_refuses_unphysical_sizes_and_budgets_in_one_line(argv, match, capsys):
    assert main(["launch", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(match, err.strip()), err


def test_launch_library_refuses_them_too():
    from gpuspeed import launch

    with pytest.raises(UserError, match=r"--ns goes up to"):
        launch.check_params(None, [10**30], 8, 5, None, None)
    with pytest.raises(UserError, match=r"at most 3600"):
        launch.run_launch(device="cpu", ks=[1], ns=[1000], tiny_k=5, chain_k=2, variants=["eager"], budget_s=1e9)



def _sq(x):
    return x * x


@pytest.mark.parametrize("kw", [{"steps": 10**12}, {"warmup": 10**12}])
def test_profile_refuses_a_step_or_warm_up_count_past_its_bound(kw, capsys):
    # steps=10**12 ran for ever, holding every step's events in memory
    with pytest.raises(UserError, match=r"at most"):
        profile(_sq, torch.randn(4), device="cpu", hotspots=False, **kw)
    flag = "--" + next(iter(kw))
    assert main(["profile", "--function", f"{__file__}:_sq", "--input", "x=float32[4]", flag, str(10**12)]) == 2
    assert "at most" in capsys.readouterr().err


# -- roofline: dtype names in any case, and the dtype names of torch ------------------------------------------


def test_roofline_dtypes_read_in_any_case_and_as_torch_names():
    from gpuspeed.roofline.study import parse_dtypes

    # --dtype FP32 was 'unknown dtype', though the error listed fp32
    assert parse_dtypes(["FP32", "BF16"]) == ["fp32", "bf16"]
    assert parse_dtypes("float32, bfloat16,TF32,torch.float32") == ["fp32", "bf16", "tf32"]
    with pytest.raises(UserError, match=r"unknown dtype 'FP16': use fp32, tf32, bf16"):
        parse_dtypes(["FP16"])  # a unit that the study does not sweep is still refused


# -- roofline place(): flops and bytes no device could move are refused, not placed at 1e294 % of the roof ---------


@pytest.mark.parametrize("kw, match", [
    ({"flops": 1e300}, r"flops=1e\+300 per call .* times this device's fp32 ceiling"),
    ({"flops": 10**400}, r"flops must be finite"),  # OverflowError: int too large to convert to float
    ({"bytes": 2**70}, r"bytes=1\.18e\+21 per call .* times this device's memory roof"),
    ({"bytes": 1e300}, r"bytes=1e\+300 per call"),
    ({"bytes": 10**400}, r"bytes must be a finite byte count"),
])
def test_place_refuses_flops_or_bytes_past_any_roof(kw, match):
    from gpuspeed.roofline.ceilings import Ceiling, Ceilings
    from gpuspeed.roofline.place import place

    ceil = Ceilings("cpu", "test", [Ceiling("copy", "memory", 20.0), Ceiling("fp32", "compute", 0.5)])
    x = torch.randn(64, 64)
    with pytest.raises(UserError, match=match):
        place(lambda a: a @ a, x, ceilings=ceil, budget_s=0.02, **kw)
    if "flops" in kw and kw["flops"] < 1e301:
        p = place(lambda a: a @ a, x, ceilings=ceil, budget_s=0.02)  # its own count places it, near the roof
        assert p.flops == 2 * 64**3 and 0 < p.pct_of_roof < 1e4


# -- profile: torch 2.10-2.11's "Profiler clears events" warning, which every profiler start gave, is not ours to show --


_CLEARS = ("Warning: Profiler clears events at the end of each cycle.Only events from the current cycle will be "
           "reported.To keep events across cycles, set acc_events=True.")


def _warns(x):
    import warnings

    warnings.warn("the user's own warning", UserWarning, stacklevel=1)
    return x * 2


def test_profile_hides_torch_s_spurious_profiler_warning_and_keeps_the_user_s(monkeypatch):
    # torch 2.10 and 2.11 warn on every torch.profiler start (pytorch#180348, fixed in #180387); profile() starts
    # its session once, so no events are cleared: the warning said nothing about the user's run. Here it is torch
    # 2.11's prepare_trace, warning as that torch does before it prepares the trace.
    import warnings

    from torch.profiler import profiler as torch_profiler

    prepare = torch_profiler._KinetoProfile.prepare_trace

    def prepare_as_in_2_11(self):
        warnings.warn(_CLEARS, UserWarning, stacklevel=2)
        warnings.warn("another warning of torch's", UserWarning, stacklevel=2)
        return prepare(self)

    monkeypatch.setattr(torch_profiler._KinetoProfile, "prepare_trace", prepare_as_in_2_11)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        profile(_warns, torch.randn(8), steps=1, warmup=0, device="cpu", hotspots=False)
    messages = [str(w.message) for w in seen]
    assert not any("Profiler clears events" in m for m in messages), messages
    assert "another warning of torch's" in messages and "the user's own warning" in messages


# -- profile: a script reading file descriptor 0 itself reads the same input in every run ------------------------


def test_every_run_of_a_script_reads_fd_0_as_the_first_run_did(tmp_path):
    # sys.stdin's reads were replayed to the later runs, os.read(0, n) was not: the first run read the pipe dry and
    # the source-line, cProfile and line-time runs read nothing. Under `python script.py` fd 0 is the process's
    # own, as it is in `seq 1 5000 | gpuspeed profile script.py`: a process of its own here (pytest holds fd 0).
    import subprocess
    import sys

    seen = tmp_path / "seen.txt"
    script = tmp_path / "fdsum.py"
    script.write_text(textwrap.dedent(f"""\
        import os, sys
        data = b""
        while chunk := os.read(0, 4096):
            data += chunk
        rest = sys.stdin.read()  # after the fd's end: nothing left either way
        open({str(seen)!r}, "a").write(f"{{len(data.split())}} {{len(rest)}}\\n")
        """))
    numbers = "\n".join(str(v) for v in torch.randint(1, 10**6, (5000,)).tolist()) + "\n"
    done = subprocess.run([sys.executable, "-m", "gpuspeed", "profile", "--no-hotspots", "--json", str(script)],
                          input=numbers.encode(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert seen.read_text().split("\n")[:-1] == ["5000 0"] * 2, seen.read_text()  # profiled step, source lines
