"""`gpuspeed decode` on the CPU: input a demanding user gives it, each refused in one line before any work."""

import json
import types

import pytest

from gpuspeed.decode import checkpoints as C, study
from gpuspeed.errors import UserError

from decode_cli_helpers import SMALL, TINY, cli, one_line
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)


def test_prompt_and_prompt_len_together_are_refused_not_one_ignored(capsys):
    """The text sets the prompt's length: a --prompt-len beside it was silently dropped."""
    rc, cap = cli(TINY + ["--prompt", "hello", "--prompt-len", "5"], capsys)
    one_line(rc, cap, "--prompt and --prompt-len are exclusive")


def test_layers_on_a_checkpoint_is_refused_not_ignored(tmp_path, capsys):
    """The loaders read every layer: --layers 1 on a checkpoint ran all of them and recorded max_layers 1."""
    (tmp_path / "config.json").write_text(json.dumps(C.hf_config(C.ModelArgs(
        vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96))))
    rc, cap = cli(["--model", str(tmp_path), "--prompt-len", "3"] + TINY, capsys)
    one_line(rc, cap, "--layers shrinks a named model")


def test_more_layers_than_the_named_model_has_are_refused():
    """--layers 100 on tiny (8 layers) built a 100-layer model and labelled it tiny."""
    with pytest.raises(UserError, match="tiny has 8 layers"):
        study.check_spec(study.Spec(model="tiny", max_layers=100, prompt_len=3, new_tokens=2, variants=["V2"]))
    study.check_spec(study.Spec(model="tiny", max_layers=8, prompt_len=3, new_tokens=2, variants=["V2"]))


def test_an_infinite_read_roof_is_refused(capsys):
    """--read-roof inf gave every row 0 % of the read roof."""
    rc, cap = cli(TINY + ["--prompt-len", "3", "--read-roof", "inf"], capsys)
    one_line(rc, cap, "--read-roof")


def test_a_batch_whose_kv_cache_cannot_fit_is_refused_before_any_work(monkeypatch):
    """A huge --batch (or --batches size) fit the weights check, then every rung failed on its allocation
    (the CPU: "err == 0. DefaultCPU", or the OOM killer) and the run exited 0."""
    from gpuspeed import device as D

    monkeypatch.setattr(D, "get_device", lambda device: types.SimpleNamespace(mem_bytes=16 * 2**30))
    base = dict(model="tiny", prompt_len=8, new_tokens=16, variants=["V2"])
    with pytest.raises(UserError, match="KV cache and logits"):
        study.check_fits(study.Spec(**base, batch=100_000), "cpu")
    with pytest.raises(UserError, match="at batch 100000 "):
        study.check_fits(study.Spec(**base, batches=[8, 100_000]), "cpu")
    study.check_fits(study.Spec(**base, batch=64, batches=[8, 32], long_prompt=1024), "cpu")  # fits: no error


def test_a_non_llama_config_says_so_without_calling_it_a_bad_value():
    with pytest.raises(UserError) as err:
        C.args_from_hf_config({"model_type": "bert", "architectures": ["BertModel"]}, name="bert")
    assert "not a Llama checkpoint" in str(err.value) and "bad value" not in str(err.value), str(err.value)


def test_prompt_on_an_hf_folder_without_tokenizer_files_names_what_is_missing(tmp_path, capsys):
    """It said "--prompt needs a checkpoint with a tokenizer (a .gguf file or an HF folder)" of an HF folder."""
    pytest.importorskip("transformers", reason="transformers not installed")
    pytest.importorskip("safetensors", reason="safetensors not installed")
    from gpuspeed.decode import model as M

    m = M.build(M.named_config("tiny", vocab_size=256, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=96), seed=1)
    C.to_hf(m).save_pretrained(tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar
    rc, cap = cli(["--model", str(tmp_path), "--prompt", "hello"] + SMALL, capsys)
    one_line(rc, cap, "has no tokenizer.json")


def test_a_prompt_inside_the_context_but_not_its_cache_is_refused_up_front():
    """2040 + 4 <= tiny's 2048 passed the check, then every rung failed on its own ("2080 positions exceed tiny's
    context"): the cache holds max_len_for(P, T) positions, a capture's warm-up steps included."""
    from gpuspeed.decode import variants as V

    spec = dict(model="tiny", new_tokens=4, variants=["V2"])
    with pytest.raises(UserError, match="exceeds tiny's context of 2048.*at most 2024"):
        study.check_spec(study.Spec(**spec, prompt_len=2040))
    with pytest.raises(UserError, match="--long-prompt of 2030"):
        study.check_spec(study.Spec(**spec, prompt_len=8, long_prompt=2030))
    study.check_spec(study.Spec(**spec, prompt_len=2020))  # 2024 fits: the largest P + T
    assert V.max_len_for(2020, 4) <= 2048


def test_a_checkpoints_prompt_past_its_cache_is_one_line_before_any_rung(tmp_path, capsys):
    pytest.importorskip("transformers", reason="transformers not installed")
    pytest.importorskip("safetensors", reason="safetensors not installed")
    from gpuspeed.decode import model as M

    m = M.build(M.named_config("tiny", vocab_size=256, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=96,
                               max_seq_len=64), seed=1)
    C.to_hf(m).save_pretrained(tmp_path)
    capsys.readouterr()
    rc, cap = cli(["--model", str(tmp_path), "--prompt-len", "40", "--new-tokens", "4", "--no-hf", "--no-profile",
                   "--budget", "0.05", "--device", "cpu", "--variants", "V0,V2"], capsys)
    one_line(rc, cap, "exceeds the model's context of 64")


@pytest.mark.parametrize("opt", [["--top-k", "5"], ["--top-p", "0.9"]])
def test_top_k_or_top_p_without_a_temperature_is_refused_not_ignored(opt, capsys):
    """Greedy (temperature 0, the default) ignored them: the run was greedy and its params said top_k 5."""
    rc, cap = cli(TINY + ["--prompt-len", "3"] + opt, capsys)
    one_line(rc, cap, "give --temperature > 0")


@pytest.mark.parametrize("seed", ["99999999999999999999999", "18446744073709551615", "-99999999999999999999"])
def test_a_seed_past_64_bits_is_one_line_not_a_traceback(seed, capsys):
    """torch's generator raised "Overflow when unpacking long long" from inside the run (exit 1, a traceback)."""
    rc, cap = cli(TINY + ["--prompt-len", "3", "--seed", seed], capsys)
    one_line(rc, cap, "--seed must fit in 64 bits")


def test_a_negative_seed_still_runs(capsys):
    rc, cap = cli(TINY + ["--prompt-len", "3", "--seed", "-1", "--json"], capsys)
    assert rc == 0, cap.err
    assert json.loads(cap.out)["params"]["seed"] == -1


def test_a_checkpoint_at_a_batch_whose_cache_cannot_fit_is_one_line(tmp_path, capsys, monkeypatch):
    """check_fits skips checkpoints (their shapes are known once loaded): a huge --batch failed every rung, exit 0.
    The device is made to hold 16 MiB, so the run refused is small enough to run before the fix."""
    pytest.importorskip("transformers", reason="transformers not installed")
    pytest.importorskip("safetensors", reason="safetensors not installed")
    import dataclasses

    from gpuspeed import device as D
    from gpuspeed.decode import model as M

    m = M.build(M.named_config("tiny", vocab_size=256, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=96),
                seed=1)
    C.to_hf(m).save_pretrained(tmp_path)
    capsys.readouterr()
    real = D.get_device
    monkeypatch.setattr(D, "get_device", lambda *a, **k: dataclasses.replace(real(*a, **k), mem_bytes=16 * 2**20))
    args = ["--model", str(tmp_path), "--prompt-len", "3", "--new-tokens", "2", "--no-hf", "--no-profile", "--budget",
            "0.05", "--device", "cpu", "--variants", "V2"]
    rc, cap = cli(args + ["--batch", "2000"], capsys)  # 16 MB of cache and 4 MB of logits
    one_line(rc, cap, "of KV cache and logits")
    rc, cap = cli(args + ["--batch", "2"], capsys)
    assert rc == 0, cap.err


@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_that_measured_nothing_says_so_and_exits_1(tmp_path, capsys, as_json):
    """Every rung skipped by --time-cap wrote a decode.json with no measurement and exited 0."""
    rc, cap = cli(TINY + ["--prompt-len", "3", "--time-cap", "0.001", "--out", str(tmp_path)]
                  + (["--json"] if as_json else []), capsys)
    assert rc == 1, cap.err
    said = cap.err if as_json else cap.out
    assert "nothing was measured: every rung was skipped or failed (time cap of 0.001 s reached)" in said, said
    assert (tmp_path / "decode.json").is_file()  # the rows say why, each
    if as_json:
        json.loads(cap.out)  # stdout stays the document


def test_nothing_measured_is_silent_when_a_row_has_a_time():
    assert study.nothing_measured({"rows": [{"variant": "V0", "skipped": "x"}, {"variant": "V2", "ms_per_token": 1.0}]}) is None
    assert "no rung ran" in study.nothing_measured({"rows": []})


def test_bf16_with_the_agreement_check_counts_its_fp32_copy(monkeypatch):
    """load_model keeps the fp32 model the bf16 one was cast from, for the agreement columns: 6 bytes a weight,
    where check_fits counted 4 (a 1B model passed on an 8 GB card and ran out of memory while casting)."""
    from gpuspeed import device as D
    from gpuspeed.decode import model as M

    params = M.named_config("llama-3.2-1b").param_count()
    mem = int(params * 5 / 0.8)  # 80 % of it holds 5 bytes a weight: bf16 alone fits, bf16 + its fp32 copy does not
    monkeypatch.setattr(D, "get_device", lambda device: types.SimpleNamespace(mem_bytes=mem))
    base = dict(model="llama-3.2-1b", dtype="bf16", prompt_len=8, new_tokens=4, variants=["V2"])
    with pytest.raises(UserError, match=r"its fp32 copy for the agreement check included"):
        study.check_fits(study.Spec(**base), "cuda")
    study.check_fits(study.Spec(**base, agreement=False), "cuda")  # 2 bytes a weight: fits
    study.check_fits(study.Spec(**{**base, "dtype": "fp32"}), "cuda")  # fp32 is its own reference: 4 bytes, fits
    monkeypatch.setattr(D, "get_device", lambda device: types.SimpleNamespace(mem_bytes=int(params * 3 / 0.8)))
    with pytest.raises(UserError) as err:  # fp32 at 3 bytes a weight: refused, with no fp32 copy named
        study.check_fits(study.Spec(**{**base, "dtype": "fp32"}), "cuda")
    assert "needs about" in str(err.value) and "agreement" not in str(err.value)


def test_a_checkpoint_folder_too_large_for_the_device_is_refused_before_its_weights_are_read(tmp_path, monkeypatch):
    """check_fits read only named models: a folder larger than the GPU was loaded to the last shard and failed in
    an allocation. Its config.json gives the shapes; the weights here are a placeholder never opened."""
    from gpuspeed import device as D
    from gpuspeed.decode import model as M

    args = M.named_config("llama-3.2-1b")
    (tmp_path / "config.json").write_text(json.dumps(C.hf_config(args)))
    (tmp_path / "model.safetensors").write_bytes(b"not read")
    params = args.param_count()
    monkeypatch.setattr(D, "get_device", lambda device: types.SimpleNamespace(mem_bytes=int(params * 3 / 0.8)))
    base = dict(model=str(tmp_path), prompt_len=8, new_tokens=4, variants=["V2"])
    with pytest.raises(UserError, match=r"needs about .* GiB; this cuda has .*: try --dtype bf16"):
        study.check_fits(study.Spec(**base, dtype="fp32"), "cuda")
    study.check_fits(study.Spec(**base, dtype="bf16", agreement=False), "cuda")  # 2 bytes a weight: fits
    (tmp_path / "config.json").write_text("{}")  # no Llama config: the loader's line, from check_fits (QA 14)
    with pytest.raises(UserError, match="not a Llama checkpoint"):
        study.check_fits(study.Spec(**base, dtype="fp32"), "cuda")
