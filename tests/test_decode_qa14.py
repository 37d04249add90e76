"""QA round 14: `gpuspeed decode` as a user runs it: --tp N's progress lines, benchmarks/decode.py's --merge/--keep
of runs that differ in tp, bad input and the results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from decode_cli_helpers import ROOF, SMALL, cli, run_benchmark
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)
from signal_helpers import ignoring, tagged_processes

ROOT = Path(__file__).resolve().parents[1]
# the smallest --tp 2 run (tests/test_decode_tp.py's): one layer, three tokens, the eager backend, a given read roof
TP_SMALL = ["--model", "tiny", "--layers", "1", "--new-tokens", "3", "--prompt-len", "4", "--device", "cpu",
            "--no-profile", "--budget", "0.1", "--compile-backend", "eager", "--variants", "V2", *ROOF]


def _decode(*args, timeout=240):
    """`gpuspeed decode ARGS` as a user runs it in a pipe (stderr is no terminal)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-m", "gpuspeed", "decode", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def test_tp_run_in_a_pipe_says_rank_0s_steps_as_a_one_gpu_run_does(tmp_path):
    """--tp 2 said one line at its end ('2 ranks (tensor parallel)'): the ranks reported no steps."""
    p = _decode(*TP_SMALL, "--tp", "2", "--json", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["params"]["tp"] == 2  # stdout is the document alone
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("gpuspeed decode [")]
    said = "\n".join(lines)
    for step in ("loading model", "read ceiling", "now tiny_fp32_tp2 V2"):
        assert step in said, p.stderr
    last = lines[-1]
    assert " tiny_fp32_tp2 V2: " in last and "now" not in last, p.stderr
    done, total = last.split("] ", 1)[1].split(" ", 1)[0].split("/")
    assert done == total, last  # the count ends where the total said it would


# --- benchmarks/decode.py --merge/--keep: a tp=2 run and a tp=1 run of one model, dtype and variant ---------------

def _spec(**over):
    from gpuspeed.decode import study

    kw = dict(model="tiny", max_layers=1, prompt_len=3, new_tokens=2, variants=["V2"], hf=False, profile=False,
              bench_budget_s=0.05, device="cpu", read_roof_GBps=20.0, compile_backend="eager")
    return study.Spec(**(kw | over))


@pytest.fixture(scope="module")
def tp_runs():
    """Real CPU runs of a one-layer tiny model, fp32 V2: one process, and two gloo ranks (what `--tp 2 --out` writes)."""
    from gpuspeed.decode import study, tp as TP

    return {1: study.run(_spec()), 2: TP.launch(_spec(tp=2), 2)}


def _put(doc, path: Path) -> Path:
    from gpuspeed.results import write_results

    path.mkdir(parents=True, exist_ok=True)
    return write_results(doc, path)


def _bench(*argv):
    return run_benchmark("decode.py", *argv)


def _tp_of_rows(doc):
    return sorted((r.get("tp") or 1, r["variant"]) for r in doc["rows"])


def test_merge_keeps_a_tp2_run_beside_the_tp1_run_of_the_same_model_and_dtype(tmp_path, tp_runs):
    """--merge keyed runs by (model, dtype, quant): the tp2 run was taken for the tp1 one and dropped, in silence."""
    _put(tp_runs[1], tmp_path / "a" / "runs" / "tiny_fp32")
    _put(tp_runs[2], tmp_path / "a" / "runs" / "tiny_fp32_tp2")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "a")
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert _tp_of_rows(doc) == [(1, "V2"), (2, "V2")]
    s = doc["summary"]
    assert s["tiny_fp32_best_ms_per_token"] == tp_runs[1]["summary"]["tiny_fp32_best_ms_per_token"]
    assert s["tiny_fp32_tp2_best_ms_per_token"] == tp_runs[2]["summary"]["tiny_fp32_tp2_best_ms_per_token"]
    assert sorted(r.get("tp", 1) for r in doc["params"]["runs"]) == [1, 2]


def test_keep_replaces_only_the_new_runs_tp_and_its_keys(tmp_path, tp_runs):
    """--keep split the kept file by (model, dtype, quant): the tp1 run took the tp2 rows and every tiny_fp32_tp2_*
    key with it (their names start with tiny_fp32_), and so overwrote the new tp2 run's figures with the old ones."""
    import copy

    from gpuspeed.decode import study

    old2 = copy.deepcopy(tp_runs[2])
    for r in old2["rows"]:
        r["ms_per_token"] *= 10  # the old tp2 run: slower, so that its figures are told from the new one's
    old2["summary"] = {k: (v * 10 if k.endswith("_ms_per_token") else v) for k, v in old2["summary"].items()}
    kept = _put(study.merge([tp_runs[1], old2]), tmp_path / "old")
    _put(tp_runs[2], tmp_path / "new" / "runs" / "tiny_fp32_tp2")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "new", "--keep", kept)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert _tp_of_rows(doc) == [(1, "V2"), (2, "V2")]  # the old tp2 row is gone, the tp1 row kept once
    rows = {r.get("tp") or 1: r for r in doc["rows"]}
    assert rows[2]["ms_per_token"] == tp_runs[2]["rows"][0]["ms_per_token"]
    s = doc["summary"]
    assert s["tiny_fp32_tp2_best_ms_per_token"] == tp_runs[2]["summary"]["tiny_fp32_tp2_best_ms_per_token"]
    assert s["tiny_fp32_best_ms_per_token"] == tp_runs[1]["summary"]["tiny_fp32_best_ms_per_token"]


# --- bad checkpoints: refused before the run starts, with nothing else printed -------------------------------------

def test_a_folder_that_is_not_a_llama_is_one_line_and_prints_nothing_else(tmp_path):
    """A GPT-2 folder (and any config the loader refuses) got past the check before the run: the CPU banner went to
    stdout, then the error came from the loading step."""
    transformers = pytest.importorskip("transformers")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)) \
        .save_pretrained(tmp_path)
    p = _decode("--model", str(tmp_path), *SMALL, "--prompt-len", "3")
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("gpuspeed: error:") and "not a Llama checkpoint" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stdout == "", p.stdout


def test_tp_honours_time_cap_as_one_process_does(tmp_path):
    """--tp 2 --time-cap: the ranks dropped the cap in silence (each rank's clock would skip different rungs and
    their collectives would not pair up) and ran every rung; now rank 0's clock decides for all ranks."""
    p = _decode(*TP_SMALL, "--variants", "V0,V2", "--tp", "2", "--time-cap", "0.001", "--json")
    doc = json.loads(p.stdout)
    assert doc["params"]["time_cap_s"] == 0.001
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"V0", "V2"}
    assert all("time cap of 0.001 s reached" in rows[v].get("skipped", "") for v in rows), doc["rows"]
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr  # nothing measured: not a success
    assert doc["summary"]["tiny_fp32_tp2_best_ms_per_token"] is None
    assert doc["summary"]["tiny_fp32_tp2_tokens_per_s"] is None and doc["summary"]["tiny_fp32_tp2_v2_ms_per_token"] is None


def test_summary_keys_are_none_not_missing_when_every_rung_failed():
    """Every rung failed or was skipped: the summary was {} (a run-to-run comparison read the model as never run);
    and a rung that failed beside one measured lost its <variant>_ms_per_token key."""
    from gpuspeed.decode import study

    rows = [{"variant": "V0", "error": "RuntimeError: out of memory"}, {"variant": "V2", "skipped": "time cap"}]
    s = study.summarize("tiny_fp32", rows, [], [{"variant": "HF static", "ms_per_token": 2.0}],
                        _spec(variants=["V0", "V2"], hf=True))
    for key in ("best_ms_per_token", "best_variant", "pct_of_read_roof", "best_weight_GBps", "tokens_identical",
                "v0_over_v2", "v0_ms_per_token", "v2_ms_per_token", "b1_tokens_per_s", "best_over_hf_static"):
        assert s[f"tiny_fp32_{key}"] is None, (key, s)
    assert s["tiny_fp32_variants_measured"] == 0 and s["tiny_fp32_variants_failed_or_skipped"] == 2


def test_tp_merge_of_two_calls_holding_the_same_run_keeps_it_once(tmp_path, tp_runs):
    """decode_tp.py --merge A B where both hold runs/tiny_fp32_tp2: both went in, the rows twice over and the summary
    from whichever came last; now the first found, and a line says which was skipped."""
    _put(tp_runs[2], tmp_path / "a" / "runs" / "tiny_fp32_tp2")
    _put(tp_runs[2], tmp_path / "b" / "runs" / "tiny_fp32_tp2")
    _put(tp_runs[1], tmp_path / "b" / "runs" / "tiny_fp32_tp1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_tp.py"), "--out", str(tmp_path / "out"),
                        "--merge", str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out" / "decode_tp.json").read_text())
    assert sorted((r["run_tp"], r["variant"]) for r in doc["rows"]) == [(1, "V2"), (2, "V2")]
    assert len(doc["params"]["runs"]) == 2
    assert "skipped" in p.stderr and str(tmp_path / "b" / "runs" / "tiny_fp32_tp2") in p.stderr, p.stderr


def test_merged_plots_give_a_tp2_run_its_own_panel(tmp_path, tp_runs):
    """decode_ladder.png grouped rows by model and dtype: a tp1 and a tp2 V2 bar (or an int8 and a bf16 V5, as
    merge_int8 makes) went into one panel at one x position, the later bar hiding the other."""
    import matplotlib.image as mpimg

    from gpuspeed.decode import study

    merged = study.merge([tp_runs[1], tp_runs[2]])
    paths = study.plots(merged, tmp_path)
    (tmp_path / "one").mkdir()
    one = study.plots(tp_runs[1], tmp_path / "one")
    for p, q in zip(paths, one, strict=True):  # a figure is as wide as its panels
        assert mpimg.imread(p).shape[1] == 2 * mpimg.imread(q).shape[1], p.name


# --- --tp N stopped from outside ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sig,code,says", [("SIGTERM", 143, "stopped by SIGTERM"), ("SIGINT", 130, "interrupted")])
def test_a_tp_run_stopped_by_a_signal_says_so_in_one_line_and_keeps_its_rungs(tmp_path, monkeypatch, sig, code, says):
    """torchrun's agent takes SIGTERM/SIGINT for itself: a --tp run stopped by `timeout` or Ctrl-C ended 'gpuspeed:
    error: --tp 2: the launcher failed: SignalException: Process N got signal: 15', exit 2, after a torch warning line,
    and did not say that --out's decode.json held the rungs measured."""
    import signal
    import time

    from test_interrupt_qa13 import stopped

    tag = f"qa14-{os.getpid()}-{time.time_ns()}"  # marks every process of this run, to look for leftovers
    monkeypatch.setenv("GPUSPEED_TEST_TAG", tag)
    out = tmp_path / "out"
    rc, _, err = stopped(["decode", *TP_SMALL, "--variants", "V0,V2", "--budget", "0.5", "--tp", "2",
                          "--out", str(out)], getattr(signal, sig), "now tiny_fp32_tp2 V0", ROOT)
    assert rc == code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert all(ln.startswith("gpuspeed") for ln in err.strip().splitlines()), err[-3000:]  # no torch log lines
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"gpuspeed: {says}: ") and str(out / "decode.json") in last, err[-3000:]
    doc = json.loads((out / "decode.json").read_text())
    # V2's rung is kept; V0's may have ended between the signal and the ranks' stop (a loaded machine)
    assert doc["params"]["partial"] is True and [r["variant"] for r in doc["rows"]][:1] == ["V2"], doc["rows"]
    time.sleep(2)  # the agent stops its ranks before it returns; give the kernel a moment to reap them
    left = tagged_processes(tag)
    assert not left, f"processes of the stopped run still alive: {left}"


# --- on GPUs (the lead runs these on nvidia-h100-x2 / nvidia-h200-x2) ---------------------------------------------

def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_tp2_on_gpus_says_rank_0s_steps_and_honours_the_time_cap(tmp_path):
    """NCCL ranks: rank 0's steps reach the launcher's lines, and a cap that falls after the first rung (a compiled
    rung takes seconds) skips the later rungs on every rank alike (a per-rank decision would hang a collective)."""
    args = ["--model", "tiny", "--layers", "2", "--new-tokens", "8", "--prompt-len", "4", "--device", "cuda",
            "--no-profile", "--budget", "0.2", "--tp", "2", "--json"]
    p = _decode(*args, "--variants", "V2,V0", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("gpuspeed decode [")]
    said = "\n".join(lines)
    assert "loading model" in said and "now tiny_fp32_tp2 V0" in said, p.stderr[-3000:]
    p = _decode(*args, "--variants", "V2,V5", "--time-cap", "0.001", timeout=300)
    doc = json.loads(p.stdout)
    assert all("time cap" in r.get("skipped", "") for r in doc["rows"]), doc["rows"]
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]


# --- a run stopped part-way into a folder that holds a complete decode.json ------------------------------------------

def test_a_stopped_run_keeps_the_complete_decode_json_already_in_out(tmp_path, capsys):
    """The run rewrote --out's decode.json as each rung ended: a complete file from an earlier run there was replaced
    by the first partial write, and a run then stopped (or killed) lost it. Now the partial goes beside it as
    decode.partial.json, the line says so, and a run that finishes removes its decode.partial.json."""
    import signal

    from test_interrupt_qa13 import stopped

    out = tmp_path / "out"
    args = ["--model", "tiny", "--layers", "1", "--new-tokens", "3", "--prompt-len", "4", "--device", "cpu",
            "--no-hf", "--no-profile", "--budget", "0.5", "--variants", "V0,V2", "--out", str(out), *ROOF]
    # the complete runs in this process, on a tenth of the budget (only the stopped one must still be in V0 when
    # the signal comes): only the stopped one needs its own process
    quick = [a if a != "0.5" else "0.05" for a in args]
    rc, cap = cli(quick, capsys)
    assert rc == 0, cap.err[-3000:]
    complete = (out / "decode.json").read_text()
    rc, _, err = stopped(["decode", *args], signal.SIGTERM, "now tiny_fp32 V0", ROOT)
    assert rc == 143, err[-3000:]
    assert (out / "decode.json").read_text() == complete
    partial = json.loads((out / "decode.partial.json").read_text())
    assert partial["params"]["partial"] is True and [r["variant"] for r in partial["rows"]] == ["V2"]
    last = err.strip().splitlines()[-1]
    assert str(out / "decode.partial.json") in last and f"the complete {out / 'decode.json'} is kept" in last, last
    rc, cap = cli(quick, capsys)
    assert rc == 0, cap.err[-3000:]
    assert not (out / "decode.partial.json").exists()
    assert (out / "decode.json").read_text() != complete  # the finished run's


def test_benchmark_models_given_twice_is_one_line_before_anything_runs(tmp_path):
    """--models tiny:bf16,tiny:bf16 ran the model twice into one runs/ folder (the second removing the first's)
    and merged both documents: every row twice, the summary of the last."""
    p = _bench("--out", tmp_path / "out", "--models", "tiny:bf16,tiny:bf16", "--device", "cpu")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.strip() == "--models tiny:bf16 is given twice", p.stderr
    assert not (tmp_path / "out").exists()


def test_merge_takes_a_finished_run_over_a_partial_one_of_the_same_model(tmp_path, tp_runs):
    """--merge A B, A's run cut by its cap (partial), B's the same model finished: the first found (A's partial)
    went in and B's was dropped in silence."""
    import copy

    cut = copy.deepcopy(tp_runs[1])
    cut["params"]["partial"] = True
    cut["notes"].append("partial: the run had not finished when this was written")
    _put(cut, tmp_path / "a" / "runs" / "tiny_fp32")
    _put(tp_runs[1], tmp_path / "b" / "runs" / "tiny_fp32")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "a", tmp_path / "b")
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out" / "decode.json").read_text())
    (run,) = doc["params"]["runs"]
    assert not run.get("partial") and not any(n.startswith("partial") for n in doc["notes"]), doc["notes"]
    assert str(tmp_path / "a" / "runs" / "tiny_fp32") in p.stderr  # the one left out is named


def test_a_tp_run_started_with_sigterm_ignored_is_not_stopped_by_one(tmp_path):
    """`trap '' TERM; gpuspeed decode --tp 2`: torchrun's agent put its own handler on SIGTERM over the caller's
    choice, so a SIGTERM the caller meant to ignore stopped the ranks and the run (one process keeps it ignored)."""
    import signal

    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", "decode", *TP_SMALL, "--variants", "V2,V0", "--tp", "2",
                          "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=ROOT, preexec_fn=ignoring(signal.SIGTERM))
    err = []
    for line in p.stderr:
        err.append(line)
        if "now tiny_fp32_tp2 V2" in line:  # the ranks are measuring
            p.send_signal(signal.SIGTERM)
            break
    _, rest = p.communicate(timeout=240)
    assert p.returncode == 0, (p.returncode, "".join(err) + rest)
    doc = json.loads((out / "decode.json").read_text())
    assert not doc["params"].get("partial") and {r["variant"] for r in doc["rows"]} == {"V0", "V2"}
