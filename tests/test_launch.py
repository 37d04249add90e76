"""gpuspeed.launch: the fit arithmetic, the chain check, the CLI on the CPU (sizes tiny), --explain."""

import json
import textwrap

import numpy as np
import pytest
import torch

from gpuspeed import launch
from gpuspeed.cli import main
from gpuspeed.errors import UserError


def test_fit_recovers_exact_line():
    ks = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    t = [3.1e-6 + 1.06e-6 * k for k in ks]
    for relative in (True, False):
        f = launch.fit_linear(ks, t, relative=relative)
        assert f.fixed_s == pytest.approx(3.1e-6, rel=1e-9)
        assert f.per_s == pytest.approx(1.06e-6, rel=1e-9)
        assert f.per_err_s < 1e-15 and f.r2 == pytest.approx(1.0)


def test_fit_unweighted_matches_polyfit_and_errors_cover_truth():
    rng = np.random.default_rng(1)
    ks = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], dtype=float)
    t = 5e-6 + 7e-6 * ks
    noisy = t * (1 + 0.02 * rng.standard_normal(ks.size))
    f = launch.fit_linear(ks, noisy, relative=False)
    slope, icpt = np.polyfit(ks, noisy, 1)
    assert f.per_s == pytest.approx(slope, rel=1e-9) and f.fixed_s == pytest.approx(icpt, rel=1e-6)
    # over many noisy draws the relative fit's slope lands within 3 standard errors ~always
    hits = 0
    for _ in range(200):
        noisy = t * (1 + 0.02 * rng.standard_normal(ks.size))
        f = launch.fit_linear(ks, noisy)
        hits += abs(f.per_s - 7e-6) <= 3 * f.per_err_s
        assert f.per_err_s > 0
    assert hits >= 190


def test_fit_rejects_bad_input():
    with pytest.raises(UserError):
        launch.fit_linear([1, 1], [1.0, 2.0])
    with pytest.raises(UserError):
        launch.fit_linear([1, 2], [1.0])
    with pytest.raises(UserError):
        launch.fit_linear([1, 2, 3], [1.0, -1.0, 2.0])


def test_chain_and_its_check():
    x = torch.randn(1000)
    out = launch.make_chain(8)(x)
    assert launch.check_chain(out, x, 8).passed
    bad = out.clone()
    bad[123] += 1e-3
    assert not launch.check_chain(bad, x, 8).passed
    assert launch.chain_rtol(1000) > launch.chain_rtol(8)
    with pytest.raises(UserError):
        launch.make_chain(0)


def test_wall_time_counts_every_launch():
    calls = []
    samples = launch.wall_time(lambda: calls.append(1), 16, lambda: None, repeats=5)
    assert len(samples) == 5 and all(s > 0 for s in samples)
    assert len(calls) == 16 * 6  # one warm-up round, then five timed rounds


def test_cli_cpu_run_writes_json_md_png(tmp_path, capsys):
    rc = main(["launch", "--device", "cpu", "--ks", "1,2,4,8", "--ns", "1e3,1e4", "--variants",
               "eager,captured", "--tiny-k", "20", "--budget", "0.05", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "launch.json").read_text())
    assert doc["study"] == "launch" and doc["params"]["ks"] == [1, 2, 4, 8]
    s = doc["summary"]
    assert s["eager_us_per_launch"] > 0 and s["checks_passed"] is True and s["errors"] == 0
    assert s["graph_us_per_kernel"] is None  # no graphs on the CPU: reported as missing, not invented
    fusion = [r for r in doc["rows"] if r["study"] == "fusion"]
    assert {r["variant"] for r in fusion} == {"copy", "eager", "captured"}
    assert all(r["time_s"] > 0 and "pct_copy_roof" in r for r in fusion)
    eager = next(r for r in fusion if r["variant"] == "eager" and r["N"] == 1000)
    assert eager["bytes"] == 2 * 8 * 4 * 1000
    assert (tmp_path / "launch.md").read_text().startswith("# Launch overhead")
    assert (tmp_path / "launch.png").stat().st_size > 10_000
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--ks", "one,two"], ["--variants", "eager,fast"], ["--chain-k", "0"],
                                  ["--budget", "-1"], ["--inputs", "x.py:f"], ["--ks", "inf"], ["--ns", "1e400"],
                                  ["--budget", "nan"], ["--ns", "1e14"]])
def test_cli_bad_input_is_one_line_exit_2(argv, capsys):
    rc = main(["launch", "--device", "cpu", "--ks", "1,2", "--ns", "1e3"] + argv if argv[0] != "--ks"
              else ["launch", "--device", "cpu"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gpuspeed: error:") and len(err.strip().splitlines()) == 1


def test_cli_explain(tmp_path, capsys):
    src = tmp_path / "user.py"
    src.write_text(textwrap.dedent("""
        import torch

        def step(x):
            y = x.relu()
            z = y.sum().item()
            return y * z

        def make_inputs():
            return (torch.randn(32),)

        def needs_args(a, b):
            return a + b
    """))
    assert main(["launch", "--explain", f"{src}:step"]) == 0
    out = capsys.readouterr().out
    assert "1 graph break" in out and "user.py:6" in out
    assert main(["launch", "--explain", f"{src}:step", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["break_count"] == 1 and doc["breaks"][0]["line"] == 6
    src2 = tmp_path / "noinputs.py"
    src2.write_text("def needs_args(a, b):\n    return a + b\n")
    assert main(["launch", "--explain", f"{src2}:needs_args"]) == 2
    assert "make_inputs" in capsys.readouterr().err
    assert main(["launch", "--explain", f"{tmp_path}/missing.py:f"]) == 2


def test_cli_explain_as_users_write_it(tmp_path, capsys):
    """make_inputs() that sets the globals the function reads (the file is imported once), prints at import
    and in the function (kept off --json's stdout), argv read at import, sys.exit in the function, study flags."""
    src = tmp_path / "model.py"
    src.write_text(textwrap.dedent("""
        import argparse
        import sys
        import torch

        print("importing model.py")
        args = argparse.ArgumentParser().parse_args()  # a script's own flags: none here
        model = None

        def make_inputs():
            global model
            model = torch.nn.Linear(8, 8)
            return torch.randn(2, 8)

        def f(x):
            print("in f")
            return torch.relu(model(x))

        def leaves(x):
            sys.exit(3)
    """))
    capsys.readouterr()
    assert main(["launch", "--explain", f"{src}:f", "--json", "--out", str(tmp_path / "o")]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)  # stdout is the JSON alone
    # the print ahead of any op is a graph break (fullgraph=True fails on it), reported at its line
    assert doc["break_count"] == 1 and doc["breaks"][0]["line"] == 16 and doc["fullgraph_ok"] is False
    assert "importing model.py" in cap.err and "in f" in cap.err
    assert cap.out.count("importing") == 0 and cap.err.count("importing model.py") == 1  # imported once
    assert json.loads((tmp_path / "o" / "explain.json").read_text())["break_count"] == 1
    assert main(["launch", "--explain", f"{src}:leaves"]) == 2
    assert "raised SystemExit(3)" in capsys.readouterr().err
    assert main(["launch", "--explain", f"{src}:f", "--ks", "1,2"]) == 2
    assert "--ks goes with the launch study" in capsys.readouterr().err


def _rounds(*medians_us, noise=0.001):
    from gpuspeed.timing import Measurement

    return [Measurement(name="p", median=t * 1e-6, mean=t * 1e-6, min=t * 1e-6, max=t * 1e-6, iqr=0.0, p10=t * 1e-6,
                        p90=t * 1e-6, n=100, rel_noise=noise, samples=[], device="cuda", mode="events")
            for t in medians_us]


def test_point_is_median_of_rounds_and_flags_disagreeing_or_noisy_rounds():
    from gpuspeed.launch.fusion import timing_fields

    calm = timing_fields(_rounds(10.0, 10.2, 9.9), nbytes=8000)
    assert calm["median_us"] == pytest.approx(10.0) and calm["rounds_us"] == pytest.approx([10.0, 10.2, 9.9])
    assert calm["unreliable"] is False and "unreliable_why" not in calm
    # a cold first round (the 1.7 %-of-roof copy of a first run) does not become the point, and is flagged
    cold = timing_fields(_rounds(480.0, 8.3, 8.4), nbytes=8000)
    assert cold["median_us"] == pytest.approx(8.4)
    assert cold["unreliable"] is True and "rounds disagree" in cold["unreliable_why"][0]
    noisy = timing_fields(_rounds(10.0, 10.0, 10.0, noise=0.2), nbytes=8000)
    assert noisy["unreliable"] is True and "noisy" in noisy["unreliable_why"][0]


def test_smaller_n_slower_than_larger_n_is_flagged():
    from gpuspeed.launch.fusion import flag_non_monotone

    # the zig-zag of a host-bound curve: 38 us at N=1e5 but 10 us at N=1e6 for the same compiled chain
    times = {"compiled": [12, 11.8, 38.3, 10.0, 30.7, 192], "copy": [3.7, 3.8, 4.0, 8.3, 26.5, 194]}
    rows = [{"variant": v, "N": 10**(3 + i), "time_s": t * 1e-6, "rel_noise": 0.005}
            for v, ts in times.items() for i, t in enumerate(ts)]
    flag_non_monotone(rows)
    flagged = {(r["variant"], r["N"]) for r in rows if r.get("unreliable")}
    assert flagged == {("compiled", 10**5)}  # 12 vs 10 us at 1e3 is within slack; the copy is monotone
    why = next(r for r in rows if r.get("unreliable"))["unreliable_why"][0]
    assert "N=1e+06" in why


def test_cli_fusion_points_are_interleaved_rounds_with_a_reliability_field(tmp_path):
    from gpuspeed.launch.fusion import ROUNDS

    rc = main(["launch", "--device", "cpu", "--ks", "1,2", "--ns", "1e3,1e4", "--variants", "eager",
               "--tiny-k", "10", "--budget", "0.03", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "launch.json").read_text())
    fusion = [r for r in doc["rows"] if r["study"] == "fusion"]
    assert len(fusion) == 4
    for r in fusion:
        assert len(r["rounds_us"]) == ROUNDS and isinstance(r["unreliable"], bool)
        assert min(r["rounds_us"]) <= r["median_us"] <= max(r["rounds_us"])
    assert doc["summary"]["fusion_unreliable_points"] == sum(r["unreliable"] for r in fusion)
    assert "| reliable |" in (tmp_path / "launch.md").read_text()


@pytest.mark.parametrize("extra", [[], ["--explain", "x.py:f"]])
def test_cli_out_naming_a_file_fails_at_startup(tmp_path, capsys, monkeypatch, extra):
    import gpuspeed.launch.study as study

    def never(*a, **k):
        raise AssertionError("the study ran before --out was checked")

    monkeypatch.setattr(study, "run_launch", never)
    monkeypatch.setattr(launch, "run_launch", never)
    target = tmp_path / "a_file"
    target.write_text("")
    rc = main(["launch", "--device", "cpu", "--out", str(target)] + extra)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gpuspeed: error:") and len(err.strip().splitlines()) == 1
    assert "a_file" in err


def test_modules_have_one_job_each():
    from gpuspeed import graph_breaks, graphs
    from gpuspeed.launch import fit, fusion, report, study

    assert graphs.explain is graph_breaks.explain and graphs.Explanation is graph_breaks.Explanation
    assert not hasattr(graphs, "_quiet_dynamo")  # the finder's machinery lives in graph_breaks only
    with pytest.raises(AttributeError):
        graphs.no_such_name  # noqa: B018
    assert launch.fit_linear is fit.fit_linear and launch.plot is report.plot
    assert launch.run_launch is study.run_launch and launch.VARIANTS is fusion.VARIANTS
    assert not hasattr(study, "plot") and not hasattr(study, "explain_target")


def test_a_round_bench_flags_unreliable_flags_the_point_with_its_reason():
    from gpuspeed.launch.fusion import timing_fields

    rounds = _rounds(10.0, 10.1, 10.0)
    rounds[1].unreliable = True
    rounds[1].notes = ["unreliable: IQR/median is 92% beside a median error of 0.2%"]
    fields = timing_fields(rounds, nbytes=8000)
    assert fields["unreliable"] is True
    assert "1 of 3" in fields["unreliable_why"][0] and "IQR/median is 92%" in fields["unreliable_why"][0]
