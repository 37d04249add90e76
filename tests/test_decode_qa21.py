"""Round 21 QA of `gpuspeed decode`: the `gpuspeed.decode` Python API (study.Spec, study.run) as a user calls it, and
Hugging Face folders with odd configs, on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread while this module runs)

# the smallest in-process run of one rung (no transformers rows, no profile, a given read ceiling)
QUICK = dict(new_tokens=2, hf=False, profile=False, bench_budget_s=0.05, device="cpu", variants="V2",
             read_roof_GBps=20.0, prompt_len=4)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny random LlamaForCausalLM saved by transformers (random, never all-zero weights)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    torch.manual_seed(21)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128)
    m = transformers.LlamaForCausalLM(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    folder = tmp_path_factory.mktemp("hf_llama")
    m.save_pretrained(folder)
    return folder


def test_spec_takes_a_pathlib_path_as_the_model(hf_folder):
    # Spec(model=Path(folder)): check_spec failed with AttributeError: 'PosixPath' object has no attribute 'strip'
    from gpuspeed.decode import study

    spec = study.Spec(model=Path(hf_folder), **QUICK)
    study.check_spec(spec)
    doc = study.run(spec)
    (row,) = doc["rows"]
    assert row["variant"] == "V2" and row["ms_per_token"] > 0, row
    assert doc["params"]["model"] == str(hf_folder)  # the results file holds the path as text (JSON has no Path)


def test_spec_takes_the_batches_as_the_command_line_writes_them():
    # Spec(batches="8,32") failed in check_spec with TypeError: '<' not supported between 'str' and 'int'
    from gpuspeed.decode import study
    from gpuspeed.errors import UserError

    assert study.Spec(batches="8, 32").batches == [8, 32]
    assert study.Spec(batches=8).batches == [8]
    assert study.Spec(batches=None).batches == []
    with pytest.raises(UserError, match="batches"):
        study.Spec(batches="8,x")


def test_spec_takes_the_sampling_as_the_results_file_holds_it():
    # params["sampling"] of a results file is a dict; Spec(sampling={...}) ran the model load, then failed with
    # AttributeError: 'dict' object has no attribute '__dict__'
    from gpuspeed.decode import study
    from gpuspeed.decode.generate import Sampling
    from gpuspeed.errors import UserError

    s = {"temperature": 0.7, "top_k": 5, "top_p": None, "seed": 3}
    assert study.Spec(sampling=s).sampling == Sampling(**s)
    with pytest.raises(UserError, match="sampling"):
        study.Spec(sampling={"temprature": 0.7})
    with pytest.raises(UserError, match="sampling"):
        study.Spec(sampling="greedy")


def test_spec_takes_a_list_of_variants_in_any_case():
    # Spec(variants="v2") was taken, Spec(variants=["v2"]) refused as an unknown variant
    from gpuspeed.decode import study

    assert study.Spec(variants=["v2", "V4C"]).variants == ["V2", "V4c"]
    study.check_spec(study.Spec(variants=["v0", "v2"]))


@pytest.mark.parametrize("prompt, needle", [
    (torch.tensor([[1.0, 2.0, 3.0]]), "integer"),  # was torch's RuntimeError from the embedding
    (torch.tensor([[1, 2, 97]]), "97"),  # past the vocab: an IndexError here, a device-side assert on a GPU
    (torch.tensor([[1, -2, 3]]), "-2"),
    (torch.zeros(1, 0, dtype=torch.long), "no tokens"),  # was IndexError: index -1 is out of bounds
])
def test_generate_refuses_a_prompt_that_is_not_token_ids_of_the_model(prompt, needle):
    from gpuspeed.decode import model as M, variants as V
    from gpuspeed.decode.generate import generate
    from gpuspeed.errors import UserError

    m = M.build(M.ModelArgs(vocab_size=97, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=48, max_seq_len=64),
                seed=5)
    engine = V.make_engine("V2", m, 1, V.max_len_for(3, 2))
    with pytest.raises(UserError, match=needle):
        generate(engine, prompt, 2)
    ok = generate(engine, torch.tensor([[1, 2, 96]], dtype=torch.int32), 2)  # int32 ids are token ids too
    assert ok.shape == (1, 2) and int(ok.max()) < 97


@pytest.mark.parametrize("fields, needle", [
    (dict(temperature=0.7, top_k=2.5), "top_k must be an integer"),  # was every rung's "topk(): ... must be int"
    (dict(temperature=0.7, seed=1.5), "seed must be an integer"),  # was every rung's "manual_seed expected a long"
    (dict(temperature="0.7"), "temperature must be a number"),  # was a TypeError comparing float and str
    (dict(temperature=0.7, top_p="0.9"), "top_p must be a number"),
    (dict(temperature=0.7, top_k=True), "top_k must be an integer"),  # True is no count of tokens
])
def test_sampling_of_the_wrong_type_is_refused_in_one_line(fields, needle):
    from gpuspeed.decode.generate import Sampling
    from gpuspeed.errors import UserError

    with pytest.raises(UserError, match=needle):
        Sampling(**fields)


def test_sampling_takes_numpy_numbers_as_python_ones():
    np = pytest.importorskip("numpy")
    from gpuspeed.decode.generate import Sampling

    s = Sampling(temperature=np.float32(0.5), top_k=np.int64(4), seed=np.int64(7))
    assert s == Sampling(temperature=0.5, top_k=4, seed=7) and type(s.top_k) is int and type(s.seed) is int


def test_load_takes_the_command_lines_dtype_names(hf_folder):
    # checkpoints.load(folder, dtype="bf16") failed with torch's "Invalid device string: 'bf16'" (the string went to
    # Module.to as a device); an int8 dtype with torch's TypeError
    from gpuspeed.decode import checkpoints
    from gpuspeed.errors import UserError

    ck = checkpoints.load(hf_folder, dtype="bf16")
    assert ck.model.dtype == torch.bfloat16 and ck.model.tok_emb.dtype == torch.bfloat16
    assert checkpoints.load(hf_folder, dtype="float16").model.dtype == torch.float16
    for bad in ("int8", torch.int8, "bf17"):
        with pytest.raises(UserError, match="dtype"):
            checkpoints.load(hf_folder, dtype=bad)


def test_spec_with_lengths_left_as_none_takes_the_command_lines_defaults():
    # Spec(prompt_len=None, new_tokens=None), as the CLI leaves them unset, failed in check_spec with TypeError:
    # '<' not supported between 'NoneType' and 'int'; now the CLI's defaults for the device (CPU: 8 and 16, 0.5 s)
    from gpuspeed.decode import study

    spec = study.Spec(device="cpu", prompt_len=None, new_tokens=None, bench_budget_s=None)
    assert (spec.prompt_len, spec.new_tokens, spec.bench_budget_s) == (8, 16, 0.5)
    study.check_spec(spec)
