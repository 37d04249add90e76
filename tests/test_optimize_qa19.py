"""QA round 19, optimize: the fresh-inputs probe's verdict under load."""
from __future__ import annotations

import numpy as np
import pytest

from gpuspeed.stats import summarize


def _m(samples):
    return summarize(samples, name="x", device="cpu", mode="cpu")


class _Impl:
    device = "cpu"

    def prepare(self, a):
        return a

    def run(self, *a):
        return None

    def sync(self):
        pass


def _probe(monkeypatch, rounds):
    """_fresh_inputs_probe with each round's (fresh, again) given: the verdict and how many rounds it made."""
    from gpuspeed.optimize import worker

    made = []

    def fresh_vs_again(impl, fn, fresh_sets, same, name):
        made.append(name)
        return rounds[len(made) - 1]

    monkeypatch.setattr(worker, "_fresh_vs_again", fresh_vs_again)
    monkeypatch.setattr(worker, "_fresh_args", lambda spec, wl: [(np.ones(4),)] * worker.FRESH_SETS)
    result = {"name": "cand", "notes": []}
    found = worker._fresh_inputs_probe({"recipe": {}, "bench_budget_s": 2.0}, None, _Impl(), (np.ones(4),),
                                       (np.ones(4),), _m([1e-5] * 5), result, lambda _s: None)
    return found, len(made)


def test_one_round_of_slow_fresh_calls_is_not_called_caching_unless_a_second_round_agrees(monkeypatch):
    # under a load of ~13 all three fresh calls of the one round were slowed alike: a candidate that caches nothing
    # was said to "cache its results by input" and timed on the slow round (test_optimize_qa15's sparse writer)
    slow, fast = (_m([5e-4, 6e-4, 7e-4]), _m([1e-5, 1e-5, 1e-5])), (_m([1.1e-5, 1e-5, 1.2e-5]), _m([1e-5] * 3))
    assert _probe(monkeypatch, [slow, fast]) == (None, 2)
    assert _probe(monkeypatch, [fast]) == (None, 1)  # a first round that finds nothing is the verdict
    found, made = _probe(monkeypatch, [slow, slow])  # caching, seen twice: said, with the second round's times
    assert made == 2 and found is not None and found[0][0].median == slow[0].median


# --- torch CPU peaks: a warmed-up torch call read 0 B (RSS does not rise where torch's heap reuses what it freed) ---

def _two_temporaries(x):
    """(x * 2) and (x * 2 + 1) are alive together: at least two of x's size in torch's own allocations."""
    return ((x * 2.0) + 1.0).sum()


def test_a_warmed_up_torch_cpu_call_has_its_own_allocations_measured():
    torch = pytest.importorskip("torch")
    from gpuspeed import peak_memory

    x = torch.from_numpy(np.random.default_rng(19).standard_normal((128, 1024)))  # 1 MiB of float64
    rep = peak_memory(_two_temporaries, x, device="cpu")  # the default warm-up: torch's heap holds the memory again
    assert rep.torch_peak_bytes is not None and 2 * x.nbytes <= rep.torch_peak_bytes < 3 * x.nbytes, rep
    assert rep.peak_bytes >= 2 * x.nbytes and not rep.unmeasured


def _profiled_inside(x):
    import torch

    with torch.profiler.profile():  # a profiler of the call's own ends the measurement's on its way out
        y = x * 2.0
    return (y + 1.0).sum()


def test_a_torch_call_whose_allocations_cannot_be_seen_is_said_not_measured():
    torch = pytest.importorskip("torch")
    from gpuspeed import peak_memory

    x = torch.from_numpy(np.random.default_rng(7).standard_normal((64, 64)))
    rep = peak_memory(_profiled_inside, x, device="cpu")
    assert rep.torch_peak_bytes is None and "the call ran torch's profiler itself" in rep.unmeasured, rep
    assert any(n.startswith("torch's CPU allocations not measured") for n in rep.notes)
    with torch.profiler.profile():  # measured inside a user's profiler: one profiler at a time
        inside = peak_memory(_two_temporaries, x, device="cpu")
    assert inside.torch_peak_bytes is None and "already running" in inside.unmeasured


TORCH_VARIANTS = '''
import torch


def original(x):  # a profiler of its own: its allocations cannot be seen
    with torch.profiler.profile():
        y = x * 2.0
    return (y + 1.0).sum(dim=1)


def plain(x):
    return ((x * 2.0) + 1.0).sum(dim=1)


variants = {"plain": plain}


def inputs(rng):
    return (torch.from_numpy(rng.standard_normal((128, 1024))),)
'''


def test_optimize_shows_a_torch_cpu_peak_measured_or_not_measured_never_a_wrong_zero(tmp_path):
    import json

    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from gpuspeed.cli import app

    p = tmp_path / "tv.py"
    p.write_text(TORCH_VARIANTS)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["optimize", str(p), "--device", "cpu", "--backends", "variant", "--time-budget",
                                 "180", "--bench-budget", "0.05", "--out", str(out)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads((out / "optimize_tv.json").read_text())["rows"]}
    assert rows["variant:plain"]["peak_bytes"] >= 2 * 2**20, rows["variant:plain"]  # 1 MiB x twice, warmed up
    # the variant gets the original's torch tensors as they are: its label said "(numpy inputs)"
    assert rows["variant:plain"]["label"] == "user variant 'plain' (the original's inputs)"
    assert rows["original"]["peak_bytes"] is None and rows["original"]["peak_first_call"] is True
    assert rows["variant:plain"]["peak_first_call"] is False
    assert "the call ran torch's profiler itself" in rows["original"]["peak_unmeasured"]
    table = {line.split()[1]: line for line in r.output.splitlines() if line.startswith("│")}
    assert "not measured" in table["original"] and "MiB" in table["variant:plain"], r.output
    report = (out / "report.md").read_text()
    assert "| not measured |" in report and "0.00 GiB" not in report


def _host_and_device(x):
    y = x.cuda() * 2.0  # 1 MiB on the GPU, none on the host beyond the copy's staging
    return float(y.sum()) + float((x * 2.0).sum())  # and 1 MiB on the host


@pytest.mark.gpu
def test_a_host_peak_on_a_gpu_machine_counts_torchs_cpu_allocations_not_its_cuda_ones():
    """CPU candidates of a GPU run are measured on the host: the profiler's CUDA memory events are not host memory,
    and a profiler of CPU activity alone starts beside a CUDA context."""
    import torch

    from gpuspeed import peak_memory

    x = torch.from_numpy(np.random.default_rng(3).standard_normal((128, 1024)))
    rep = peak_memory(_host_and_device, x, device="cpu")
    assert rep.torch_peak_bytes is not None and x.nbytes <= rep.torch_peak_bytes < 2 * x.nbytes, rep


def test_a_candidate_hundreds_of_times_slower_is_not_shown_as_a_zero_speedup():
    # torch.compile on a 20 us in-place step took 4.6 ms on a loaded CPU: the table said "0.00x [0.00, 0.00]"
    import types

    from rich.console import Console

    from gpuspeed.commands.optimize import _print

    slow = {"speedup": 0.00435, "ci_low": 0.0043, "ci_high": 0.0045, "verdict": "slower"}
    rows = {"original": {"status": "ok", "device_time": {"median": 2e-5}, "peak_bytes": 90112, "peak_first_call": True},
            "torch-compile-cpu": {"status": "ok", "device_time": {"median": 4.6e-3}, "speedup": slow,
                                  "speedup_e2e": slow, "peak_bytes": 3 * 2**20}}
    run = types.SimpleNamespace(where="cpu", notes=[], wl=types.SimpleNamespace(name="step"), results=rows,
                                choice={"rank_by": "e2e", "primary": None}, paths={})
    console = Console(record=True, width=200)
    _print(run, console)
    text = console.export_text()
    assert "0.0043x [0.0043, 0.0045]" in text and "0.00x" not in text, text
    # a small peak in its own unit, not 0.00 GiB; the original's is its first call's (lazy loads and all), said so
    assert "88.0 KiB (first call)" in text and "3.00 MiB" in text and "3.00 MiB (first" not in text


def test_measuring_torch_code_that_frees_an_older_tensor_prints_no_cpp_warning(capfd):
    # c10 warned once a process on stderr, "[W... CPUAllocator.cpp:245] Memory block of unknown size was allocated
    # before the profiling started...", in the middle of `gpuspeed decode --device cpu`'s output
    torch = pytest.importorskip("torch")
    from gpuspeed import peak_memory

    older = [torch.from_numpy(np.random.default_rng(5).standard_normal(512)).clone() for _ in range(3)]

    def frees_one():
        older.pop()
        return (torch.ones(64) * 2.0).sum()

    rep = peak_memory(frees_one, device="cpu", warmup=0)
    assert rep.torch_peak_bytes is not None and rep.torch_peak_bytes >= 64 * 4
    assert "CPUAllocator" not in capfd.readouterr().err


def test_profiles_op_table_gives_each_ops_time_per_step_as_its_calls_are(tmp_path, capsys, monkeypatch):
    # "calls/step | time" showed calls per step beside the total of all steps: each op of a 45 ms call read 55-60 ms
    import json

    from gpuspeed.cli import main

    pytest.importorskip("torch")
    monkeypatch.setenv("COLUMNS", "200")  # the table's header on one line
    p = tmp_path / "tm.py"
    p.write_text("import torch\n\n\ndef f(x):\n    return torch.relu(x @ x).sum()\n")
    args = ["profile", "--device", "cpu", "--no-hotspots", "--function", f"{p}:f", "-i", "x=float32[64,64]"]
    assert main(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    steps, ops = doc["findings"]["steps"], doc["findings"]["top_ops"]
    assert steps > 1 and ops
    for o in ops:
        assert o["time_per_step_s"] * steps == pytest.approx(o["time_s"])
    assert main(args) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "calls/step" in line)
    assert "time/step" in header
