"""QA round 16: `gpuspeed decode` on the CPU: a model whose EOS comes first (every rung must time the same work), a
failing tensor-parallel rank (the run ends at once, in one line), and a demanding user's flags and checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from decode_cli_helpers import ROOF, SMALL, cli, random_hf_llama
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)
from test_decode_qa15 import BASE, save_tokenizer, words

PROMPT = words(3)


@pytest.fixture
def eos_first(tmp_path):
    """A random Llama folder whose EOS id is the greedy first token after PROMPT: generation ends at once."""
    from gpuspeed.decode import checkpoints, study, variants as V
    from gpuspeed.decode.generate import generate

    d = tmp_path / "eos-first"
    random_hf_llama(BASE).save_pretrained(d)
    save_tokenizer(d)
    ck = checkpoints.load(str(d), device="cpu", dtype=torch.float32)
    prompt, _ = study.make_prompt(study.Spec(model=str(d), prompt=PROMPT, new_tokens=2), ck, "cpu")
    engine = V.make_engine("V2", ck.model, 1, V.max_len_for(prompt.shape[1], 2))
    first = int(generate(engine, prompt, 1)[0, 0])
    for name in ("config.json", "generation_config.json"):
        f = d / name
        if f.exists():
            f.write_text(json.dumps(json.loads(f.read_text()) | {"eos_token_id": first}))
    return d


def test_an_eos_first_times_the_same_steps_on_every_rung_and_the_text_still_stops(eos_first, capsys):
    """The model's first token was its EOS: V0 timed 1 decode step, V2 and V5 16 (their first EOS check), so the
    ladder's ms/token and speedups compared different work, and tokens/s was 0. A benchmark times the same tokens on
    every rung, EOS ignored (llama.cpp's and vLLM's ignore-EOS); the text shown still ends at the EOS."""
    t = 20
    rc, cap = cli(["--model", str(eos_first), "--prompt", PROMPT, *SMALL[2:], "--new-tokens", str(t),
                   "--variants", "V0,V2,V5", "--compile-backend", "eager", "--json", *ROOF], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"V0", "V2", "V5"}
    for name, r in rows.items():
        assert r["timed_steps"] == t - 1, (name, r["timed_steps"])
        assert r["timed_tokens"] == t - 1, name  # batch 1: a token a step
        assert r["text_tokens"] == 1, name  # the EOS itself: the text ends there
        assert r["tokens_per_s"] == pytest.approx(r["timed_tokens"] / (r["decode_ms"] / 1e3)), name
        assert r["text"] == doc["params"]["texts"][name] and len(r["text"].split()) == 1, r["text"]
    assert doc["summary"]["eos-first_fp32_b1_tokens_per_s"] > 0
    assert not any("different steps" in n for n in doc["notes"]), doc["notes"]
    said = [n for n in doc["notes"] if "EOS" in n]
    assert len(said) == 1 and f"after 1 of the {t} tokens asked for;" in said[0], doc["notes"]
    assert f"V0 {t - 1}, V2 {t - 1}, V5 {t - 1}" in said[0]


def test_an_eos_in_a_batch_counts_the_texts_against_every_sequences_tokens(eos_first, capsys):
    """--batch 2: the note said 'after 2 tokens (over 2 sequences) of the 6 asked for', two sequences' tokens against
    one sequence's count."""
    rc, cap = cli(["--model", str(eos_first), "--prompt", PROMPT, *SMALL[2:], "--new-tokens", "6", "--batch", "2",
                   "--json", *ROOF], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    (row,) = doc["rows"]
    assert (row["timed_tokens"], row["text_tokens"]) == (2 * 5, 2)
    said = [n for n in doc["notes"] if "EOS" in n]
    assert len(said) == 1 and "after 2 of the 12 tokens asked for (2 sequences of 6);" in said[0], said


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_an_eos_first_on_a_gpu_times_the_same_steps_through_the_graphs(eos_first, capsys):
    """The captured rungs (V4 one step a replay, V5 four) run every timed step past the EOS as the eager ones do."""
    t = 20
    rc, cap = cli(["--model", str(eos_first), "--prompt", PROMPT, "--no-hf", "--no-profile", "--budget", "0.1",
                   "--device", "cuda", "--new-tokens", str(t), "--variants", "V0,V4,V5", "--compile-backend", "eager",
                   "--json"], capsys)
    assert rc == 0, cap.err
    rows = {r["variant"]: r for r in json.loads(cap.out)["rows"]}
    assert {n: (r["timed_steps"], r["text_tokens"]) for n, r in rows.items()} == {n: (t - 1, 1) for n in rows}, rows
    assert all(r["tokens_identical_to_V0"] for r in rows.values())


# --- --tp N: one rank failing mid-run ---------------------------------------------------------------------------------

TP_SMALL = ["--model", "tiny", "--layers", "1", "--new-tokens", "3", "--prompt-len", "4", "--device", "cpu",
            "--no-profile", "--budget", "0.1", "--compile-backend", "eager", "--tp", "2", *ROOF]


def _tp_run(args, env, limit=150):
    """`gpuspeed decode ARGS` in its own process group with env added: (exit code, stderr, seconds); a run still going
    after `limit` seconds is killed, group and all, and the test fails on it."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from signal_helpers import at_a_terminal

    root = Path(__file__).resolve().parents[1]
    e = dict(os.environ, PYTHONPATH=str(root / "src"), **env)
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "gpuspeed", "decode", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=e, cwd=root, start_new_session=True,
                         preexec_fn=at_a_terminal)
    try:
        _, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"a failing rank left the run going for {limit} s (the others waited in a collective)")
    return p.returncode, err, time.perf_counter() - t


@pytest.mark.parametrize("rank", [1, 0])
def test_a_rank_failing_in_a_timed_step_ends_the_run_at_once_in_one_line(tmp_path, rank):
    """Rank 1 raised in a timed decode step (as an OOM would): study.run recorded the rung's error and went on, while
    rank 0 waited in the step's collective until the process group's timeout (600 s), and the error line then named
    gloo's timeout, not the cause. Rank 0 raising there waited as long: its timing's cleanup sent 'stop' on the
    control group while rank 1 sat in the step's collective. The failing rank now ends the run: one line naming it and
    its error, exit 2."""
    import os
    import time

    from gpuspeed.decode import tp as TP
    from signal_helpers import tagged_processes

    tag = f"qa16-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "out"
    rc, err, took = _tp_run([*TP_SMALL, "--variants", "V2", "--out", str(out), "--json"],
                            {TP.FAIL_ENV: f"{rank}:raise:step", "GPUSPEED_TEST_TAG": tag}, limit=90)
    assert rc == 2, err[-2000:]
    said = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("gpuspeed decode [")]
    assert said == [f"gpuspeed: error: rank {rank} failed: RuntimeError: failure injected by "
                    f"{TP.FAIL_ENV}={rank}:raise:step"], err[-2000:]
    assert took < 60, took  # the ranks start in ~10 s on 2 cores: nothing waited for a timeout
    assert not tagged_processes(tag)
    assert not (out / "decode.json").exists() and not (out / "decode.partial.json").exists()


def test_a_rank_that_raises_is_named_not_the_one_stopped_after_it(tmp_path):
    """Rank 0 raised as it started: the line said 'rank 1 failed: killed by SIGSEGV' (rank 1, stopped after it, crashed
    in its teardown, and torchrun's first failure is by whole seconds). The rank that raised, and its error, are named."""
    from gpuspeed.decode import tp as TP

    rc, err, _ = _tp_run([*TP_SMALL, "--variants", "V2", "--json"], {TP.FAIL_ENV: "0:raise"}, limit=90)
    assert rc == 2, err[-2000:]
    said = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("gpuspeed decode [")]
    assert said == [f"gpuspeed: error: rank 0 failed: RuntimeError: failure injected by {TP.FAIL_ENV}=0:raise"], err


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_a_rank_failing_in_a_timed_step_on_gpus_ends_the_run_at_once(tmp_path):
    """NCCL ranks: rank 1 raises in a timed step while rank 0 waits in its all-reduce; the run ends in one line, in
    seconds (rank 1's teardown must not wait on rank 0's pending collective), with no process left."""
    import os
    import time

    from gpuspeed.decode import tp as TP
    from signal_helpers import tagged_processes

    tag = f"qa16-gpu-{os.getpid()}-{time.time_ns()}"
    args = [a if a != "cpu" else "cuda" for a in TP_SMALL]
    rc, err, took = _tp_run([*args, "--variants", "V2", "--json"], {TP.FAIL_ENV: "1:raise:step", "GPUSPEED_TEST_TAG": tag},
                            limit=240)
    assert rc == 2, err[-3000:]
    said = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("gpuspeed decode [")]
    assert said[-1].startswith("gpuspeed: error: rank 1 failed: RuntimeError: failure injected"), err[-3000:]
    assert took < 120, took
    assert not tagged_processes(tag)


# --- a demanding user's flags -----------------------------------------------------------------------------------------

def test_all_inside_a_list_of_variants_is_refused_in_words_that_fit(capsys):
    """--variants V2,all said "unknown variant 'all': use V0, ..., V5 or all": it refused 'all' and offered it."""
    from decode_cli_helpers import TINY, one_line

    rc, cap = cli([*TINY, "--variants", "V2,all"], capsys)
    one_line(rc, cap, "'all' is every rung: give it alone")
    assert "unknown variant" not in cap.err


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_file_of_a_model_folder_given_as_the_model_names_the_folder(tmp_path, capsys, name):
    """--model my-llama/model.safetensors (the file a user downloaded, a bf16 safetensors) said only "not a GGUF file
    or a folder with config.json and safetensors": the folder beside it, which loads, went unsaid."""
    from decode_cli_helpers import one_line

    d = tmp_path / "my-llama"
    random_hf_llama(BASE).to(torch.bfloat16).save_pretrained(d)
    rc, cap = cli(["--model", str(d / name), "--prompt-len", "3", *SMALL], capsys)
    one_line(rc, cap, f"not a GGUF file or a folder with config.json and safetensors: give its folder, --model {d}")
    rc, cap = cli(["--model", str(d), "--prompt-len", "3", *SMALL, "--json", *ROOF], capsys)
    assert rc == 0, cap.err


def test_a_rank_failing_after_a_rung_says_where_the_rungs_measured_are(tmp_path):
    """A --tp run with --out whose rank 1 failed in its second rung ended with the rank's error alone, while rank 0
    had written the first rung to decode.json (marked partial): a Ctrl-C says where they are, a failure did not."""
    from gpuspeed.decode import tp as TP

    out = tmp_path / "out"
    # V2's prefill and decode timings are the first two; V0's prefill is the third
    rc, err, _ = _tp_run([*TP_SMALL, "--variants", "V2,V0", "--out", str(out), "--json"], {TP.FAIL_ENV: "1:raise:step3"},
                         limit=90)
    assert rc == 2, err[-2000:]
    said = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("gpuspeed decode [")]
    assert len(said) == 1 and said[0].startswith("gpuspeed: error: rank 1 failed: RuntimeError: failure injected"), err
    assert said[0].endswith(f"; the rungs measured are in {out / 'decode.json'} (marked partial)"), said
    doc = json.loads((out / "decode.json").read_text())
    assert doc["params"]["partial"] is True
    assert [r["variant"] for r in doc["rows"]] == ["V2"] and doc["rows"][0]["ms_per_token"] > 0
