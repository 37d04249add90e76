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
    assert launch._check_chain(out, x, 8).passed
    bad = out.clone()
    bad[123] += 1e-3
    assert not launch._check_chain(bad, x, 8).passed
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
                                  ["--budget", "-1"], ["--inputs", "x.py:f"]])
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
