"""Round 18 QA of `gpuspeed decode`: what a demanding user still hit on the CPU."""

import json
import sys

from decode_cli_helpers import SMALL, TINY, cli, one_line
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)

# a read ceiling given, not measured: the runs below are about what decode writes, not the roof
QUICK = [*TINY, "--model", "tiny", "--prompt-len", "4", "--read-roof", "10"]


def test_no_matplotlib_keeps_the_results_and_says_why_no_plots(tmp_path, monkeypatch, capsys):
    # decode.json was written, then the plot's ImportError made the run exit 2; now the plots are tried first and a
    # failure is a note in the results, the run succeeds
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError, as if not installed
    (tmp_path / "decode_ladder.png").write_bytes(b"an earlier run's")  # not to be read as this run's plot
    rc, cap = cli([*QUICK, "--out", str(tmp_path), "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    written = json.loads((tmp_path / "decode.json").read_text())
    for d in (doc, written):  # stdout and the file say the same
        assert [n for n in d["notes"] if n.startswith("plot failed:") and "matplotlib" in n], d["notes"]
        assert any("ms_per_token" in r for r in d["rows"])
    assert "plot failed:" in cap.err and "Traceback" not in cap.err  # said beside the JSON, on stderr
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*"))  # no half-written plot, no temp
    # the ceiling given by --read-roof was called "measured earlier in this run": this run measured none
    assert written["params"]["read_ceiling"]["how"] == "given by --read-roof, not measured by this run"


def test_a_hub_cache_repository_folder_names_its_snapshot(tmp_path, capsys):
    # --model models--ORG--NAME (the folder the hub cache shows) said only "no config.json": the model is a snapshot
    snap = tmp_path / "models--HuggingFaceTB--SmolLM2-135M" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    rc, cap = cli(["--model", str(snap.parent.parent), *SMALL], capsys)
    one_line(rc, cap, f"pass its snapshot, --model {snap}")


def test_a_tilde_no_shell_expanded_is_expanded_as_outs_is(tmp_path, monkeypatch, capsys):
    # `--model=~/ck` reaches gpuspeed with its ~ (no shell expands it after '='): it was "no model '~/ck'", where
    # `--out=~/runs` is expanded; now the checkpoint there is read (here: a folder whose config is not a Llama's)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text("{}")
    rc, cap = cli(["--model=~/ck", *SMALL], capsys)
    one_line(rc, cap, "ck: not a Llama checkpoint")


def test_the_decode_benchmarks_merge_without_matplotlib_keeps_the_results(tmp_path, monkeypatch, capsys):
    # benchmarks/decode.py wrote the merged decode.json, then its own plot call raised ImportError past it
    from decode_cli_helpers import benchmark_module

    from gpuspeed.decode import study

    bench = benchmark_module("decode.py")
    run = {"study": "decode", "schema": 1, "command": ["gpuspeed", "decode"], "git": "abc", "created": "c",
           "device": {"name": "NVIDIA H200"}, "versions": {}, "params": {"model": "tiny", "dtype": "fp32"},
           "rows": [{"model": "tiny", "dtype": "fp32", "variant": "V5", "ms_per_token": 0.2}],
           "summary": {"tiny_fp32_best_ms_per_token": 0.2}, "notes": []}
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    bench.finish([run], [], tmp_path, study)
    doc = json.loads((tmp_path / "decode.json").read_text())
    assert doc["summary"]["tiny_fp32_best_ms_per_token"] == 0.2
    assert [n for n in doc["notes"] if n.startswith("plot failed:")], doc["notes"]


def test_inductors_mutation_analysis_fallback_is_not_printed_per_kernel(caplog):
    # notebook 02 on an H100: ~300 lines of 'Encountered an exception in identify_mutated_tensors, assuming every input
    # is mutated' with a traceback each, inductor failing to read our kernels' inline PTX and taking the safe answer
    import logging

    from gpuspeed.decode import variants

    variants._compile(lambda x: x + 1, "eager")
    # the logger the module writes with (torch._dynamo's, not one of its own name: a filter there missed every record)
    from torch._higher_order_ops.triton_kernel_wrap import log
    with caplog.at_level(logging.WARNING):
        for name in ("identify_mutated_tensors", "identify_accessed_tensors"):
            log.warning(f"Encountered an exception in {name}, assuming every input is mutated", exc_info=False)
        log.warning("something else inductor says")
    assert [r.getMessage() for r in caplog.records] == ["something else inductor says"]


def test_asking_a_gguf_for_its_shapes_twice_parses_it_once(monkeypatch, tmp_path):
    # gguf_args parsed the whole file's metadata on every call (~3 s for SmolLM2's 49k-token vocabulary); the reader
    # it kept for the load was there to reuse. A changed file is parsed again. A small llama GGUF written here
    # stands for SmolLM2's: the parses are counted, not timed (three of the real file's were ~9 s of this test)
    import shutil

    from gpuspeed.decode import checkpoints as C
    from test_decode_checkpoints_qa7 import write_gguf

    path = write_gguf(tmp_path / "m.gguf")
    parsed = []
    real = C._open_gguf
    monkeypatch.setattr(C, "_open_gguf", lambda p: parsed.append(p) or real(p))
    first = C.gguf_args(path)
    assert C.gguf_args(path) == first and len(parsed) == 1
    copy = tmp_path / "copy.gguf"
    shutil.copy(path, copy)  # another file: parsed on its own
    assert C.gguf_args(copy).dim == first.dim and len(parsed) == 2
    with open(copy, "ab") as f:  # the same path, changed since
        f.write(b"\0")
    C.gguf_args(copy)
    assert len(parsed) == 3
