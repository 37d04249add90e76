"""QA round 13b: interrupted and failing runs of `gpuspeed roofline`, `launch`, `profile`, `kernel` and `bench`, as a
user hits them on a CPU-only machine: Ctrl-C or SIGTERM (`timeout 20 gpuspeed roofline --out DIR`) part-way through,
sent to a real child process once its first progress lines are out. Nothing is left half-written in --out, one line
says what happened, the exit code is 130 (Ctrl-C) or 143 (SIGTERM), and the steps already measured are kept where the
study's steps are independent (roofline)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

from signal_helpers import at_a_terminal

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    env.pop("COLUMNS", None)
    return env


def stopped(args: list[str], sig: int, after: str, cwd: Path, times: int = 1) -> tuple[int, str, str]:
    """Run `python -m gpuspeed *args` and send it `sig` once `after` has appeared `times` times in its stderr.
    Returns (exit code, stdout, stderr)."""
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env(), cwd=cwd, preexec_fn=at_a_terminal)
    err = []
    seen = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        err.append(line)
        if after in line:
            seen += 1
            if seen == times:
                p.send_signal(sig)
                break
    out, rest = p.communicate(timeout=120)
    return p.returncode, out, "".join(err) + rest


def _no_temp(folder: Path) -> None:
    left = [p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert not left, left


def _one_line(err: str, word: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("gpuspeed: ")]
    assert len(lines) == 1 and word in lines[0], err[-3000:]
    return lines[0]


def test_roofline_stopped_by_sigterm_keeps_the_steps_it_measured(tmp_path):
    # `timeout 20 gpuspeed roofline --out DIR`: SIGTERM killed it where it stood (exit -15, not a word), the empty
    # --out folder it had made stayed, and the ceilings it had measured for its minutes were lost
    out = tmp_path / "res"
    rc, stdout, err = stopped(["roofline", "--quick", "--no-place", "--out", str(out)], signal.SIGTERM,
                              "gpuspeed roofline [", tmp_path, times=2)
    assert rc == 143, (rc, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert "stopped after 2 of" in line and "partial" in line, line
    doc = json.loads((out / "roofline.json").read_text())
    assert doc["params"]["partial"] is True and doc["notes"][0].startswith("partial: stopped after 2 of")
    ceilings = [r for r in doc["rows"] if r["section"] == "ceiling"]
    assert [r["name"] for r in ceilings][:1] == ["copy"] and ceilings[0]["value"] > 0  # what it measured, kept
    assert doc["summary"]["copy_GBps"] > 0 and doc["summary"]["fp32_TFLOPs"] is None  # not run: null
    assert "partial" in (out / "roofline.md").read_text() and (out / "roofline.png").is_file()
    _no_temp(out)
    # a partial roof is not taken for a whole one (kernel reports, place(), notebook 01)
    from gpuspeed.errors import UserError
    from gpuspeed.roofline.study import ceilings_from_results

    try:
        ceilings_from_results(doc)
    except UserError as exc:
        assert "partial" in str(exc)
    else:
        raise AssertionError("a partial roofline document was taken as a roof")


def test_roofline_ctrl_c_before_a_step_ends_leaves_nothing(tmp_path):
    # interrupted during its first step: nothing measured, nothing written, no empty folder, the CLI's line, 130
    out = tmp_path / "res"
    rc, _, err = _ctrl_c_at_start(out, tmp_path)
    assert rc == 130, (rc, err[-3000:])
    _one_line(err, "interrupted")
    assert not out.exists()


def _ctrl_c_at_start(out: Path, cwd: Path):
    """Ctrl-C a roofline run once it said it measures (stdout), before its first step ends (stderr)."""
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", "roofline", "--quick", "--no-place", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd, preexec_fn=at_a_terminal)
    said = p.stdout.readline()
    assert "measuring the CPU roofline" in said, said
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    stdout, err = p.communicate(timeout=120)
    assert "gpuspeed roofline [" not in err, err  # no step had ended
    return p.returncode, said + stdout, err


def test_launch_stopped_by_sigterm_keeps_the_rows_it_measured(tmp_path):
    # the sweep and the chain had run (their rows, the per-launch fit): SIGTERM during the fusion study lost them all
    out = tmp_path / "res"
    rc, _, err = stopped(["launch", "--ks", "1,2,4", "--ns", "1000", "--variants", "eager", "--tiny-k", "10",
                          "--budget", "0.05", "--out", str(out)], signal.SIGTERM, "; now fusion N=1e+03 copy", tmp_path)
    assert rc == 143, (rc, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert "partial" in line and str(out / "launch.json") in line, line
    assert "UserWarning" not in err, err[-2000:]  # the partial plot has no fusion points: no legend warning
    doc = json.loads((out / "launch.json").read_text())
    assert doc["params"]["partial"] is True and doc["notes"][0].startswith("partial: stopped during the fusion study")
    sweep = [r for r in doc["rows"] if r["study"] == "sweep"]
    assert [r["K"] for r in sweep] == [1, 2, 4] and all(r["time_s"] > 0 for r in sweep)
    assert [r["variant"] for r in doc["rows"] if r["study"] == "chain"] == ["eager", "captured"]
    assert doc["summary"]["eager_us_per_launch"] > 0 and doc["summary"]["copy_roof_GBps"] is None
    assert (out / "launch.md").is_file() and (out / "launch.png").is_file()
    _no_temp(out)


def test_launch_stopped_by_sigterm_without_out_says_so(tmp_path):
    rc, stdout, err = stopped(["launch", "--ks", "1,2,4", "--ns", "1000", "--variants", "eager", "--tiny-k", "10",
                               "--budget", "0.05", "--json"], signal.SIGTERM, "gpuspeed launch [", tmp_path)
    assert rc == 143, (rc, err[-3000:])
    _one_line(err, "stopped by SIGTERM")
    assert stdout.strip() == ""  # --json prints a whole document or nothing


def test_profile_stopped_by_sigterm_leaves_no_unfinished_trace(tmp_path):
    # killed in its second run of the script (placing source lines), the trace staged in --out stayed there as
    # .<name>.trace.json.gz.unfinished.gz, beside no profile.json, and nothing was said
    script = tmp_path / "slow.py"
    script.write_text("import sys, time\nimport numpy as np\nprint('run started', file=sys.stderr, flush=True)\n"
                      "t = time.perf_counter()\nwhile time.perf_counter() - t < 0.5:\n"
                      "    np.random.default_rng().random(10000).sum()\n")
    out = tmp_path / "res"
    rc, _, err = stopped(["profile", "--no-hotspots", "--out", str(out), str(script)], signal.SIGTERM, "run started",
                         tmp_path, times=2)
    assert rc == 143, (rc, err[-3000:])
    _one_line(err, "stopped by SIGTERM")
    assert not out.exists() or not list(out.iterdir()), list(out.iterdir())


def _stop_when_made(args: list[str], out: Path, cwd: Path, sig: int, wait: float = 0.5):
    """Send `sig` to `python -m gpuspeed *args` `wait` s after its --out folder appeared."""
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=_env(), cwd=cwd, preexec_fn=at_a_terminal)
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    time.sleep(wait)
    p.send_signal(sig)
    stdout, err = p.communicate(timeout=120)
    return p.returncode, stdout, err


def test_bench_stopped_by_sigterm_says_so_and_leaves_no_empty_out(tmp_path):
    out = tmp_path / "res"
    rc, _, err = _stop_when_made(["bench", "--budget", "1", "--out", str(out)], out, tmp_path, signal.SIGTERM)
    assert rc == 143, (rc, err[-3000:])
    _one_line(err, "stopped by SIGTERM")
    assert not out.exists()


def test_kernel_stopped_by_sigterm_says_so_and_leaves_no_empty_out(tmp_path):
    (tmp_path / "k.py").write_text("import sys, time\nprint('loading', file=sys.stderr, flush=True)\n"
                                   "time.sleep(30)\ndef launch(x):\n    return x\n")
    out = tmp_path / "res"
    rc, _, err = stopped(["kernel", f"{tmp_path / 'k.py'}:launch", "--device", "cpu", "--out", str(out)],
                         signal.SIGTERM, "loading", tmp_path)
    assert rc == 143, (rc, err[-3000:])
    _one_line(err, "stopped by SIGTERM")
    assert not out.exists()


def test_roofline_a_failing_step_keeps_the_others_and_names_its_error(tmp_path):
    # a ceiling and a placement that raise (a dtype this CPU's torch does not run): the other steps' numbers stay,
    # the failures are named in the document, its Markdown and the count, and the files are whole
    import numpy as np
    import torch

    from gpuspeed.roofline.study import Study, run_steps, write_artifacts
    from gpuspeed.roofline.workloads import Workload

    def unsupported():
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")

    rng = np.random.default_rng()
    x = torch.from_numpy(rng.standard_normal(1 << 16).astype(np.float32))
    good = Workload("add fp32", "torch elementwise", "fp32", lambda: (torch.add, (x, x)),
                    nbytes=lambda a: 3 * a[0].numel() * 4)
    bad = Workload("mm fp16", "matmul", "fp16", unsupported)
    st = Study(device="cpu", quick=True, sweep=False, workloads=False)
    steps = [("fp16 ceiling", st._ceiling_step("FP16 matmul", unsupported))]
    steps += [("place add", st._place_step(good)), ("place mm", st._place_step(bad))]
    doc = run_steps(st, steps, out=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no roof to draw: the plot has no legend, not a matplotlib warning
        paths = write_artifacts(doc, tmp_path)
    assert (tmp_path / "roofline.png") in paths and not [n for n in doc["notes"] if "plot failed" in n]
    saved = json.loads((tmp_path / "roofline.json").read_text())
    assert "partial" not in saved["params"] and saved["summary"]["n_errors"] == 2
    rows = {r["name"]: r for r in saved["rows"]}
    assert rows["add fp32"]["GBps"] > 0
    assert "not implemented for 'Half'" in rows["FP16 matmul"]["error"]
    assert "not implemented for 'Half'" in rows["mm fp16"]["error"]
    md = (tmp_path / "roofline.md").read_text()
    assert md.count("not implemented for 'Half'") == 2
    _no_temp(tmp_path)


def test_json_stdout_stays_alone_when_the_users_code_prints_at_exit(tmp_path):
    # a profiled script's or a kernel file's atexit handler printed after the JSON (at process exit): stdout no
    # longer parsed as JSON alone; its prints go to stderr now, as the rest of the user's output under --json
    from kernel_cli_helpers import interpreted_env

    script = tmp_path / "script.py"
    script.write_text("import atexit\nimport numpy as np\natexit.register(print, 'bye from the script')\n"
                      "print('script says', np.random.default_rng().random(4).sum())\n")
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "profile", "--no-hotspots", "--json", str(script)],
                       capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["params"]["target"] == str(script)
    assert "bye from the script" in r.stderr and "script says" in r.stderr
    (tmp_path / "kern.py").write_text(textwrap.dedent("""\
        import atexit
        import numpy as np
        import triton
        import triton.language as tl
        atexit.register(print, "bye from the kernel file")

        @triton.jit
        def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

        def launch(x):
            import torch
            print("launching")
            y = torch.empty_like(x)
            _double[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
            return y

        def inputs(rng):
            import torch
            return (torch.from_numpy(rng.standard_normal(1000).astype(np.float32)),)
        """))
    r = subprocess.run([sys.executable, "-m", "gpuspeed", "kernel", "kern.py:launch", "--device", "cpu", "--json"],
                       capture_output=True, text=True, env=interpreted_env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["name"] == "launch"
    assert "bye from the kernel file" in r.stderr and "launching" in r.stderr


def test_a_signal_while_the_files_are_written_waits_for_them(tmp_path):
    # the final writes run with Ctrl-C and SIGTERM held: a signal then lets every file be written whole, and SIGTERM
    # is still said in one line with 143 (blocking it in the main thread alone let another thread take it at once)
    code = textwrap.dedent(f"""\
        import os, signal, threading, time
        from pathlib import Path
        from gpuspeed.results import signals_held, write_text_atomic
        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()  # torch's threads: one more taker
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            write_text_atomic(Path({str(tmp_path)!r}) / "a.json", "{{}}")
            write_text_atomic(Path({str(tmp_path)!r}) / "b.md", "b")
        write_text_atomic(Path({str(tmp_path)!r}) / "after", "not reached")
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    _one_line(r.stderr, "stopped by SIGTERM")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.md"]


def test_decode_stopped_by_sigterm_says_so_and_keeps_the_rungs_it_measured(tmp_path):
    # decode rewrites its decode.json (marked partial) as each rung ends; SIGTERM killed it where it stood: exit -15
    # and no line, so a user did not learn that the file there holds part of a run
    out = tmp_path / "out"
    code, _, err = stopped(["decode", "--model", "tiny", "--layers", "1", "--prompt-len", "3", "--new-tokens", "3",
                            "--variants", "V2,V0,V1", "--no-hf", "--no-profile", "--budget", "0.05", "--out", str(out)],
                           signal.SIGTERM, "now tiny_fp32 V1", tmp_path)
    assert code == 143, (code, err[-3000:])
    line = _one_line(err, "stopped by SIGTERM")
    assert f"the rungs measured are in {out / 'decode.json'} (marked partial)" in line
    doc = json.loads((out / "decode.json").read_text())
    assert doc["params"]["partial"] is True
    assert {"V2", "V0"} <= {r["variant"] for r in doc["rows"]}
    _no_temp(out)
