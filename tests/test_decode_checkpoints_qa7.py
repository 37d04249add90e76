"""Loading real checkpoints and int8 weights, as a demanding user meets them (QA round 7, CPU): broken or
unusual folders and GGUF files are refused in one line (never a traceback, never wrong numbers), and the int8
torch form stays finite in fp16."""

import json

import pytest
import torch

from gpuspeed.decode import checkpoints as C
from gpuspeed.decode.quant import dequant_linear, quantize
from gpuspeed.errors import UserError
from gpuspeed.verify import check

from decode_cli_helpers import SMALL, cli, one_line, random_hf_llama

BASE = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)


def hf_model(**over):
    return random_hf_llama(BASE, norms_off_one=False, **over)


def folder(tmp_path, name="m", edit=None, tensors=None, **over):
    """A save_pretrained folder; edit(cfg) changes config.json, tensors(sd) the safetensors' dict."""
    d = tmp_path / name
    hf_model(**over).save_pretrained(d)
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        from safetensors.torch import load_file, save_file

        sd = load_file(d / "model.safetensors")
        tensors(sd)
        save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    return d


# ---------------------------------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key,value,says", [
    ("vocab_size", -5, "vocab_size -5"),  # was a RuntimeError traceback (a tensor of negative size)
    ("num_hidden_layers", 0, "num_hidden_layers 0"),  # decoded with no layers at all, exit 0
    ("hidden_size", 32.5, "hidden_size 32.5"),  # was truncated to 32 without a word
    ("num_attention_heads", 0, "num_attention_heads 0"),
])
def test_a_size_that_is_not_a_positive_integer_is_one_line(tmp_path, capsys, key, value, says):
    d = folder(tmp_path, edit=lambda cfg: cfg.update({key: value}))
    with pytest.raises(UserError, match=says):
        C.load(d)
    rc, cap = cli(["--model", str(d), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, says)


def test_tie_word_embeddings_as_a_string_is_one_line(tmp_path):
    # bool("false") is True: a quoted false tied the head to the embedding
    d = folder(tmp_path, edit=lambda cfg: cfg.update({"tie_word_embeddings": "false"}))
    with pytest.raises(UserError, match="tie_word_embeddings 'false': not true or false"):
        C.load(d)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors.index.json"])
def test_a_json_file_that_is_not_utf8_is_one_line(tmp_path, capsys, name):
    """A binary config.json was a UnicodeDecodeError traceback."""
    d = folder(tmp_path)
    if name == "model.safetensors.index.json":  # read only where no model.safetensors is, as transformers does
        (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
    (d / name).write_bytes(b"\xff\xfe\x00{bad")
    rc, cap = cli(["--model", str(d), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, name)


def test_a_quantized_checkpoint_is_refused_not_decoded_without_its_scales(tmp_path, capsys):
    """An fp8 checkpoint (quantization_config, float8 weights, their scales beside them) decoded the float8 values
    upcast with no scale: wrong numbers, exit 0."""
    def fp8(sd):
        for k in [k for k in sd if k.endswith("proj.weight")]:
            sd[k] = sd[k].to(torch.float8_e4m3fn)
            sd[k[:-len("weight")] + "weight_scale_inv"] = torch.ones(1)

    d = folder(tmp_path, edit=lambda cfg: cfg.update(quantization_config={"quant_method": "fp8"}), tensors=fp8)
    with pytest.raises(UserError, match="quantization_config"):
        C.load(d)
    rc, cap = cli(["--model", str(d), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, "quantization_config")


# ---------------------------------------------------------------------------------------------------
# tensors the model would not use
# ---------------------------------------------------------------------------------------------------


def test_a_bias_the_config_does_not_declare_is_refused_not_dropped(tmp_path, capsys):
    """A Qwen2-style checkpoint relabelled llama (q/k/v biases, attention_bias unset) decoded without its biases."""
    def bias(sd):
        for i in range(2):
            for p in "qkv":
                rows = sd[f"model.layers.{i}.self_attn.{p}_proj.weight"].shape[0]
                sd[f"model.layers.{i}.self_attn.{p}_proj.bias"] = torch.randn(rows)

    d = folder(tmp_path, tensors=bias)
    with pytest.raises(UserError, match=r"model\.layers\.0\.self_attn\.k_proj\.bias and 5 more"):
        C.load(d)
    rc, cap = cli(["--model", str(d), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, "does not use")


def test_layers_past_num_hidden_layers_are_refused(tmp_path):
    """config.json saying 1 layer over a 2-layer checkpoint ran the first layer only."""
    d = folder(tmp_path, edit=lambda cfg: cfg.update(num_hidden_layers=1))
    with pytest.raises(UserError, match=r"model\.layers\.1\."):
        C.load(d)


def test_tensors_transformers_drops_too_still_load(tmp_path):
    """Old checkpoints carry RoPE's inv_freq buffers; a tied one may carry a head equal to the embedding."""
    def extra(sd):
        sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()

    d = folder(tmp_path, tensors=extra, tie_word_embeddings=True)
    assert C.load(d).model.args.tie_embeddings


def test_the_same_refusal_over_safetensors_shards(tmp_path):
    d = tmp_path / "sharded"
    m = hf_model()
    m.save_pretrained(d, max_shard_size="20KB")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    first = index["weight_map"]["model.layers.0.mlp.up_proj.weight"]
    from safetensors.torch import load_file, save_file

    sd = load_file(d / first) | {"model.layers.0.mlp.up_proj.bias": torch.zeros(48)}
    save_file(sd, d / first, metadata={"format": "pt"})
    index["weight_map"]["model.layers.0.mlp.up_proj.bias"] = first
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="up_proj.bias"):
        C.load(d)


# ---------------------------------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------------------------------

GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}


def write_gguf(path, skip_meta=(), drop=(), extra=None):
    """A llama GGUF of hf_model()'s weights (Q/K left unpermuted: these tests look at refusals, not numbers)."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed")
    m = hf_model()
    c = m.config
    w = gguf.GGUFWriter(str(path), "llama")
    meta = {"block_count": lambda: w.add_block_count(c.num_hidden_layers),
            "context_length": lambda: w.add_context_length(c.max_position_embeddings),
            "embedding_length": lambda: w.add_embedding_length(c.hidden_size),
            "feed_forward_length": lambda: w.add_feed_forward_length(c.intermediate_size),
            "attention.head_count": lambda: w.add_head_count(c.num_attention_heads),
            "attention.head_count_kv": lambda: w.add_head_count_kv(c.num_key_value_heads)}
    for key, add in meta.items():
        if key not in skip_meta:
            add()
    for k, t in m.state_dict().items():
        parts = k.split(".")
        name = GGUF_TOP.get(k) or f"blk.{parts[2]}.{GGUF_LAYER['.'.join(parts[3:-1])]}.weight"
        if name not in drop:
            w.add_tensor(name, t.detach().float().numpy())
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("skip,drop,says", [
    (("attention.head_count",), (), "llama.attention.head_count"),  # each was a TypeError traceback
    (("block_count",), (), "llama.block_count"),
    (("embedding_length",), (), "llama.embedding_length"),
    (("feed_forward_length",), (), "llama.feed_forward_length"),
    ((), ("token_embd.weight",), "token_embd.weight"),  # was a KeyError traceback
])
def test_gguf_without_the_metadata_or_embedding_a_llama_needs_is_one_line(tmp_path, capsys, skip, drop, says):
    path = write_gguf(tmp_path / "m.gguf", skip_meta=skip, drop=drop)
    rc, cap = cli(["--model", str(path), "--prompt-len", "3"] + SMALL, capsys)
    one_line(rc, cap, says)


def test_gguf_bias_tensors_are_refused_not_dropped(tmp_path):
    """llama.cpp's llama architecture loads optional attn_q/k/v biases; we decoded without them."""
    import numpy as np

    path = write_gguf(tmp_path / "m.gguf", extra={"blk.0.attn_q.bias": np.ones(32, dtype=np.float32)})
    with pytest.raises(UserError, match=r"blk\.0\.attn_q\.bias"):
        C.load(path)
    C.load(write_gguf(tmp_path / "plain.gguf"))  # the same file without it loads


# ---------------------------------------------------------------------------------------------------
# --prompt: the checkpoint's tokenizer
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("files", [
    {"tokenizer.json": "{bad"},  # a JSONDecodeError traceback
    {"tokenizer_config.json": "{}"},  # "Couldn't instantiate the backend tokenizer" ValueError traceback
])
def test_a_tokenizer_that_cannot_load_is_one_line(tmp_path, capsys, files):
    d = folder(tmp_path)
    for name, text in files.items():
        (d / name).write_text(text)
    rc, cap = cli(["--model", str(d), "--prompt", "hello"] + SMALL, capsys)
    one_line(rc, cap, "tokenizer")


def test_a_gguf_without_a_tokenizer_is_one_line_under_prompt(tmp_path, capsys):
    path = write_gguf(tmp_path / "m.gguf")
    rc, cap = cli(["--model", str(path), "--prompt", "hello"] + SMALL, capsys)
    one_line(rc, cap, "tokenizer")


# ---------------------------------------------------------------------------------------------------
# int8
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int8_torch_form_in_fp16_stays_finite_where_the_answer_is(seed):
    """The torch form summed x * q (|q| up to 127) in fp16 before applying the scale: activations of a few
    thousand (an LLM's outlier channels) made that sum overflow fp16's 65504 and the output inf, where the
    answer (~100) and the fp16 unquantized model are finite. Prefill and the CPU always run this form."""
    g = torch.Generator().manual_seed(seed)
    k = 2048
    w = torch.randn(16, k, generator=g) * 0.02
    x = torch.randn(3, k, generator=g)
    x[:, :4] = 2000.0
    qw = quantize(w)
    x = x.half()
    ref = x.double() @ qw.dequantize(torch.float64).T  # the fp16 input times the dequantized weights, in float64
    assert ref.abs().max() < 1000  # the answer is well inside fp16's range
    y = dequant_linear(x, qw.q, qw.scale)
    assert y.dtype == torch.float16
    res = check(y, ref)  # gpuspeed.check's fp16 default (rtol 1e-3)
    assert res.passed, res.summary
    yb = dequant_linear(x.bfloat16(), qw.q, qw.scale)  # bf16 keeps gpt-fast's form: fp32's range, no overflow
    assert torch.isfinite(yb).all() and yb.dtype == torch.bfloat16


def test_other_safetensors_files_beside_model_safetensors_are_not_read(tmp_path):
    """transformers reads model.safetensors alone: a LoRA adapter or Mistral's consolidated.safetensors beside it is
    not the model (read with it, their tensors were refused as unused); alone, the folder lacks the model's names."""
    from safetensors.torch import save_file

    d = folder(tmp_path, tie_word_embeddings=True)
    save_file({"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32)},
              d / "adapter_model.safetensors")
    save_file({"layers.0.attention.wq.weight": torch.zeros(32, 32)}, d / "consolidated.safetensors")
    ours = C.load(d).model
    ref = hf_model(tie_word_embeddings=True)
    prompt = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(0))
    ours.setup_rope(16)
    with torch.no_grad():
        res = check(ours(prompt, torch.arange(5)), ref(prompt).logits)
    assert res.passed, res.summary
    (d / "model.safetensors").unlink()
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(UserError, match=r"lacks model\.embed_tokens\.weight \(and \d+ more\)"):
        C.load(d)


def test_a_gguf_file_without_the_suffix_is_known_by_its_magic_bytes(tmp_path):
    """A blob store or a renamed download drops `.gguf`: it was refused as 'not a .gguf file'."""
    path = write_gguf(tmp_path / "m.gguf")
    bare = tmp_path / "model-blob"
    bare.write_bytes(path.read_bytes())
    want, got = C.load(path), C.load(bare)
    assert got.source == "gguf"
    assert torch.equal(got.model.tok_emb, want.model.tok_emb)
    other = tmp_path / "notes.gguf"  # the suffix alone does not make a GGUF
    other.write_text("not a checkpoint")
    with pytest.raises(UserError, match="not a GGUF file"):
        C.load(other)
