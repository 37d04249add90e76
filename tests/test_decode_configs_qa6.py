"""Checkpoint configs a real user's folder or GGUF file may hold, against transformers' LlamaForCausalLM on the CPU:
each either decodes to transformers' fp32 logits and greedy tokens, or is refused in one line naming the field."""

import json

import pytest
import torch

from decode_cli_helpers import random_hf_llama

from gpuspeed.decode import checkpoints as C, study, variants as V
from gpuspeed.decode.generate import generate
from gpuspeed.errors import UserError
from gpuspeed.verify import check

transformers = pytest.importorskip("transformers", reason="transformers not installed")
pytest.importorskip("safetensors", reason="safetensors not installed")

BASE = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16}


def hf_model(seed=0, **over):
    return random_hf_llama(BASE, seed, **over)


def saved(tmp_path, name, edit=None, **over):
    d = tmp_path / name
    hf_model(**over).save_pretrained(d)
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


def assert_matches_transformers(folder, variants=("V2",), p=5, t=6):
    """Our loader's fp32 logits (gpuspeed.check's fp32 tolerance) and greedy tokens against transformers' own
    from_pretrained of the same folder."""
    ours = C.load(folder).model
    ref = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = torch.randint(0, ours.args.vocab_size, (1, p), generator=torch.Generator().manual_seed(0))
    ours.setup_rope(V.max_len_for(p, t))
    with torch.no_grad():
        res = check(ours(prompt, torch.arange(p)), ref(prompt).logits)
        hf = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=t, min_new_tokens=t,
                          do_sample=False, pad_token_id=0)[:, p:]
    assert res.passed, res.summary
    for name in variants:
        e = V.make_engine(name, ours, 1, V.max_len_for(p, t), compile_backend="eager")
        assert torch.equal(generate(e, prompt, t), hf), name
    return ours


def _set(**kv):
    return lambda cfg: cfg.update(kv)


def _drop_rope_orig(cfg):
    cfg["rope_parameters"].pop("original_max_position_embeddings")


# ---------------------------------------------------------------------------------------------------
# config shapes that already decoded right: kept so they stay right (MQA, GQA ratios, explicit head_dim)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("over", [
    dict(num_key_value_heads=1, head_dim=16),  # MQA with a head wider than hidden / heads
    dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=48, rope_theta=1e6, rms_norm_eps=1e-2),
    dict(tie_word_embeddings=True, head_dim=4),
])
def test_head_shapes_match_transformers_through_the_ladder(tmp_path, over):
    ours = assert_matches_transformers(saved(tmp_path, "m", **over), variants=("V0", "V1", "V2", "V3"))
    assert ours.args.head_dim == over.get("head_dim", ours.args.dim // ours.args.n_heads)


# ---------------------------------------------------------------------------------------------------
# RoPE fields read as transformers 5 reads them
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("over,edit", [
    # a top-level rope_theta beside rope_parameters' own: transformers takes the dict's (we took the top-level one)
    ({}, _set(rope_theta=1e6)),
    # llama3 with original_max_position_embeddings at the top level: transformers' wins over the dict's
    (dict(rope_theta=5e5, rope_parameters=L3), _set(original_max_position_embeddings=64)),
    # llama3 without original_max_position_embeddings: transformers takes max_position_embeddings (we refused)
    (dict(rope_theta=5e5, rope_parameters=L3), _drop_rope_orig),
    # a legacy rope_scaling beside rope_parameters: transformers reads rope_scaling, theta from the top level
    (dict(rope_theta=5e5, rope_parameters=L3), _set(rope_scaling=dict(L3, factor=2.0))),
    # hidden_act "swish": transformers' ACT2FN["swish"] is SiLU (we refused it)
    ({}, _set(hidden_act="swish")),
])
def test_rope_and_activation_fields_decode_as_transformers_does(tmp_path, over, edit):
    assert_matches_transformers(saved(tmp_path, "m", edit=edit, **over))


@pytest.mark.parametrize("edit,field", [
    # rope_parameters naming its kind under the legacy key "type": it was read as no scaling at all
    (_set(rope_parameters={"type": "linear", "factor": 4.0, "rope_theta": 10000.0}), "rope_parameters"),
    (_set(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling"),
])
def test_rope_scaling_we_cannot_honour_is_one_line_naming_the_field(tmp_path, edit, field, capsys):
    from gpuspeed.cli import main

    d = saved(tmp_path, "m", edit=edit)
    kind = json.loads((d / "config.json").read_text())[field]["type"]
    capsys.readouterr()  # save_pretrained's progress bar
    rc = main(["decode", "--model", str(d), "--new-tokens", "2", "--no-hf", "--no-profile", "--budget", "0.05",
               "--device", "cpu", "--variants", "V2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("gpuspeed: error:") and len(err.strip().splitlines()) == 1, err
    assert f"config.json {field}" in err and repr(kind) in err and "not supported" in err, err


def test_bias_refusal_names_the_field(tmp_path):
    with pytest.raises(UserError, match="config.json sets mlp_bias true"):
        C.load(saved(tmp_path, "m", mlp_bias=True))


# ---------------------------------------------------------------------------------------------------
# Weights and side files
# ---------------------------------------------------------------------------------------------------


def test_a_tied_config_with_a_head_of_its_own_decodes_as_transformers_does(tmp_path):
    """config.json says tie_word_embeddings true, yet the file holds a different lm_head.weight: transformers 5
    does not tie them and uses the head; we used the embedding (every logit wrong)."""
    d = saved(tmp_path, "m", edit=_set(tie_word_embeddings=True), tie_word_embeddings=False)
    ours = assert_matches_transformers(d)
    assert ours.args.tie_embeddings is False and ours.lm_head is not None


def test_a_tied_config_with_an_equal_head_stays_tied(tmp_path):
    from safetensors.torch import load_file, save_file

    d = saved(tmp_path, "m", tie_word_embeddings=True)
    sd = load_file(d / "model.safetensors")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    assert C.load(d).model.args.tie_embeddings is True


@pytest.mark.parametrize("text,says", [('{"eos_token_id": ', "not valid JSON"), ("[2]", "not an object"),
                                       ('{"eos_token_id": "</s>"}', "is not a token id")])
def test_a_broken_generation_config_is_one_line(tmp_path, text, says):
    d = saved(tmp_path, "m")
    (d / "generation_config.json").write_text(text)
    with pytest.raises(UserError, match=says):
        C.load(d)


def test_a_context_shorter_than_the_warmup_room_says_so_not_a_negative_limit():
    with pytest.raises(UserError) as info:
        study.check_context("a prompt", 4, 6, 16)
    msg = str(info.value)
    assert "context of 16 is too short" in msg and "at least 32" in msg and "-8" not in msg
    study.check_context("a prompt", 1, 2, 32)  # the smallest run fits the smallest context it names


# ---------------------------------------------------------------------------------------------------
# GGUF metadata
# ---------------------------------------------------------------------------------------------------


def _permute(w, n_head):  # llama.cpp's convert script: the rows for its interleaved RoPE
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, d, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, m, extra=()):
    gguf = pytest.importorskip("gguf", reason="gguf is not installed")
    cfg = m.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    for f in extra:
        f(w, gguf)
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for k, t in m.state_dict().items():
        parts = k.split(".")
        name = top.get(k) or f"blk.{parts[2]}.{layer['.'.join(parts[3:-1])]}.weight"
        t = t.detach().float()
        if name.endswith("attn_q.weight"):
            t = _permute(t, cfg.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            t = _permute(t, cfg.num_key_value_heads)
        w.add_tensor(name, t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_head_size_comes_from_its_key_length(tmp_path):
    """A GGUF whose head size is not embedding / heads (llama.attention.key_length): we built heads of
    embedding / heads and failed on the Q weight's shape."""
    m = hf_model(head_dim=16, num_key_value_heads=1)
    ours = C.load(write_gguf(tmp_path / "m.gguf", m)).model
    assert ours.args.head_dim == 16
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    ours.setup_rope(32)
    with torch.no_grad():
        res = check(ours(prompt, torch.arange(6)), m(prompt).logits)
    assert res.passed, res.summary


@pytest.mark.parametrize("extra,says", [
    # llama.cpp scales RoPE by these (transformers' GGUF loader drops them): we decoded unscaled, silently
    ([lambda w, g: w.add_rope_scaling_type(g.RopeScalingType.LINEAR), lambda w, g: w.add_rope_scaling_factor(4.0)],
     "llama.rope.scaling.type 'linear' is not supported"),
    ([lambda w, g: w.add_rope_scaling_type(g.RopeScalingType.YARN), lambda w, g: w.add_rope_scaling_factor(4.0)],
     "llama.rope.scaling.type 'yarn' is not supported"),
    ([lambda w, g: w.add_expert_count(4), lambda w, g: w.add_expert_used_count(2)], "llama.expert_count 4"),
])
def test_gguf_metadata_we_cannot_honour_is_refused(tmp_path, extra, says):
    path = write_gguf(tmp_path / "m.gguf", hf_model(), extra)
    with pytest.raises(UserError, match=says):
        C.load(path)
    write_gguf(tmp_path / "none.gguf", hf_model(), [lambda w, g: w.add_rope_scaling_type(g.RopeScalingType.NONE)])
    assert C.load(tmp_path / "none.gguf").model.args.rope_scaling is None
