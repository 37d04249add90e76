"""QA round 13: `gpuspeed decode` as a user runs it (in a pipe, with bad input) and the decode study's merging
(benchmarks/decode.py --merge/--keep, the summary keys)."""

from __future__ import annotations

import json

from decode_cli_helpers import SMALL, TINY, cli, one_line, run_benchmark
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)


def test_a_run_in_a_pipe_prints_a_line_per_step_on_stderr_and_json_stays_on_stdout(capsys):
    """Off a terminal the rich bar is hidden: a default CPU run (a minute or two) printed nothing until its end."""
    rc, cap = cli(TINY + ["--prompt-len", "3", "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)  # stdout is the document alone
    assert doc["study"] == "decode"
    lines = cap.err.strip().splitlines()
    assert all(ln.startswith("gpuspeed decode [") for ln in lines), cap.err
    said = "\n".join(lines)
    for step in ("loading model", "read ceiling", "now tiny_fp32 V2"):
        assert step in said, said
    # the last step's end is said too: V2's (3/3), or, where a rung read faster than the ceiling measured on a busy
    # machine, the ceiling measured again after it (4/4)
    import re

    assert any(re.search(r" 3/[34] tiny_fp32 V2: ", ln) for ln in lines), lines
    end = re.search(r" (\d+)/(\d+) ", lines[-1])
    assert end and end[1] == end[2] and "now" not in lines[-1], lines
    assert end[1] == "3" or "read ceiling again" in said, lines


# --- the study's merging: benchmarks/decode.py --merge/--keep, decode_tp.py --merge/--merge-int8 -------------------

import copy  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
H100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "sms": 132, "mem_bytes": 85 * 2**30,
        "l2_bytes": 50 * 2**20, "driver": "580.159.04", "clocks": {}}


def _spec(**over):
    from gpuspeed.decode import study

    kw = dict(model="tiny", max_layers=1, prompt_len=3, new_tokens=2, variants=["V2"], hf=False, profile=False,
              bench_budget_s=0.05, device="cpu", read_roof_GBps=20.0)  # a given roof: no ceiling measured
    return study.Spec(**(kw | over))


@pytest.fixture(scope="module")
def runs():
    """Two real CPU runs of a one-layer tiny model (fp32, bf16): the documents `gpuspeed decode --out` writes."""
    from gpuspeed.decode import study

    return {"fp32": study.run(_spec()), "bf16": study.run(_spec(dtype="bf16"))}


def _put(doc, path: Path) -> Path:
    from gpuspeed.results import write_results

    path.mkdir(parents=True, exist_ok=True)
    return write_results(doc, path)


def _bench(*argv, script="decode.py"):
    return run_benchmark(script, *argv)


def _refused(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def on_h100(doc):
    d = copy.deepcopy(doc)
    d["device"] = dict(H100)
    return d


def test_merge_refuses_runs_from_two_devices_and_writes_nothing(tmp_path, runs):
    """A CPU run and an H100 run went into one decode.json stamped with the first run's device, in silence."""
    _put(runs["fp32"], tmp_path / "a" / "runs" / "tiny_fp32")
    _put(on_h100(runs["bf16"]), tmp_path / "b" / "runs" / "tiny_bf16")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "a", tmp_path / "b")
    _refused(p, "different devices", "NVIDIA H100 80GB HBM3", runs["fp32"]["device"]["name"])
    assert not (tmp_path / "out").exists()


def test_keep_refuses_a_file_measured_on_another_device(tmp_path, runs):
    from gpuspeed.decode import study

    _put(runs["fp32"], tmp_path / "new" / "runs" / "tiny_fp32")
    kept = _put(on_h100(study.merge([runs["bf16"]])), tmp_path / "old")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "new", "--keep", kept)
    _refused(p, "different devices", "NVIDIA H100 80GB HBM3", "tiny_bf16")
    assert not (tmp_path / "out").exists()


def test_runs_of_one_device_from_two_commits_merge_and_each_row_names_its_commit(tmp_path, runs):
    """The commits were in params.runs and a note; a row did not say which run (which commit) measured it."""
    a, b = copy.deepcopy(runs["fp32"]), copy.deepcopy(runs["bf16"])
    a["git"], b["git"] = "a" * 40, "b" * 40
    _put(a, tmp_path / "x" / "runs" / "tiny_fp32")
    _put(b, tmp_path / "y" / "runs" / "tiny_bf16")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "x", tmp_path / "y")
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert {(r["dtype"], r["git"]) for r in doc["rows"]} == {("fp32", "a" * 40), ("bf16", "b" * 40)}
    assert any("several commits" in n for n in doc["notes"])


@pytest.mark.parametrize("bad,says", [
    (lambda text: text[:len(text) // 2], "not valid JSON"),  # a run killed as it wrote, a copy cut short
    (lambda text: json.dumps(json.loads(text) | {"study": "roofline"}), "'roofline' results file"),
    (lambda text: "[]", "JSON object"),
])
def test_a_corrupt_or_other_study_run_or_keep_file_is_one_line(tmp_path, runs, bad, says):
    """--merge: a JSONDecodeError/KeyError traceback; --keep: the same, or another study's file kept nothing, exit 0."""
    good = _put(runs["fp32"], tmp_path / "good" / "runs" / "tiny_fp32")
    broken = tmp_path / "broken" / "runs" / "tiny_bf16" / "decode.json"
    broken.parent.mkdir(parents=True)
    broken.write_text(bad(good.read_text()))
    _refused(_bench("--out", tmp_path / "out", "--merge", tmp_path / "good", tmp_path / "broken"), says, str(broken))
    assert not (tmp_path / "out").exists()
    _refused(_bench("--out", tmp_path / "out", "--merge", tmp_path / "good", "--keep", broken), "--keep", says)
    assert not (tmp_path / "out").exists()


def test_keep_of_one_runs_own_decode_json_keeps_it(tmp_path, runs):
    """`gpuspeed decode --out` writes one run's document (no params.runs): --keep of it kept nothing, in silence."""
    _put(runs["fp32"], tmp_path / "new" / "runs" / "tiny_fp32")
    kept = _put(runs["bf16"], tmp_path / "one")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "new", "--keep", kept)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert {r["dtype"] for r in doc["rows"]} == {"fp32", "bf16"}
    assert doc["summary"]["tiny_bf16_best_ms_per_token"] == runs["bf16"]["summary"]["tiny_bf16_best_ms_per_token"]


def test_split_keeps_a_checkpoint_runs_rows_and_keys(tmp_path, runs):
    """A checkpoint's run names its params by path and its rows and keys by model key: split() (--keep) matched
    rows and keys by the path, and the run came back with none of them."""
    import importlib.util

    from gpuspeed.decode import study

    loader = importlib.util.spec_from_file_location("bench_decode_qa13", ROOT / "benchmarks" / "decode.py")
    bench = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(bench)

    ck = copy.deepcopy(runs["fp32"])
    ck["params"]["model"] = "/models/Llama-3.2-1B"  # what run() records for `--model /models/Llama-3.2-1B`
    for r in ck["rows"]:
        r["model"] = study.model_key(ck["params"]["model"])
    ck["summary"] = {k.replace("tiny_", "llama-3.2-1b_", 1): v for k, v in ck["summary"].items()}
    (back,) = bench.split(study.merge([ck]))
    assert len(back["rows"]) == len(ck["rows"]) and back["summary"] == ck["summary"]
    assert bench._key(back) == ("llama-3.2-1b", "fp32", None, 1)
    # the run's folder is named by its model key: an absolute path left --out (out / "runs" / "/models/..._fp32")
    assert bench.run_dir_for(tmp_path, "/models/Llama-3.2-1B", "bf16") == tmp_path / "runs" / "llama-3.2-1b_bf16"


def test_tp_merge_refuses_runs_from_two_devices(tmp_path, runs):
    _put(runs["fp32"], tmp_path / "a" / "runs" / "tiny_fp32_tp1")
    _put(on_h100(runs["bf16"]), tmp_path / "b" / "runs" / "tiny_bf16_tp1")
    p = _bench("--out", tmp_path / "out", "--merge", tmp_path / "a", tmp_path / "b", script="decode_tp.py")
    _refused(p, "different devices", "NVIDIA H100 80GB HBM3")
    assert not (tmp_path / "out").exists()


def test_merge_int8_replaces_the_old_int8_keys_and_refuses_another_devices_file(tmp_path, runs):
    """--merge-int8 added the new run's keys over the old run's: a key the new run lacks (a rung it did not reach)
    stayed, the old run's number beside the new run's rows; an int8 run from an H100 went into the H200's file."""
    from gpuspeed.decode import study

    new = study.run(_spec(dtype="bf16", quant="int8"))
    assert new["summary"]["tiny_int8_best_ms_per_token"] > 0
    old = copy.deepcopy(new)
    old["summary"]["tiny_int8_v0_over_v2"] = 9.5  # the old run reached V0, the new one did not
    into = _put(study.merge([runs["bf16"], old]), tmp_path / "results")
    _put(new, tmp_path / "int8" / "runs" / "tiny_int8_tp1")
    p = _bench("--merge-int8", tmp_path / "int8", "--into", into, script="decode_tp.py")
    assert p.returncode == 0, p.stderr
    doc = json.loads(into.read_text())
    assert "tiny_int8_v0_over_v2" not in doc["summary"]
    assert doc["summary"]["tiny_int8_best_ms_per_token"] == new["summary"]["tiny_int8_best_ms_per_token"]
    assert doc["summary"]["tiny_bf16_best_ms_per_token"] == runs["bf16"]["summary"]["tiny_bf16_best_ms_per_token"]
    _put(on_h100(new), tmp_path / "int8" / "runs" / "tiny_int8_tp1")
    before = into.read_text()
    _refused(_bench("--merge-int8", tmp_path / "int8", "--into", into, script="decode_tp.py"), "different devices")
    assert into.read_text() == before


def test_summary_headline_keys_are_none_when_their_rung_failed_or_was_skipped(runs):
    """V0 failed, V4 skipped by the cap, transformers' static row failed, no read roof: the issue's keys were left
    out (a run-to-run comparison read them as never asked for); now None, and never another row's number."""
    from gpuspeed.decode import study

    v2 = next(r for r in runs["fp32"]["rows"] if r["variant"] == "V2")
    assert v2["ms_per_token"] > 0
    rows = [{"variant": "V0", "error": "RuntimeError: out of memory"}, dict(v2),
            {"variant": "V4", "skipped": "time cap of 1 s reached"}]
    rows[1].pop("pct_of_read_roof", None)  # the ceiling measurement failed: no roof
    hf = [{"variant": "HF static", "error": "decode time not measurable"}, {"variant": "HF dynamic", "ms_per_token": 3.0}]
    spec = _spec(variants=["V0", "V2", "V4"], hf=True)
    s = study.summarize("tiny_fp32", rows, [], hf, spec)
    for key in ("v0_over_v2", "graph_step_speedup", "best_over_hf_static", "pct_of_read_roof"):
        assert s[f"tiny_fp32_{key}"] is None, (key, s)
    assert s["tiny_fp32_best_variant"] == "V2" and s["tiny_fp32_variants_failed_or_skipped"] == 2
    assert "tiny_fp32_graph_compiled_step_speedup" not in s  # V3 and V4c were not asked for
    # asked for nothing it needs: no key (--variants V2 --no-hf)
    s = study.summarize("tiny_fp32", [dict(v2)], [], [], _spec())
    assert not {"tiny_fp32_v0_over_v2", "tiny_fp32_graph_step_speedup", "tiny_fp32_best_over_hf_static"} & set(s)
    assert s["tiny_fp32_pct_of_read_roof"] == v2["pct_of_read_roof"] > 0


def _truncated_gguf(path: Path) -> Path:
    """A llama GGUF cut short: its header and metadata whole, its tensor data cut (a download that stopped)."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed")
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((128, 64)).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 3 // 4])
    return path


@pytest.mark.parametrize("args,needle", [
    (["--variants", "v2,V9", "--prompt-len", "3"], "unknown variant 'V9'"),  # after TINY's --variants: the user's
    (["--batch", "0", "--prompt-len", "3"], "--batch must be >= 1"),
    (["--new-tokens", "-1", "--prompt-len", "3"], "--new-tokens must be >= 2"),
    (["--prompt", ""], "--prompt needs a checkpoint"),
    (["--model", "FOLDER", "--prompt-len", "3"], "no config.json"),  # a folder, but no model's
    (["--model", "GGUF", "--prompt-len", "3"], "not a readable GGUF file"),
])
def test_bad_input_as_a_user_gives_it_is_one_line_and_writes_nothing(tmp_path, capsys, args, needle):
    """Each refused before any work, in one line, exit 2, and --out not made. (--dtype fp16 on the CPU is no
    mistake: it runs, tokens and logits checked against fp32.)"""
    paths = {"FOLDER": lambda: tmp_path, "GGUF": lambda: _truncated_gguf(tmp_path / "m.gguf")}
    args = [str(paths[a]()) if a in paths else a for a in args]
    rc, cap = cli((SMALL if "--model" in args else TINY) + args + ["--out", str(tmp_path / "out")], capsys)
    one_line(rc, cap, needle)
    assert not (tmp_path / "out").exists()


def test_tp_speedup_is_none_between_runs_of_different_work(runs):
    """decode_tp.py --merge of two calls' runs: a tp2 run of 64 new tokens against a tp1 run of 2 gave
    *_tp2_speedup_over_tp1 as if the same decode had run on one GPU and on two."""
    import importlib.util

    loader = importlib.util.spec_from_file_location("bench_decode_tp_qa13", ROOT / "benchmarks" / "decode_tp.py")
    bench = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(bench)
    one = copy.deepcopy(runs["fp32"])
    two = copy.deepcopy(runs["fp32"])  # what a --tp 2 run records: its params' tp, its keys under <label>_tp2_
    two["params"]["tp"] = 2
    two["summary"] = {k.replace("tiny_fp32_", "tiny_fp32_tp2_", 1): v / 2 for k, v in two["summary"].items()
                      if isinstance(v, float)}
    doc = bench.combine([one, two], {}, [], [], 2, [])
    assert doc["summary"]["tiny_fp32_tp2_speedup_over_tp1"] == pytest.approx(2.0)  # the same work: a speedup
    two["params"]["new_tokens"] = 64
    doc = bench.combine([one, two], {}, [], [], 2, [])
    assert doc["summary"]["tiny_fp32_tp2_speedup_over_tp1"] is None
    assert any("tp2_speedup_over_tp1: none" in n and "64" in n for n in doc["notes"]), doc["notes"]
