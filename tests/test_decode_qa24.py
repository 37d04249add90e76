"""Round 24 QA of `gpuspeed decode`: generation semantics, checkpoints and the command line's words, on the CPU."""

from __future__ import annotations

import pytest
import torch

from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread while this module runs)


def _small_model(**over):
    from gpuspeed.decode import model as M

    args = M.ModelArgs(**{**dict(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                 max_seq_len=256, name="t"), **over})
    return M.build(args, device="cpu", dtype=torch.float32, seed=0)


@pytest.mark.parametrize("name", ["V0", "V1", "V2"])
def test_a_generation_past_the_engines_length_is_refused_in_one_line_by_every_rung(name):
    # V0 and V1 ran past max_len into the RoPE table: IndexError on the CPU, a device-side assert (a dead CUDA
    # context) on a GPU; V2+ refused it in one line
    from gpuspeed.decode import variants as V
    from gpuspeed.decode.generate import generate
    from gpuspeed.errors import UserError

    m = _small_model()
    prompt = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    engine = V.make_engine(name, m, 1, 16)
    with pytest.raises(UserError, match="exceed the cache of 16"):
        generate(engine, prompt, 20)
    assert generate(engine, prompt, 10).shape == (1, 10)  # what fits still runs on the same engine


def test_teacher_forced_agreement_is_not_cut_by_the_variants_own_eos():
    # fed the reference's tokens, a rung whose prediction at one step is an EOS id had every later prediction
    # replaced by EOS (its done flag): the agreement fell to the steps before that EOS though each later step,
    # given the reference's prefix, predicted the reference's token (a bf16 rung near an fp32 EOS tie)
    from gpuspeed.decode import study, variants as V
    from gpuspeed.decode.generate import generate

    m = _small_model()
    prompt = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    steps = 12
    ref_engine = V.make_engine("V2", m, 1, V.max_len_for(5, steps + 1))
    ref_logits: list = []
    ref_tokens = generate(ref_engine, prompt, steps + 1, on_logits=lambda x: ref_logits.append(x.float().clone()))
    seq = ref_tokens[0].tolist()
    # an id the reference predicts once, mid-run: as an EOS id, the variant's prediction there ends its text
    eos = next(t for i, t in enumerate(seq) if 0 < i < steps // 2 and seq.count(t) == 1)
    for name in ("V0", "V2"):
        engine = V.make_engine(name, m, 1, V.max_len_for(5, steps + 1), eos_ids=[eos])
        tokens, logits = study.teacher_forced(engine, prompt, ref_tokens, steps)
        got = study._forced_agreement(tokens, ref_tokens, logits, ref_logits)
        assert got["teacher_forced_agreement_vs_fp32"] == 1.0, (name, got)  # the same model: every step agrees


def _cpu_run_words(capsys):
    from decode_cli_helpers import ROOF, TINY, cli

    rc, out = cli([*TINY, *ROOF, "--prompt-len", "3"], capsys)
    assert rc == 0, out.err
    return out.out


def test_a_cpu_run_says_why_it_is_on_the_cpu(capsys):
    from gpuspeed.device import cuda_available

    text = " ".join(_cpu_run_words(capsys).split())  # rich wraps the lines at the console's width
    why = "--device cpu" if cuda_available() else "no CUDA device"
    assert f"{why[:1].upper() + why[1:]}: the ladder runs on the CPU" in text, text  # the line before the table
    assert f"{why}: the CPU runs the ladder" in text, text  # the note, as decode.json holds it


@pytest.mark.gpu
def test_device_cpu_on_a_gpu_machine_does_not_say_there_is_no_cuda_device(capsys):
    # `--device cpu` on a machine with a GPU printed "No CUDA device: the ladder runs on the CPU" and noted "no CUDA
    # device" in decode.json: a user reads that CUDA is broken
    text = " ".join(_cpu_run_words(capsys).split())
    assert "no cuda device" not in text.lower(), text
    assert "--device cpu: the ladder runs on the CPU" in text, text


def test_a_second_run_into_the_same_out_leaves_no_trace_of_a_rung_it_did_not_run(tmp_path, capsys):
    # traces/<label>_<Vn>.trace.json.gz of the first run's rungs stayed beside the second run's decode.json, which
    # names none of them: read as this run's (stale plots were already removed)
    from decode_cli_helpers import ROOF, TINY, cli

    flags = [a for a in TINY if a != "--no-profile"]
    at = flags.index("--variants")
    first = flags[:at] + ["--variants", "V0,V2"] + flags[at + 2:]
    rc, out = cli(["--model", "tiny", *first, *ROOF, "--prompt-len", "3", "--out", str(tmp_path)], capsys)
    assert rc == 0, out.err
    traces = tmp_path / "traces"
    assert {p.name for p in traces.glob("*.trace.json.gz")} == {"tiny_fp32_V0.trace.json.gz",
                                                                 "tiny_fp32_V2.trace.json.gz"}
    (traces / "mine.trace.json.gz").write_bytes(b"")  # not a rung's: left alone
    rc, out = cli(["--model", "tiny", *flags, *ROOF, "--prompt-len", "3", "--out", str(tmp_path)], capsys)
    assert rc == 0, out.err
    assert {p.name for p in traces.glob("*.trace.json.gz")} == {"tiny_fp32_V2.trace.json.gz", "mine.trace.json.gz"}
