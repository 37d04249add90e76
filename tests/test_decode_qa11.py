"""Round 11 of the decode QA: Hugging Face folders as a user's disk holds them (saved with transformers'
save_pretrained, tiny and random), the CLI on them, and generation; each against transformers' LlamaForCausalLM."""

import json

import pytest
import torch

from decode_cli_helpers import random_hf_llama

from gpuspeed.decode import checkpoints as C, variants as V
from gpuspeed.decode.generate import generate
from gpuspeed.verify import check

transformers = pytest.importorskip("transformers", reason="transformers not installed")
pytest.importorskip("safetensors", reason="safetensors not installed")

BASE = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)


def hf_model(seed=0, **over):
    return random_hf_llama(BASE, seed, **over)


def matches_transformers(folder, p=5, t=8, variants=("V2",)):
    """Our loader's fp32 logits (gpuspeed.check, fp32 tolerance) and greedy tokens against transformers' own
    from_pretrained of the same folder; the reference's logits are returned too."""
    ours = C.load(folder).model
    ref = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ref.generation_config.eos_token_id = None  # exactly t greedy tokens (min_new_tokens would forbid the EOS id)
    prompt = torch.randint(0, ours.args.vocab_size, (1, p), generator=torch.Generator().manual_seed(p))
    ours.setup_rope(V.max_len_for(p, t))
    with torch.no_grad():
        res = check(ours(prompt, torch.arange(p)), ref(prompt).logits)
        hf = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=t, do_sample=False,
                          pad_token_id=0)[:, p:]
    assert res.passed, res.summary
    for name in variants:
        e = V.make_engine(name, ours, 1, V.max_len_for(p, t), compile_backend="eager")
        assert torch.equal(generate(e, prompt, t), hf), name
    return ours


# ---------------------------------------------------------------------------------------------------
# which files of a folder are the model's weights
# ---------------------------------------------------------------------------------------------------


def test_model_safetensors_wins_over_a_stale_index_as_in_transformers(tmp_path):
    """A folder saved sharded, then saved again whole with save_pretrained, keeps the old
    model.safetensors.index.json (save_pretrained removes the old shards, not the index). transformers loads
    model.safetensors where it is; we read the index first and failed on its missing shards ('cannot read it as
    safetensors (FileNotFoundError ...)'), or with the old shards still there decoded the old weights."""
    d = tmp_path / "m"
    hf_model(seed=1).save_pretrained(d, max_shard_size="50KB")
    assert (d / "model.safetensors.index.json").is_file()
    shards = sorted(d.glob("model-*.safetensors"))
    kept = [s.read_bytes() for s in shards]
    hf_model(seed=2).save_pretrained(d)
    assert (d / "model.safetensors.index.json").is_file() and (d / "model.safetensors").is_file()
    matches_transformers(d)
    for s, data in zip(shards, kept, strict=True):  # the old shards back beside it: still the new weights
        s.write_bytes(data)
    matches_transformers(d)


# ---------------------------------------------------------------------------------------------------
# configs transformers refuses
# ---------------------------------------------------------------------------------------------------


def _odd_head_folder(tmp_path):
    """hidden 60 over 4 heads: a head size of 15. transformers' LlamaConfig refuses it ('RoPE requires an even rotary
    dimension'); save_pretrained cannot make it, so the folder is written by hand, as a converter would."""
    from safetensors.torch import save_file

    from gpuspeed.decode import model as M

    a = M.ModelArgs(vocab_size=128, dim=60, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=256,
                    head_dim=16)  # the tensors of a 15-wide head are made below; this only builds random weights
    m = M.build(a, seed=1)
    sd = {k: v.contiguous() for k, v in C.hf_state_dict(m).items()}
    for k in list(sd):  # q/k/v rows and o columns cut to 15 a head
        if "q_proj" in k or "k_proj" in k or "v_proj" in k:
            sd[k] = sd[k].reshape(-1, 16, 60)[:, :15].reshape(-1, 60).contiguous()
        elif "o_proj" in k:
            sd[k] = sd[k].reshape(60, -1, 16)[:, :, :15].reshape(60, -1).contiguous()
    d = tmp_path / "odd"
    d.mkdir()
    save_file(sd, str(d / "model.safetensors"))
    cfg = C.hf_config(a)
    cfg.pop("head_dim")
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_an_odd_head_size_is_one_line_not_every_rung_failing(tmp_path, capsys):
    """A head size of 15 loaded, then every rung failed in RoPE ('The size of tensor a (15) must match the size of
    tensor b (16)') and the run ended 'nothing was measured', exit 1: RoPE rotates pairs, so it is refused up front."""
    from decode_cli_helpers import SMALL, cli, one_line

    d = _odd_head_folder(tmp_path)
    rc, cap = cli(["--model", str(d), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, "head size 15")


# ---------------------------------------------------------------------------------------------------
# the name a checkpoint's results go under
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path,key", [
    # a folder's dots are part of its name, not a suffix: both of these were 'llama-3', one run's summary keys
    # overwriting the other's in a merged decode.json
    ("/m/Llama-3.2-1B", "llama-3.2-1b"),
    ("/m/Llama-3.1-8B-Instruct/", "llama-3.1-8b-instruct"),
    ("/m/SmolLM2-1.7B", "smollm2-1.7b"),  # was 'smollm2-1'
    # a GGUF file loses its suffix only (as before)
    ("/m/smollm2-135m-instruct.Q8_0.gguf", "smollm2-135m-instruct.q8-0"),
    # a Hugging Face hub cache snapshot: the repository's name, not the commit hash of the snapshot folder
    ("/h/models--meta-llama--Llama-3.2-1B/snapshots/4e20de362430cd3b72f300e6b0f18e50e7166e08", "llama-3.2-1b"),
    ("/h/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/12fd25f77366fa6b3b4b768ec3050bf629380bac/",
     "smollm2-135m-instruct"),
])
def test_a_checkpoints_results_are_named_by_its_whole_name(path, key):
    from gpuspeed.decode.study import Spec, model_key

    assert model_key(path) == key
    assert Spec(model=path, dtype="bf16").label() == f"{key}_bf16"


def test_a_folder_given_as_dot_is_named_by_the_folder(tmp_path, monkeypatch):
    """`--model .` inside the model's folder put the results under 'model'."""
    from gpuspeed.decode.study import model_key

    d = tmp_path / "Llama-3.2-1B"
    d.mkdir()
    monkeypatch.chdir(d)
    assert model_key(".") == model_key("./") == "llama-3.2-1b"


def test_errors_about_a_folder_given_as_dot_name_the_folder(tmp_path, monkeypatch, capsys):
    """`--model .` in a Mistral folder said 'gpuspeed: error: : not a Llama checkpoint ...' (an empty name)."""
    from decode_cli_helpers import SMALL, cli, one_line

    d = tmp_path / "Mistral-7B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(BASE, model_type="mistral", architectures=["MistralForCausalLM"])))
    monkeypatch.chdir(d)
    rc, cap = cli(["--model", ".", "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, "Mistral-7B: not a Llama checkpoint")


def test_a_folder_holding_only_a_gguf_file_points_at_the_file(tmp_path):
    # "no config.json (not a Hugging Face model folder)" left the user to find that --model wants the .gguf itself
    from gpuspeed.decode.checkpoints import load_hf
    from gpuspeed.errors import UserError

    (tmp_path / "smollm2-135m-instruct.Q4_1.gguf").write_bytes(b"GGUF")
    with pytest.raises(UserError, match=r"it holds smollm2-135m-instruct\.Q4_1\.gguf: pass that file as --model"):
        load_hf(tmp_path)
