"""gpuspeed.decode on the CPU: the model against transformers, the ladder's exact tokens, sampling, EOS, the CLI."""

import json

import pytest
import torch

from gpuspeed.decode import checkpoints as C, model as M, variants as V
from gpuspeed.decode.generate import Sampling, generate, sample
from gpuspeed.verify import check
from decode_cli_helpers import ROOF, one_thread, run_benchmark  # noqa: F401  (one_thread: autouse)

MICRO = dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96)


def micro(name="llama-3.2-1b", seed=1, **over):
    return M.build(M.named_config(name, **(MICRO | over)), seed=seed)


def prompt_for(m, b=2, p=5, seed=0):
    return torch.randint(0, m.args.vocab_size, (b, p), generator=torch.Generator().manual_seed(seed))


def run_all(m, prompt, t, names=None, **kw):
    out = {}
    for name in names or V.ORDER:
        e = V.make_engine(name, m, prompt.shape[0], V.max_len_for(prompt.shape[1], t), compile_backend="eager", **kw)
        out[name] = (generate(e, prompt, t), e)
    return out


def test_named_configs_have_the_issue_shapes():
    s = M.named_config("smollm2-135m")
    assert (s.vocab_size, s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.ffn_dim, s.tie_embeddings) == \
        (49152, 576, 30, 9, 3, 1536, True)
    assert 134e6 < s.param_count() < 136e6  # SmolLM2-135M
    b = M.named_config("llama-3.2-1b")
    assert abs(b.weight_bytes_per_token(2) / 1e9 - 2.47) < 0.03  # the design's floor figure
    e = M.named_config("llama-3-8b")
    assert abs(e.weight_bytes_per_token(2) / 1e9 - 15.0) < 0.1
    with pytest.raises(Exception, match="unknown model"):
        M.named_config("gpt2")


def test_rope_llama3_matches_transformers():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    args = M.named_config("llama-3.2-1b")
    cfg = transformers.LlamaConfig(**{k: v for k, v in C.hf_config(args).items() if k not in ("architectures", "model_type")})
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = M.rope_inv_freq(args)
    assert check(ours, ref, rtol=1e-6).passed
    plain = M.rope_inv_freq(M.named_config("llama-3.2-1b", rope_scaling=None))
    assert not torch.allclose(ours, plain)  # the scaling changes the low frequencies


@pytest.mark.parametrize("tied", [False, True])
def test_hf_folder_logits_and_tokens_match_transformers(tmp_path, tied):
    pytest.importorskip("transformers", reason="transformers not installed")
    pytest.importorskip("safetensors", reason="safetensors not installed")
    from transformers import LlamaForCausalLM

    m = micro(tie_embeddings=tied)
    C.to_hf(m).save_pretrained(tmp_path, max_shard_size="100KB")  # several shards + an index
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ck = C.load(tmp_path)
    ours = ck.model
    assert ours.args.tie_embeddings == tied and ours.args.rope_scaling
    ref = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompt = prompt_for(ours)
    ours.setup_rope(64)
    with torch.no_grad():
        res = check(ours(prompt, torch.arange(prompt.shape[1])), ref(prompt).logits)
    assert res.passed, res.summary
    t = 12
    hf = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=t, min_new_tokens=t,
                      do_sample=False, pad_token_id=0)[:, prompt.shape[1]:]
    e = V.make_engine("V2", ours, 2, V.max_len_for(prompt.shape[1], t))
    assert torch.equal(generate(e, prompt, t), hf)


@pytest.mark.parametrize("name,over", [
    ("tiny", {"n_layers": 2}),  # tiny's shapes (the GPU test runs all 8 layers)
    ("smollm2-135m", {"n_layers": 2}),  # SmolLM2's heads, GQA 9/3, tied 49152 vocabulary; fewer layers
])
def test_every_variant_gives_v0s_tokens_fp32(name, over):
    m = M.build(M.named_config(name, **over), seed=3)
    prompt = prompt_for(m, b=1, p=4)
    runs = run_all(m, prompt, 5)
    ref = runs["V0"][0]
    assert ref.shape == (1, 5)
    for v, (toks, _) in runs.items():
        assert torch.equal(toks, ref), v
    info = runs["V3"][1].info
    assert info["graph_breaks"] == 0 and info["recompiles"] == 0 and info["fullgraph_ok"]


def test_variants_batch_two_and_fused_logits():
    m = micro()
    prompt = prompt_for(m, b=2, p=6)
    logs = {}
    for name in ("V0", "V2", "V5"):
        e = V.make_engine(name, m, 2, V.max_len_for(6, 9), compile_backend="eager")
        rec = []
        toks = generate(e, prompt, 9, on_logits=lambda x, rec=rec: rec.append(x.clone()))
        logs[name] = (toks, torch.stack(rec))
    for name in ("V2", "V5"):
        assert torch.equal(logs[name][0], logs["V0"][0])
        res = check(logs[name][1], logs["V0"][1])
        assert res.passed, (name, res.summary)


def test_decode_restarts_from_the_prefilled_state():
    m = micro()
    prompt = prompt_for(m)
    for name in ("V1", "V2", "V5"):
        e = V.make_engine(name, m, 2, V.max_len_for(5, 8), compile_backend="eager")
        first = e.prefill(prompt)
        a, b = e.decode(first, 7), e.decode(first, 7)
        assert torch.equal(a, b), name


def test_sampling_is_seeded_and_follows_the_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])).repeat(40000, 1)
    s = Sampling(temperature=1.0, seed=7)
    a = sample(logits, s, s.generator("cpu"))
    b = sample(logits, s, s.generator("cpu"))
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=4).float() / a.numel()
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.01), freq
    p = Sampling(temperature=1.0, top_p=0.7, seed=1)
    got = set(sample(logits, p, p.generator("cpu")).tolist())
    assert got == {0, 1}  # 0.5 + 0.3 reaches 0.7: the smallest such prefix
    k = Sampling(temperature=1.0, top_k=1, seed=1)
    assert set(sample(logits, k, k.generator("cpu")).tolist()) == {0}
    with pytest.raises(Exception, match="top-p"):
        Sampling(temperature=1.0, top_p=1.5)


def test_sampled_generation_is_reproducible_across_variants():
    m = micro()
    prompt = prompt_for(m)
    s = Sampling(temperature=0.8, top_k=50, seed=3)
    got = {n: generate(V.make_engine(n, m, 2, V.max_len_for(5, 8), sampling=s, compile_backend="eager"), prompt, 8)
           for n in ("V0", "V2", "V4")}
    assert torch.equal(got["V0"], got["V2"]) and torch.equal(got["V2"], got["V4"])
    greedy = generate(V.make_engine("V2", m, 2, V.max_len_for(5, 8)), prompt, 8)
    assert not torch.equal(got["V2"], greedy)


def test_eos_stops_generation_and_pads_with_eos():
    m = micro()
    prompt = prompt_for(m, b=1)
    t = 24
    free = generate(V.make_engine("V2", m, 1, V.max_len_for(5, t)), prompt, t)[0].tolist()
    at = 3
    eos = free[at]
    stop = free.index(eos)  # the first time the model emits it
    for name in ("V0", "V2", "V4", "V5"):
        e = V.make_engine(name, m, 1, V.max_len_for(5, t), eos_ids=[eos], check_every=4, compile_backend="eager")
        toks = generate(e, prompt, t)[0].tolist()
        assert toks[:stop + 1] == free[:stop + 1], name
        assert all(x == eos for x in toks[stop:]), name
        assert len(toks) < t, name  # stopped early: checked every 4 steps, not run to the end


def _cli(args, capsys):
    from gpuspeed.cli import main

    rc = main(["decode", *args])
    return rc, capsys.readouterr()


@pytest.mark.parametrize("args,needle", [
    (["--model", "/no/such/model.gguf"], "no model"),
    (["--variants", "V0,V9"], "unknown variant"),
    (["--prompt-len", "3000"], "exceeds tiny's context"),
    (["--dtype", "int3"], "unknown dtype"),
    (["--batch", "0"], "--batch"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle, capsys):
    rc, cap = _cli(args + ["--device", "cpu"], capsys)
    assert rc == 2
    assert cap.err.startswith("gpuspeed: error:") and needle in cap.err and len(cap.err.strip().splitlines()) == 1


def test_cli_not_a_llama_and_bad_out(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    rc, cap = _cli(["--model", str(tmp_path), "--device", "cpu"], capsys)
    assert rc == 2 and "not a Llama" in cap.err
    f = tmp_path / "file"
    f.write_text("x")
    rc, cap = _cli(["--out", str(f), "--device", "cpu"], capsys)
    assert rc == 2 and "not a directory" in cap.err


def test_tokens_identical_is_unknown_not_false_without_v0(tmp_path, capsys):
    """Without V0 there is no reference: the summary says None ("-"), not a "NO" that reads as wrong tokens."""
    rc, cap = _cli(["--layers", "1", "--new-tokens", "3", "--prompt-len", "3", "--variants", "V2", "--no-hf",
                    "--budget", "0.05", "--device", "cpu", "--out", str(tmp_path), "--json", *ROOF], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert doc["summary"]["tiny_fp32_tokens_identical"] is None
    assert any("V0 was not measured" in n for n in doc["notes"])


def test_cli_runs_on_the_cpu_and_writes_results(tmp_path, capsys):
    rc, cap = _cli(["--layers", "1", "--new-tokens", "4", "--prompt-len", "3", "--variants", "V0,V2,V4",
                    "--no-hf", "--budget", "0.1", "--device", "cpu", "--out", str(tmp_path), "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    s = doc["summary"]
    assert s["tiny_fp32_tokens_identical"] is True
    assert s["tiny_fp32_best_ms_per_token"] > 0 and s["tiny_fp32_v0_over_v2"] > 0
    rows = {r["variant"]: r for r in doc["rows"]}
    assert rows["V0"]["host_syncs_per_token"] >= 1  # the host-driven rung syncs every token
    assert rows["V2"]["host_syncs_per_token"] < 1  # one copy at the end, not one per token
    written = json.loads((tmp_path / "decode.json").read_text())
    assert written["study"] == "decode" and (tmp_path / "decode_ladder.png").is_file()


def test_runs_stopped_at_different_steps_compare_eos_padded():
    from gpuspeed.decode.study import _same_length

    v0, v2 = torch.tensor([[5, 6, 2]]), torch.tensor([[5, 6, 2, 2, 9, 2]])  # V2 ran on to its next check
    a, b = _same_length(v0, v2, [2])
    assert torch.equal(a, b) and a.shape == (1, 6)
    a, b = _same_length(torch.tensor([[5, 7, 2]]), v2, [2])
    assert not torch.equal(a, b)
    same = torch.tensor([[1, 2, 3]])
    assert _same_length(same, same, None)[0] is same


def test_static_step_does_no_per_layer_mask_work_and_sizes_its_cache_to_the_run():
    from torch.profiler import profile

    m = micro(n_layers=4)  # llama-3.2-1b's context is 131072: nothing may be sized by it
    assert m.args.max_seq_len == 131072
    e = V.make_engine("V2", m, 1, V.max_len_for(5, 8))
    first = e.prefill(prompt_for(m, b=1))
    assert e.cache.k[0].shape[2] == V.max_len_for(5, 8) <= 48 and m.rope_cos.shape[0] <= 48
    steps = 3
    with profile() as p:
        e.decode(first, steps)
    calls = {k.key: k.count for k in p.key_averages()}
    # the first run's V2 was slower than V0: the bool mask was repeated and converted in every layer; now the
    # additive bias is made once per step and broadcast over the folded heads
    assert calls.get("aten::repeat", 0) == 0, calls.get("aten::repeat")
    assert calls.get("aten::masked_fill_", 0) == steps, calls.get("aten::masked_fill_")


def test_float_bias_and_bool_mask_give_the_same_attention():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 8, s, 16, generator=g) for s in (1, 40, 40))
    mask = torch.arange(40)[None, :] <= torch.tensor([17])[:, None]
    ref = M.attention(q.double(), k[:, :2].double(), v[:, :2].double(), mask)
    for m in (mask, M.attn_bias(mask, torch.float32)):
        assert check(M.attention(q, k[:, :2], v[:, :2], m), ref).passed
    q5 = torch.randn(2, 8, 5, 16, generator=g)
    mask5 = torch.ones(5, 40, dtype=torch.bool).tril(diagonal=35)
    ref5 = M.attention(q5.double(), k[:, :2].double(), v[:, :2].double(), mask5)
    assert check(M.attention(q5, k[:, :2], v[:, :2], M.attn_bias(mask5, torch.float32)), ref5).passed


@pytest.mark.parametrize("name", V.ORDER)
def test_teacher_forced_decode_predicts_from_the_given_prefix(name):
    m = micro(seed=5)
    prompt = prompt_for(m, b=2, p=5)
    t = 7
    alt = torch.randint(0, m.args.vocab_size, (2, t), generator=torch.Generator().manual_seed(9))
    e = V.make_engine(name, m, 2, V.max_len_for(5, t), compile_backend="eager")
    generate(e, prompt, t)  # a free run first: forcing must restart from the prefilled state, as timing does
    e.prefill(prompt)
    got = e.decode(alt[:, 0], t - 1, forced=alt[:, 1:])
    # what a model that saw prompt + alt[:, :i + 1] predicts next, from one forward over the whole sequence
    seq = torch.cat([prompt, alt[:, :-1]], dim=1)
    m.setup_rope(seq.shape[1])
    want = m(seq, torch.arange(seq.shape[1]))[:, 5:].argmax(-1)
    assert torch.equal(got, want), (name, got, want)
    free = generate(V.make_engine(name, m, 2, V.max_len_for(5, t), compile_backend="eager"), prompt, t)
    e.prefill(prompt)
    assert torch.equal(e.decode(free[:, 0], t - 1, forced=free[:, 1:]), free[:, 1:])  # its own tokens: itself


def test_study_times_eager_rungs_over_fewer_steps_and_reports_teacher_forced_agreement(monkeypatch):
    import dataclasses

    from gpuspeed.decode import model as M, study

    # a quarter of tiny's width and a 1024-token vocabulary: the CPU's bf16 linears were most of this test's ~23 s;
    # the free runs still part from fp32's tokens (~0.4 agreement) while the teacher-forced ones stay ~0.97
    small = dict(vocab_size=1024, dim=128, ffn_dim=344, n_heads=4, n_kv_heads=4)
    monkeypatch.setitem(M.CONFIGS, "tiny", dataclasses.replace(M.CONFIGS["tiny"], **small))
    spec = study.Spec(model="tiny", dtype="bf16", variants=["V0", "V2", "V4"], max_layers=1, prompt_len=4,
                      new_tokens=study.EAGER_TIMED_STEPS + 6, hf=False, profile=False, bench_budget_s=0.05,
                      compile_backend="eager", device="cpu", read_roof_GBps=20.0)  # a given roof: no ceiling pass
    doc = study.run(spec)
    rows = {r["variant"]: r for r in doc["rows"]}
    assert [r["variant"] for r in doc["rows"]] == ["V0", "V2", "V4"]  # the ladder's order, though V4 ran first
    t = spec.new_tokens - 1
    assert rows["V0"]["timed_steps"] == rows["V2"]["timed_steps"] == study.EAGER_TIMED_STEPS < t
    assert rows["V4"]["timed_steps"] == t
    assert rows["V0"]["reference"] and rows["V2"]["tokens_identical_to_V0"] is not None
    for r in rows.values():
        # the same prefix at every step: bf16 picks fp32's token nearly always, whatever the free run did
        assert r["teacher_forced_agreement_vs_fp32"] >= 0.9, r
        assert r["teacher_forced_steps"] == r["timed_steps"] + 1
        assert 0 < r["teacher_forced_rel_logit_err_vs_fp32"] < 0.1
        assert r["token_agreement_vs_fp32"] is not None
    s = doc["summary"]
    assert s["tiny_bf16_min_teacher_forced_agreement_vs_fp32"] >= 0.9
    assert s["tiny_bf16_max_teacher_forced_logit_err_vs_fp32"] > 0


def _two_rung_spec(**kw):
    """The decode study at its smallest on the CPU: tiny with one layer, V0 and V2, no transformers rows."""
    from gpuspeed.decode import study

    return study.Spec(model="tiny", dtype="fp32", variants=["V0", "V2"], max_layers=1, prompt_len=4, new_tokens=4,
                      hf=False, bench_budget_s=0.02, compile_backend="eager", device="cpu", agreement=False,
                      read_roof_GBps=20.0, **kw)  # a given roof: no read-ceiling pass (these tests are about profiles)


def test_study_profiles_every_rung_only_after_every_timing(monkeypatch, tmp_path):
    """A torch.profiler session leaves CUPTI attached (later launches cost more host time), so the study times
    every rung and transformers row before it profiles any; each row still gets its profile columns."""
    import gpuspeed
    from gpuspeed.decode import study
    from gpuspeed.profiling import run as profiling_run

    calls = []
    real_bench, real_trace = gpuspeed.bench, profiling_run.record_trace

    def bench(*a, **kw):
        calls.append("bench")
        return real_bench(*a, **kw)

    def record_trace(*a, **kw):
        calls.append("profile")
        return real_trace(*a, **kw)

    monkeypatch.setattr(gpuspeed, "bench", bench)
    monkeypatch.setattr(profiling_run, "record_trace", record_trace)
    spec = _two_rung_spec(out=str(tmp_path))
    doc = study.run(spec)
    assert calls.count("profile") == 2 and "bench" not in calls[calls.index("profile"):], calls
    for r in doc["rows"]:
        assert "profile_error" not in r, r
        assert r["host_syncs_per_token"] is not None and r["profiled_tokens"] > 0, r
        assert (tmp_path / "traces" / f"tiny_fp32_{r['variant']}.trace.json.gz").exists()


def test_study_keeps_time_inside_its_cap_for_the_profiling_passes(monkeypatch):
    """The passes run after every timing; a task that would leave them no room past the cap is skipped, so a
    driver's kill at the cap does not take them."""
    from gpuspeed.decode import study

    monkeypatch.setattr(study, "PROFILE_PASS_RESERVE_S", 1e6)  # one pending pass outweighs the whole cap
    spec = _two_rung_spec(time_cap_s=1e5)
    rows = {r["variant"]: r for r in study.run(spec)["rows"]}
    timed = [v for v, r in rows.items() if "ms_per_token" in r]
    skipped = [v for v, r in rows.items() if "skipped" in r]
    assert len(timed) == 1 and len(skipped) == 1, rows  # the first rung ran with nothing pending; the second not
    assert rows[timed[0]]["profiled_tokens"] > 0  # and its pass ran


def test_a_pass_that_breaks_the_cuda_context_costs_the_later_passes_not_the_run(monkeypatch):
    """After a CUDA error (an illegal address) every later call on the device fails: the rungs still waiting for
    their pass say why they have no profile, and the results document is still made."""
    from gpuspeed.decode import study
    from gpuspeed.profiling import run as profiling_run

    traced, real_trace, real_free = [], profiling_run.record_trace, study._free

    def record_trace(*a, **kw):
        traced.append(1)
        return real_trace(*a, **kw)

    def free(device):
        if traced:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        real_free(device)

    monkeypatch.setattr(profiling_run, "record_trace", record_trace)
    monkeypatch.setattr(study, "_free", free)
    spec = _two_rung_spec()
    doc = study.run(spec)
    rows = [r for r in doc["rows"] if "ms_per_token" in r]
    assert len(rows) == 2 and len(traced) == 1
    profiled = [r for r in rows if r.get("profiled_tokens")]
    skipped = [r for r in rows if "earlier pass broke" in (r.get("profile_error") or "")]
    assert len(profiled) == 1 and len(skipped) == 1, rows
    assert any("profiling stopped after" in n for n in doc["notes"])
    assert doc["summary"]["tiny_fp32_tokens_identical"] is True


def test_v5_judges_its_insides_against_the_reference_fed_its_tokens():
    """A faster insides candidate replaces the compiled graph when, fed the fp32 reference's tokens, its logits lie
    about as close to the reference's; the free-running token rule only decides without a reference."""
    from gpuspeed.decode import study, variants as V
    from gpuspeed.decode.generate import generate

    assert V.insides_acceptable(0.0, 0.0330, 0.0317)  # as close to fp32: kept whatever its tokens did
    assert not V.insides_acceptable(1.0, 0.05, 0.0317)  # same tokens, farther from fp32: not kept
    assert V.insides_acceptable(0.95, None, None) and not V.insides_acceptable(0.41, None, None)

    spec = study.Spec(model="tiny", dtype="bf16", max_layers=1, prompt_len=5, new_tokens=7, device="cpu")
    ck, ref_model = study.load_model(spec, "cpu")
    prompt, _ = study.make_prompt(spec, ck, "cpu")
    tokens, logits = study._reference(ref_model, spec, prompt, None)
    engine = V.make_engine("V5", ck.model, 1, V.max_len_for(5, 7), compile_backend="eager", reference=(tokens, logits))
    generate(engine, prompt, 7)
    n = engine._reference_steps(32)
    assert n == tokens.shape[1] - 1 == 6
    err = engine._reference_error(n)
    assert 0 < err < 0.1  # bf16 against fp32 on the same tokens: rounding, not a different prediction
    # the same comparison sees a reference moved by a tenth of its scale
    g = torch.Generator().manual_seed(1)
    moved = [x + 0.1 * x.abs().max() * torch.randn(x.shape, generator=g) for x in logits]
    engine.reference = (tokens, moved)
    assert engine._reference_error(n) > 2 * err
    # no reference, or one for another batch: no judgement (the token rule decides)
    engine.reference = (tokens.repeat(2, 1), logits)
    assert engine._reference_steps(32) == 0


def _decode_benchmark():
    """benchmarks/decode.py as a module (it is a script, not part of the package)."""
    from decode_cli_helpers import benchmark_module

    return benchmark_module("decode.py")


def test_benchmark_merge_keeps_the_models_a_new_run_does_not_cover(tmp_path):
    """benchmarks/decode.py --merge RUN --keep OLD: the re-run model's rows and keys replace the old ones; the
    other models keep theirs, each stamped with its own commit in params.runs."""
    from gpuspeed.decode import study

    bench = _decode_benchmark()

    def run(model, dtype, ms, git, quant=None):
        label = f"{model}_{'int8' if quant else dtype}"
        # one device for all: runs of two devices are refused (test_decode_qa13)
        return {"study": "decode", "schema": 1, "command": ["gpuspeed", "decode"], "git": git, "created": "c-" + git,
                "device": {"name": "NVIDIA H200"}, "versions": {},
                "params": {"model": model, "dtype": dtype, "quant": quant},
                "rows": [{"model": model, "dtype": dtype, "quant": quant, "variant": "V5", "ms_per_token": ms}],
                "summary": {f"{label}_best_ms_per_token": ms}, "notes": [f"{label} note"]}

    old = study.merge([run("tiny", "fp32", 0.2, "aaa"), run("big", "bf16", 4.0, "aaa"),
                       run("big", "bf16", 3.0, "aaa", quant="int8")])
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new" / "runs" / "tiny_fp32").mkdir(parents=True)
    (tmp_path / "new" / "runs" / "tiny_fp32" / "decode.json").write_text(json.dumps(run("tiny", "fp32", 0.1, "bbb")))
    assert [bench._key(d) for d in bench.split(old)] == [("tiny", "fp32", None, 1), ("big", "bf16", None, 1),
                                                         ("big", "bf16", "int8", 1)]
    p = run_benchmark("decode.py", "--out", tmp_path / "out", "--merge", tmp_path / "new", "--keep",
                      tmp_path / "old.json")
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "out" / "decode.json").read_text())
    assert doc["summary"] == {"tiny_fp32_best_ms_per_token": 0.1, "big_bf16_best_ms_per_token": 4.0,
                              "big_int8_best_ms_per_token": 3.0}
    assert sorted((r["model"], r.get("quant") or "", r["ms_per_token"]) for r in doc["rows"]) == [
        ("big", "", 4.0), ("big", "int8", 3.0), ("tiny", "", 0.1)]
    assert {(r["model"], r["git"]) for r in doc["params"]["runs"]} == {("tiny", "bbb"), ("big", "aaa")}
    assert doc["git"] == "bbb" and any("several commits" in n for n in doc["notes"])
    assert "tiny_fp32 note" in doc["notes"] and "big_int8 note" in doc["notes"]


def test_benchmark_merge_drops_replaced_runs_stamp_notes_and_refuses_an_empty_merge(tmp_path):
    # a note on a git stamp corrected to another run's commit goes with that run; a merge of nothing is bad input:
    # one line, exit 2, no empty --out left behind
    bench = _decode_benchmark()
    note = "git corrected after the run from 5830fb9 (a stale copy) to 5b6b30f, the commit whose tree the call ran"
    assert bench._names_run(note, "5b6b30ffa00c") and not bench._names_run(note, "5d8df7f32a22")
    assert bench._names_run("any other note", "5d8df7f32a22")
    p = run_benchmark("decode.py", "--out", tmp_path / "out", "--merge", tmp_path / "nothing")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "no runs/*/decode.json" in p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,says", [
    (["--models", "bogus:fp32"], "neither a named model"),
    (["--models", "tiny:fp99"], "DTYPE one of"),
    (["--models", "tiny"], "DTYPE one of"),
    (["--merge", "x", "--keep", "/nonexistent/old.json"], "no such file"),
    (["--keep", "old.json"], "--keep needs --merge"),
])
def test_benchmark_refuses_bad_input_in_one_line_before_making_out(tmp_path, argv, says):
    p = run_benchmark("decode.py", "--out", tmp_path / "out", *argv)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and says in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_graph_notes_keep_this_runs_warnings_not_library_deprecations(monkeypatch):
    """A graphed rung records the warnings its compile and capture raise (no CUDA: eager) as notes, but not a
    library's DeprecationWarning or FutureWarning, which says nothing about the run (torch 2.13's script_method)."""
    import warnings

    m = micro("tiny", n_layers=1)
    prompt = prompt_for(m, b=1, p=3)
    e = V.make_engine("V4", m, 1, V.max_len_for(3, 3), compile_backend="eager")
    inner = e._inner

    def noisy():
        warnings.warn("`torch.jit.script_method` is deprecated", DeprecationWarning, stacklevel=2)
        warnings.warn("a future default", FutureWarning, stacklevel=2)
        return inner()

    e._inner = noisy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the replays after the capture warn too, outside what it records
        first = e.prefill(prompt)
        e.decode(first, 2)
    notes = e.info["notes"]
    assert not any("deprecated" in n or "future default" in n for n in notes), notes
    if not torch.cuda.is_available():
        assert any("runs the function eagerly" in n for n in notes), notes


def test_hf_rows_match_our_tokens_where_the_config_names_an_eos_we_emit(monkeypatch):
    """transformers must not hold back the EOS id its config names (min_new_tokens did, and greedy then chose
    another token than ours: "tokens = V0: NO" on a model that agreed)."""
    pytest.importorskip("transformers", reason="transformers not installed")
    from gpuspeed.decode import study

    m = micro()
    prompt = prompt_for(m, b=1)
    t = 8
    ours = generate(V.make_engine("V0", m, 1, V.max_len_for(prompt.shape[1], t)), prompt, t)
    eos = int(ours[0, 2])  # a token our greedy run emits mid-way
    plain = C.hf_config
    monkeypatch.setattr(C, "hf_config", lambda a: plain(a) | {"eos_token_id": eos})
    spec = study.Spec(new_tokens=t, bench_budget_s=0.05, device="cpu")
    row = study.hf_row(C.to_hf(m), "HF dynamic", m, spec, prompt, "cpu", ours)
    assert row["tokens_identical_to_V0"] is True


@pytest.mark.parametrize("args,needle", [
    (["--read-roof", "-3"], "--read-roof"),
    (["--budget", "-2"], "--budget"),
    (["--budget", "0"], "--budget"),
    (["--time-cap", "-1"], "--time-cap"),
    (["--compile-backend", "bogus", "--variants", "V3"], "--compile-backend"),
    (["--variants", ""], "names no variant"),
])
def test_cli_bad_numbers_and_backends_are_one_line_exit_2(args, needle, capsys):
    rc, cap = _cli(["--layers", "1", "--new-tokens", "2", "--prompt-len", "3", "--no-hf", "--no-profile",
                    "--device", "cpu"] + args, capsys)
    assert rc == 2, cap.err
    assert cap.err.startswith("gpuspeed: error:") and needle in cap.err and len(cap.err.strip().splitlines()) == 1


def test_long_prompt_runs_the_best_rung_when_only_later_rungs_are_asked_for(capsys):
    rc, cap = _cli(["--layers", "1", "--new-tokens", "3", "--prompt-len", "3", "--variants", "V1", "--long-prompt",
                    "12", "--no-hf", "--no-profile", "--budget", "0.05", "--device", "cpu", "--json", *ROOF], capsys)
    assert rc == 0, cap.err
    long = [r for r in json.loads(cap.out)["rows"] if r.get("study") == "long_prompt"]
    assert long and "error" not in long[0] and long[0]["variant"] == "V1", long


def test_broken_hf_folders_are_one_line_errors(tmp_path):
    """A config.json missing a field or holding the wrong kind, an unsupported rope scaling, a broken index or
    safetensors file, an untied config without its head: each a UserError naming it, before any work."""
    pytest.importorskip("transformers", reason="transformers not installed")
    pytest.importorskip("safetensors", reason="safetensors not installed")
    from gpuspeed.errors import UserError

    good = tmp_path / "good"
    C.to_hf(micro(tie_embeddings=False)).save_pretrained(good)
    cfg = json.loads((good / "config.json").read_text())

    def folder(name, config=None, drop=None, weights=None):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg if config is None else config))
        src = good / "model.safetensors"
        if weights is not None:
            (d / "model.safetensors").write_bytes(weights)
        elif drop:
            from safetensors.torch import load_file, save_file

            save_file({k: v for k, v in load_file(src).items() if k != drop}, d / "model.safetensors")
        else:
            (d / "model.safetensors").write_bytes(src.read_bytes())
        return d

    cases = {
        folder("no_heads", {k: v for k, v in cfg.items() if k != "num_attention_heads"}): "lacks 'num_attention_heads'",
        folder("a_list", [cfg]): "config.json is a JSON list",
        folder("bad_value", cfg | {"hidden_size": "sixty"}): "has a bad value",
        folder("linear_rope", cfg | {"rope_parameters": {"rope_type": "linear", "factor": 4.0}}): "'linear' is not supported",
        folder("half_llama3", cfg | {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}): "llama3 rope scaling needs",
        folder("truncated", weights=(good / "model.safetensors").read_bytes()[:100]): "cannot read it as safetensors",
        folder("no_head", cfg | {"tie_word_embeddings": False}, drop="lm_head.weight"): "has no lm_head.weight",
    }
    for path, words in cases.items():
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            C.load(path)
    idx = folder("bad_index")
    (idx / "model.safetensors").rename(idx / "model-00001-of-00001.safetensors")  # else the index is not read
    (idx / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(UserError, match="not a safetensors index"):
        C.load(idx)


@pytest.mark.parametrize("t", [float("nan"), float("inf"), 1e-45, -1.0])
def test_temperatures_that_would_overflow_are_refused(t):
    from gpuspeed.errors import UserError

    with pytest.raises(UserError, match="temperature must be 0"):
        Sampling(temperature=t)


def test_a_tokenizer_past_the_models_vocab_is_refused():
    """On a GPU an id past the embedding is a device-side assert that kills the context: refuse it up front."""
    import types

    from gpuspeed.decode.study import Spec, make_prompt
    from gpuspeed.errors import UserError

    m = micro()  # vocab 256
    tok = lambda text, return_tensors: types.SimpleNamespace(input_ids=torch.tensor([[5, 300, 7]]))  # noqa: E731
    ck = types.SimpleNamespace(model=m, tokenizer=lambda: tok, add_bos=False, bos_id=None)
    with pytest.raises(UserError, match="token id 300, past the model's vocab of 256"):
        make_prompt(Spec(prompt="hello", new_tokens=4), ck, "cpu")


def test_sampled_runs_compare_like_with_like():
    """Under sampling transformers (greedy here) is not compared with V0, and the fp32 reference samples with the
    same seed, so a bf16 rung's agreement with it is a measurement, not 0 by construction."""
    pytest.importorskip("transformers", reason="transformers not installed")
    import dataclasses

    from gpuspeed.decode import study

    m = micro()
    prompt = prompt_for(m, b=1)
    t = 8
    s = Sampling(temperature=0.8, top_k=50, seed=3)
    ours = generate(V.make_engine("V0", m, 1, V.max_len_for(prompt.shape[1], t), sampling=s), prompt, t)
    spec = study.Spec(new_tokens=t, bench_budget_s=0.05, device="cpu", sampling=s)
    row = study.hf_row(C.to_hf(m), "HF dynamic", m, spec, prompt, "cpu", ours)
    assert "tokens_identical_to_V0" not in row
    ref_tokens, _ = study._reference(m, spec, prompt, None)
    assert torch.equal(ref_tokens, ours)  # fp32 against fp32 with the same seed: the same draws, the same tokens
    greedy, _ = study._reference(m, dataclasses.replace(spec, sampling=Sampling()), prompt, None)
    assert not torch.equal(greedy, ours)
