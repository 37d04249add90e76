"""Round 22 of the decode QA: the rank a --tp failure names, int8 labels, the fit check of study.run, text_tokens."""

import os

import pytest
import torch

from decode_cli_helpers import ROOF, SMALL, TINY, cli, one_line, one_thread  # noqa: F401  (one_thread: autouse)


# --- the rank a --tp failure names ----------------------------------------------------------------------------------

def _rank_error(attempt, rank: int, message: str, monkeypatch) -> str:
    """Rank RANK's error file as torchrun's @record writes it when the rank raises RuntimeError(message)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    path = attempt / str(rank) / "error.json"
    path.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def rank_body():
        raise RuntimeError(message)

    with pytest.raises(RuntimeError):
        rank_body()
    return str(path)


PEER_GONE = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29513"


@pytest.mark.parametrize("both_reported", [False, True])
def test_the_rank_that_raised_is_named_not_the_one_its_exit_disconnected(tmp_path, monkeypatch, both_reported):
    """Rank 1 raised; its exit closed rank 0's connection, and rank 0 raised gloo's 'Connection closed by peer'. The
    launcher reports the first process it sees ended: rank 0 when both ended within one of its polls (or its error file
    came first), and the line named rank 0 and the closed connection. The rank whose error is not its peer's exit is
    named, whether the launcher reported it or only left its error file beside the other's."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from gpuspeed.decode import tp as TP

    attempt = tmp_path / "attempt_0"
    raised = _rank_error(attempt, 1, "out of memory in the step", monkeypatch)
    peer = _rank_error(attempt, 0, PEER_GONE, monkeypatch)
    os.utime(peer, ns=(os.stat(raised).st_mtime_ns - 10**6,) * 2)  # rank 0's file first, as the lead saw it come
    failures = {0: ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file=peer)}
    if both_reported:
        failures[1] = ProcessFailure(local_rank=1, pid=12, exitcode=1, error_file=raised)
    line = TP._failure_line(ChildFailedError("worker", failures))
    assert line == "rank 1 failed: RuntimeError: out of memory in the step"


def test_a_peer_disconnected_alone_is_still_named_with_its_error(tmp_path, monkeypatch):
    """No other rank left an error: the one reported is named with gloo's words (nothing better is known)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from gpuspeed.decode import tp as TP

    peer = _rank_error(tmp_path / "attempt_0", 0, PEER_GONE, monkeypatch)
    line = TP._failure_line(ChildFailedError("worker", {0: ProcessFailure(local_rank=0, pid=11, exitcode=1,
                                                                           error_file=peer)}))
    assert line.startswith("rank 0 failed: RuntimeError: ") and "Connection closed by peer" in line


# --- int8 labels ------------------------------------------------------------------------------------------------------

def test_int8_runs_from_different_dtypes_get_different_labels_and_the_others_keep_theirs():
    """Spec.label() named the quant in place of the dtype: an int8 run from fp32 weights and one from bf16 weights were
    both tiny_int8, and merging them overwrote one's summary keys with the other's. Each run has its own label now, no
    label's keys start with another's, the unquantized (and the bf16 int8) labels the results files use are kept, and
    a results file's params give the label its run had."""
    from gpuspeed.decode.study import Spec, run_label

    specs = [Spec(model="tiny", dtype=dt, quant=q, tp=tp, device="cpu")
             for dt in ("fp32", "bf16", "fp16") for q in (None, "int8") for tp in (1, 2)]
    labels = [s.label() for s in specs]
    assert len(set(labels)) == len(labels), labels
    ones = [s.label() for s in specs if s.tp == 1]  # a tpN label extends its tp1 one by design (the longest wins)
    assert not [(a, b) for a in ones for b in ones if a != b and b.startswith(a + "_")], ones
    assert {s.label() for s in specs if not s.quant and s.tp == 1} == {"tiny_fp32", "tiny_bf16", "tiny_fp16"}
    assert Spec(model="tiny", dtype="bf16", tp=2, device="cpu").label() == "tiny_bf16_tp2"
    assert Spec(model="llama-3-8b", dtype="bf16", quant="int8", device="cpu").label() == "llama-3-8b_int8"
    for s in specs:
        assert run_label({"params": {"model": s.model, "dtype": s.dtype, "quant": s.quant, "tp": s.tp}}) == s.label()


# --- the fit check of study.run ---------------------------------------------------------------------------------------

def test_study_run_refuses_a_model_too_big_for_the_device_before_making_it():
    """study.run (the Python API) skipped the command line's pre-load fit check: a 70B model in fp32 on this host went
    on to make its 280 GB of random weights (here, under an address-space limit, the allocation failed; on a machine
    without one, the OOM killer). It is refused in one line first, as `gpuspeed decode` refuses it."""
    import resource

    from gpuspeed.decode import study
    from gpuspeed.errors import UserError

    from gpuspeed.decode import model as M
    from gpuspeed.device import get_device

    if get_device("cpu").mem_bytes * 0.8 > M.named_config("llama-3-70b").param_count() * 4:
        pytest.skip("this host holds a 70B model in fp32")
    spec = study.Spec(model="llama-3-70b", dtype="fp32", device="cpu", variants=["V2"], new_tokens=2, prompt_len=3,
                      profile=False, hf=False, read_roof_GBps=20)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # a regression fails here on its first large allocation, not by filling the host's memory
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (2 << 30) if hard == resource.RLIM_INFINITY
                                            else min(hard, mapped + (2 << 30)), hard))
    try:
        with pytest.raises(UserError, match=r"llama-3-70b in fp32 needs about 2\d\d\.\d GiB"):
            study.run(spec)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# --- text_tokens of the batch rows ------------------------------------------------------------------------------------

from test_decode_qa16 import PROMPT, eos_first  # noqa: E402,F401  (eos_first: a fixture, the EOS is the first token)


def test_a_batch_row_counts_its_text_to_the_eos_as_the_ladder_rows_do(eos_first, capsys):  # noqa: F811 (a fixture)
    """The model's first token is its EOS: the ladder row's text_tokens was 1 (the text ends there, as the README says),
    the --batches 2 row's 2 x 4 = 8, every token generated (its generation was not told the EOS ids). Both count to
    the EOS now: 1 token, and 2 for two sequences."""
    import json

    rc, cap = cli(["--model", str(eos_first), "--prompt", PROMPT, *SMALL[2:], "--new-tokens", "4", "--batches", "2",
                   "--compile-backend", "eager", "--json", *ROOF], capsys)
    assert rc == 0, cap.err
    rows = json.loads(cap.out)["rows"]
    got = {(r.get("study"), r["batch"]): (r["timed_tokens"], r["text_tokens"]) for r in rows}
    assert got == {("ladder", 1): (3, 1), ("batch", 2): (2 * 3, 2)}, got


# --- the Python API: Spec takes what checkpoints.load takes, and refuses what is not a number in one line ---------------

def test_spec_takes_the_dtype_names_and_torch_dtypes_checkpoints_load_takes():
    """checkpoints.load(path, dtype=torch.bfloat16) and dtype="bfloat16" load, but Spec(dtype=torch.bfloat16) was refused
    ('unknown dtype torch.bfloat16: use fp32, bf16, fp16'): the same model in the same dtype, two APIs. Spec takes them,
    as the short name its results keys and labels use; a dtype no rung runs in is still refused."""
    from gpuspeed.decode import study
    from gpuspeed.errors import UserError

    for given, short in [(torch.bfloat16, "bf16"), ("bfloat16", "bf16"), ("BF16", "bf16"), (torch.float16, "fp16"),
                         ("half", "fp16"), (torch.float32, "fp32"), ("float32", "fp32")]:
        spec = study.Spec(model="tiny", dtype=given, device="cpu")
        study.check_spec(spec)
        assert spec.dtype == short and spec.label() == f"tiny_{short}", given
    with pytest.raises(UserError, match="unknown dtype torch.float64: use fp32, bf16, fp16"):
        study.check_spec(study.Spec(model="tiny", dtype=torch.float64, device="cpu"))


@pytest.mark.parametrize("key,value", [("batch", 1.5), ("new_tokens", 2.0), ("seed", 1.5), ("prompt_len", "4"),
                                       ("max_layers", 1.0), ("long_prompt", 5.0), ("batches", [2.0]), ("tp", True),
                                       ("bench_budget_s", "1"), ("time_cap_s", "5"), ("read_roof_GBps", "20")])
def test_spec_fields_that_are_not_numbers_of_their_kind_are_refused_in_one_line(key, value):
    """Spec(batch=1.5) ended in torch's TypeError from randint, seed=1.5 in manual_seed's RuntimeError, budget "1" in a
    '<' between int and str; new_tokens=2.0, long_prompt=5.0 and batches=[2.0] failed every row they touched mid-run.
    Each is refused before any work, in one line naming the field (Sampling refuses its own so)."""
    from gpuspeed.decode import study
    from gpuspeed.errors import UserError

    with pytest.raises(UserError, match=rf"^{key} must be (an integer|a number|integers)"):
        study.check_spec(study.Spec(**{"model": "tiny", "device": "cpu", "variants": "V2", key: value}))


def test_spec_takes_numpy_numbers_as_python_ones():
    """An integer from NumPy (a sweep's np.arange) is an integer, a NumPy float a number: the type check takes them."""
    import numpy as np

    from gpuspeed.decode import study

    spec = study.Spec(model="tiny", device="cpu", variants="V2", batch=np.int64(2), new_tokens=np.int32(3),
                      batches=np.array([4, 8]), bench_budget_s=np.float64(0.5))
    study.check_spec(spec)
    assert [spec.batch, spec.new_tokens, spec.batches, spec.bench_budget_s] == [2, 3, [4, 8], 0.5]
    assert {type(v) for v in [spec.batch, spec.new_tokens, *spec.batches]} == {int}


@pytest.mark.parametrize("n", [2.5, "5", True, None])
def test_generate_refuses_a_token_count_that_is_not_an_integer(n):
    """generate(engine, prompt, 2.5) ended in torch's TypeError ('float' object cannot be interpreted as an integer),
    "5" in a '<' between str and int, and True generated one token, as 1. Refused in one line; NumPy's ints are taken."""
    import numpy as np

    from gpuspeed.decode import model as M, variants as V
    from gpuspeed.decode.generate import generate
    from gpuspeed.errors import UserError

    m = M.build(M.named_config("tiny", n_layers=1), device="cpu", seed=1)
    prompt = torch.randint(0, m.args.vocab_size, (1, 3), generator=torch.Generator().manual_seed(2))
    engine = V.make_engine("V2", m, 1, 16)
    with pytest.raises(UserError, match="the number of new tokens must be an integer >= 1, got "):
        generate(engine, prompt, n)
    assert generate(engine, prompt, np.int64(3)).shape == (1, 3)


def _tiny_engine_parts():  # built per test: a cached model outlives the file, and test_decode_quant counts models alive
    from gpuspeed.decode import model as M

    m = M.build(M.named_config("tiny", n_layers=1), device="cpu", seed=1)
    prompt = torch.randint(0, 120, (1, 3), generator=torch.Generator().manual_seed(2))  # int8 holds them
    return m, prompt


def test_a_prompt_of_narrow_integers_decodes_as_the_same_ids_in_int64():
    """A uint8 or int16 prompt (ids from a byte-level tokenizer, a compact dataset) passed the check as token ids and
    then failed in torch's embedding ('Expected ... Long, Int; but got torch.ByteTensor'). It decodes now, the tokens
    those of the same ids in int64."""
    from gpuspeed.decode import variants as V
    from gpuspeed.decode.generate import generate

    m, prompt = _tiny_engine_parts()
    want = generate(V.make_engine("V2", m, 1, 16), prompt, 4)
    for dtype in (torch.uint8, torch.int16, torch.int8, torch.int32):
        assert torch.equal(generate(V.make_engine("V2", m, 1, 16), prompt.to(dtype), 4), want), dtype


def test_an_engine_takes_one_eos_id_and_a_sampling_dict_as_spec_does():
    """make_engine(..., eos_ids=2) failed with "'int' object is not iterable" (a tokenizer's eos_token_id is one int),
    and sampling={"temperature": 0.7} with "'dict' object has no attribute 'greedy'" (Spec takes the dict)."""
    from gpuspeed.decode import variants as V
    from gpuspeed.decode.generate import Sampling, generate

    m, prompt = _tiny_engine_parts()
    first = int(generate(V.make_engine("V2", m, 1, 16), prompt, 1)[0, 0])
    got = generate(V.make_engine("V2", m, 1, 16, eos_ids=first), prompt, 4)
    assert got.tolist() == generate(V.make_engine("V2", m, 1, 16, eos_ids=[first]), prompt, 4).tolist()
    assert got[0, 0] == first
    s = {"temperature": 0.7, "top_k": 5, "seed": 3}
    assert torch.equal(generate(V.make_engine("V2", m, 1, 16, sampling=s), prompt, 4),
                       generate(V.make_engine("V2", m, 1, 16, sampling=Sampling(**s)), prompt, 4))


@pytest.mark.parametrize("batch,max_len,needle", [(-1, 16, "batch must be an integer >= 1, got int -1"),
                                                  (1.0, 16, "batch must be an integer >= 1, got float 1.0"),
                                                  (1, 2.5, "max_len must be an integer >= 2, got float 2.5")])
def test_make_engine_refuses_a_batch_or_cache_length_that_is_no_count(batch, max_len, needle):
    """make_engine(name, model, -1, 16) failed in torch.zeros ('Dimension size must be non-negative'), max_len 2.5 in its
    argument unpacking: one line now."""
    from gpuspeed.decode import variants as V
    from gpuspeed.errors import UserError

    m, _ = _tiny_engine_parts()
    with pytest.raises(UserError, match=needle):
        V.make_engine("V2", m, batch, max_len)


def test_checkpoints_load_takes_the_devices_the_command_line_takes(tmp_path):
    """checkpoints.load(path, device="auto") failed in torch ('Expected one of cpu, cuda, ... at start of device string:
    auto'), device="cuda" on a machine without a GPU with torch's 'Torch not compiled with CUDA enabled' (an
    AssertionError), "gpu" with torch's list of every device type. "auto" loads where the study would run; the others
    are gpuspeed's one-line refusals, as Spec(device=...) gives them."""
    import json

    from safetensors.torch import save_file

    from gpuspeed.decode import checkpoints, model as M
    from gpuspeed.device import cuda_available, resolve_device
    from gpuspeed.errors import UserError

    m = M.build(M.named_config("tiny", n_layers=1), device="cpu", seed=3)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(checkpoints.hf_config(m.args)))
    save_file({k: v.contiguous() for k, v in checkpoints.hf_state_dict(m).items()}, tmp_path / "m" / "model.safetensors")
    ck = checkpoints.load(tmp_path / "m", device="auto")
    assert ck.model.device.type == resolve_device("auto")
    with pytest.raises(UserError, match="unknown device 'gpu': use cpu, cuda or auto"):
        checkpoints.load(tmp_path / "m", device="gpu")
    if not cuda_available():
        with pytest.raises(UserError, match="no CUDA device is usable here"):
            checkpoints.load(tmp_path / "m", device="cuda")


def test_study_run_with_tp_runs_the_ranks_as_the_command_line_does(monkeypatch):
    """study.run(Spec(tp=2)) ran the whole model in one process and recorded it as a 2-rank run: summary keys
    tiny_fp32_tp2_*, params tp 2, rows with no tp and no all-reduce in them. It hands the spec to tp.launch now, as
    --tp 2 does, and returns rank 0's document. (The launch itself, 2 processes, is what the --tp CLI tests run; here
    it is recorded, not started: ~9 s of CI for the same path.)"""
    from gpuspeed.decode import study, tp as TP

    calls = []
    monkeypatch.setattr(TP, "launch", lambda spec, n, **kw: calls.append((spec, n, sorted(kw))) or {"rank 0": "doc"})
    spec = study.Spec(model="tiny", max_layers=1, device="cpu", variants="V2", new_tokens=3, prompt_len=4, hf=False,
                      profile=False, bench_budget_s=0.05, read_roof_GBps=20, tp=2)
    assert study.run(spec) == {"rank 0": "doc"}
    assert [(s.tp, n, kw) for s, n, kw in calls] == [(2, 2, ["progress", "total"])]


def test_a_variant_listed_twice_runs_once_as_in_the_string_form():
    """Spec(variants=["V2", "V2"]) (or ["V2", "v2"]) timed V2 twice: two rows of one rung, the summary's v2 keys from
    one of them. variants="V2,v2" ran it once; the list form does now too, in the order given."""
    from gpuspeed.decode import study

    assert study.Spec(model="tiny", device="cpu", variants=["V5", "V2", "v2", "V5"]).variants == ["V5", "V2"]
    assert study.Spec(model="tiny", device="cpu", variants="V5,V2,v2").variants == ["V5", "V2"]


def _run_doc(model, dtype, ms, quant=None):
    """A decode run's document as the study writes one, cut to one row (a merge reads only these fields)."""
    from gpuspeed.decode.study import run_name

    label = run_name(model, dtype, quant, 1)
    return {"study": "decode", "schema": 1, "command": ["gpuspeed", "decode"], "git": "abc", "created": "c",
            "device": {"name": "NVIDIA H200"}, "versions": {}, "params": {"model": model, "dtype": dtype, "quant": quant},
            "rows": [{"model": model, "dtype": dtype, "quant": quant, "variant": "V5", "ms_per_token": ms}],
            "summary": {f"{label}_best_ms_per_token": ms}, "notes": []}


def test_merging_an_int8_run_from_fp32_keeps_the_bf16_int8_run_beside_it(tmp_path):
    """benchmarks/decode_tp.py --merge-int8 replaced every int8 row and run of the model, whatever its dtype: merging
    an int8 run from fp32 weights into a file holding the bf16 one dropped the bf16 int8 rows and run, and left their
    summary keys behind them. Only the same (model, dtype) int8 run is replaced now; both stay, each with its keys."""
    import json

    from decode_cli_helpers import run_benchmark
    from gpuspeed.decode import study

    into = tmp_path / "decode.json"
    into.write_text(json.dumps(study.merge([_run_doc("big", "bf16", 4.0), _run_doc("big", "bf16", 3.0, "int8")])))
    (tmp_path / "int8" / "runs" / "big_int8-fp32").mkdir(parents=True)
    (tmp_path / "int8" / "runs" / "big_int8-fp32" / "decode.json").write_text(
        json.dumps(_run_doc("big", "fp32", 5.0, "int8")))
    p = run_benchmark("decode_tp.py", "--merge-int8", tmp_path / "int8", "--into", into)
    assert p.returncode == 0, p.stderr
    doc = json.loads(into.read_text())
    assert doc["summary"] == {"big_bf16_best_ms_per_token": 4.0, "big_int8_best_ms_per_token": 3.0,
                              "big_int8-fp32_best_ms_per_token": 5.0}
    assert sorted((r["dtype"], r["quant"] or "", r["ms_per_token"]) for r in doc["rows"]) == [
        ("bf16", "", 4.0), ("bf16", "int8", 3.0), ("fp32", "int8", 5.0)]
    assert sorted((r["dtype"], r["quant"] or "") for r in doc["params"]["runs"]) == [
        ("bf16", ""), ("bf16", "int8"), ("fp32", "int8")]


def test_tp_launch_runs_the_spec_as_the_ranks_it_starts(monkeypatch):
    """tp.launch(Spec(tp=1), 2) started 2 ranks whose study was labelled as one process's (tiny_fp32_* keys, params
    tp 1) while its rows said tp 2: merged beside a one-process run, its keys overwrote that run's. The ranks get the
    spec with tp=2. (torchrun's launcher is recorded here, not started: the --tp CLI tests start it.)"""
    import torch.distributed.launcher.api as launcher

    from gpuspeed.decode import study, tp as TP

    given = []

    def recording_launch(config, target):
        return lambda spec: given.append((config.nproc_per_node, spec.tp, spec.label())) or {0: "rank 0's doc"}

    monkeypatch.setattr(launcher, "elastic_launch", recording_launch)
    spec = study.Spec(model="tiny", max_layers=1, device="cpu", variants="V2", tp=1)
    assert TP.launch(spec, 2) == "rank 0's doc"
    assert given == [(2, 2, "tiny_fp32_tp2")] and spec.tp == 1  # the caller's spec as it was
