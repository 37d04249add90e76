"""Decode checkpoints, int8 weights and --tp on the CPU, as a demanding user meets them (QA round 26): a --tp run
refuses what one process refuses, and its aggregate figures count each rank's own shard."""

import json
from dataclasses import replace

import pytest
import torch

from gpuspeed.decode import checkpoints as C, model as M, study, tp as TP
from gpuspeed.errors import UserError
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)

# 3 KV heads over 2 ranks split 2 + 1, an odd FFN (14 + 13) and a vocabulary of 257 (padded shards): uneven shards
UNEVEN = M.named_config("smollm2-135m", vocab_size=257, dim=48, n_layers=1, n_heads=6, n_kv_heads=3, ffn_dim=27,
                        max_seq_len=64)


def hf_folder(path, args=UNEVEN, edit=None):
    """An HF folder of random weights of these shapes; edit(state_dict) changes the tensors before they are saved."""
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in C.hf_state_dict(M.build(args, seed=7)).items()}
    if edit is not None:
        edit(sd)
    save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(C.hf_config(args)))
    return path


def rank_view(rank: int, world: int) -> TP.TP:
    """A rank's TP with no process group: loading a shard communicates nothing."""
    return TP.TP(group=None, rank=rank, world=world, vocab_size=0, vocab_local=0)


# ---------------------------------------------------------------------------------------------------
# --tp reads a checkpoint slice by slice: the same refusals as one process
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,extra_rows", [("model.embed_tokens.weight", 3), ("model.layers.0.self_attn.q_proj.weight", 8),
                                             ("model.layers.0.mlp.down_proj.weight", 0)])
def test_a_tensor_of_the_wrong_shape_is_refused_under_tp_as_without_it(tmp_path, name, extra_rows):
    """A tensor with more rows (or columns) than config.json says: one process refused it, while each --tp rank
    sliced its rows out of it and decoded a model the checkpoint does not hold, exit 0."""
    def grow(sd):
        t = sd[name]
        sd[name] = torch.cat([t, torch.randn(extra_rows, t.shape[1])]) if extra_rows else \
            torch.cat([t, torch.randn(t.shape[0], 5)], dim=1)
    d = hf_folder(tmp_path, edit=grow)
    with pytest.raises(UserError, match=f"{name} has shape"):
        C.load(d)
    for rank in (0, 1):
        with pytest.raises(UserError, match=f"{name} has shape"):
            TP.load_hf_shard(d, rank_view(rank, 2), "cpu", torch.float32)


def test_shards_of_a_folder_still_load_and_rebuild_the_whole_model(tmp_path):
    d = hf_folder(tmp_path)
    whole = C.load(d).model
    shards = [TP.load_hf_shard(d, rank_view(r, 2), "cpu", torch.float32).model for r in range(2)]
    assert torch.equal(torch.cat([s.tok_emb for s in shards])[:UNEVEN.vocab_size], whole.tok_emb)
    assert torch.equal(torch.cat([s.layers[0].w_down for s in shards], dim=1), whole.layers[0].w_down)


# ---------------------------------------------------------------------------------------------------
# --tp's aggregate figures
# ---------------------------------------------------------------------------------------------------


def test_aggregate_weight_bandwidth_counts_each_ranks_own_shard(tmp_path):
    """Uneven shards (SmolLM2's 3 KV heads over 2 ranks): rank 0 holds the larger one, and the aggregate GB/s was
    rank 0's times N, more bytes than the ranks read together (+6.6 % for SmolLM2-135M over 2 GPUs)."""
    d = hf_folder(tmp_path)
    spec = study.Spec(model=str(d), dtype="fp32", variants=["V2"], prompt_len=4, new_tokens=3, device="cpu",
                      compile_backend="eager", hf=False, profile=False, bench_budget_s=0.05, read_roof_GBps=20.0)
    doc = TP.launch(spec, 2)
    row = next(r for r in doc["rows"] if r.get("variant") == "V2")
    shard_bytes = [TP.local_args(UNEVEN, 2, r).weight_bytes_per_token(4) for r in range(2)]
    assert row["weight_bytes_per_token"] == shard_bytes[0] > shard_bytes[1]  # rank 0's row
    seconds_per_token = row["ms_per_token"] / 1e3
    assert row["aggregate_weight_GBps"] == pytest.approx(sum(shard_bytes) / seconds_per_token / 1e9, rel=1e-9)
    assert row["aggregate_pct_of_read_roof"] == pytest.approx(100 * row["aggregate_weight_GBps"] / (2 * 20.0))


def test_a_batch_row_of_the_best_rung_keeps_the_ladder_rows_per_rank_figures():
    """The ranks' all-reduce figures were keyed by variant alone: the best rung's --batches / --long-prompt rows (not
    profiled) replaced its ladder row's, and the summary's allreduce_share went missing on the GPU."""
    def doc():
        return {"params": {"read_ceiling": {"GBps": 100.0}}, "notes": [], "summary": {},
                "rows": [{"variant": "V5", "study": "ladder", "batch": 1, "prompt_len": 8, "ms_per_token": 2.0,
                          "weight_GBps": 30.0, "tokens_per_s": 500.0, "comm_kernel_ms_per_token": 0.5},
                         {"variant": "V5", "study": "batch", "batch": 8, "prompt_len": 8, "ms_per_token": 3.0,
                          "weight_GBps": 20.0, "comm_kernel_ms_per_token": None}]}
    ranks = [doc(), doc()]
    ranks[1]["rows"][0]["comm_kernel_ms_per_token"] = 0.6
    ranks[1]["rows"][0]["weight_GBps"] = ranks[1]["rows"][1]["weight_GBps"] = 10.0  # the smaller shard
    per_rank = [TP.rank_figures(r) for r in ranks]
    out = ranks[0]
    TP.add_tp_figures(out, per_rank, rank_view(0, 2), "m")
    ladder, batch = out["rows"]
    assert ladder["allreduce_share_of_step_per_rank"] == [0.25, 0.3] and out["summary"]["m_allreduce_share"] == 0.3
    assert "allreduce_share_of_step" not in batch
    assert ladder["aggregate_weight_GBps"] == 40.0 and batch["aggregate_weight_GBps"] == 30.0


# ---------------------------------------------------------------------------------------------------
# --quant int8 under --tp
# ---------------------------------------------------------------------------------------------------


def test_int8_over_two_ranks_quantizes_the_weights_one_process_quantizes():
    """wo and w_down are split by columns: each rank scaled its half of a row by that half's own max, other int8
    weights (other logits, other tokens) than --quant int8 on one process; a row's scale is now the whole row's."""
    spec = study.Spec(model="tiny", dtype="fp32", variants=["V2"], prompt_len=5, new_tokens=6, device="cpu",
                      compile_backend="eager", max_layers=2, seed=3, quant="int8")
    one = TP.run_variants(spec)
    two = TP.launch(spec, 2, target=TP.tokens_worker)
    assert two["V2"]["tokens"] == one["V2"]["tokens"]
    # the row-parallel sums run in another order: fp32 rounding apart, the same logits
    torch.testing.assert_close(two["V2"]["logits"], one["V2"]["logits"], rtol=1e-5, atol=1e-5)
    plain = TP.run_variants(replace(spec, quant=None))
    assert not torch.allclose(plain["V2"]["logits"], one["V2"]["logits"], rtol=1e-5, atol=1e-5)  # int8 did run


# ---------------------------------------------------------------------------------------------------
# GGUF tensor types
# ---------------------------------------------------------------------------------------------------

def write_gguf(path, cast=None):
    """A llama GGUF of UNEVEN's random weights (Q/K rows as stored: these tests compare two files' loads);
    cast: {gguf tensor name: numpy dtype} for tensors stored in another type."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed")
    a, m = UNEVEN, M.build(UNEVEN, seed=7)
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, a.n_layers), (w.add_context_length, a.max_seq_len),
                       (w.add_embedding_length, a.dim), (w.add_feed_forward_length, a.ffn_dim),
                       (w.add_head_count, a.n_heads), (w.add_head_count_kv, a.n_kv_heads), (w.add_key_length, a.head_dim)):
        add(value)
    layer = m.layers[0]
    q, k, v = layer.wqkv.split([a.q_rows, a.kv_rows, a.kv_rows])
    gate, up = layer.w_gate_up.split([a.ffn_dim, a.ffn_dim])
    tensors = {C.GGUF_NAMES["tok_emb"]: m.tok_emb, C.GGUF_NAMES["norm"]: m.norm}
    for role, t in {"attn_norm": layer.attn_norm, "q": q, "k": k, "v": v, "o": layer.wo, "ffn_norm": layer.ffn_norm,
                    "gate": gate, "up": up, "down": layer.w_down}.items():
        tensors[C.GGUF_NAMES["layer"][role].format(i=0)] = t
    for name, t in tensors.items():
        w.add_tensor(name, t.numpy().astype((cast or {}).get(name, "float32")))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_tensor_in_float64_loads_as_its_float32_twin(tmp_path):
    """gguf's dequantize has no F64 (nor I8 ... I64, Q8_1, Q8_K): a NotImplementedError traceback."""
    plain = C.load(write_gguf(tmp_path / "f32.gguf")).model
    wide = C.load(write_gguf(tmp_path / "f64.gguf", cast={"output_norm.weight": "float64",
                                                          "blk.0.ffn_down.weight": "float64"})).model
    assert all(torch.equal(x, y) for x, y in zip(plain.parameters(), wide.parameters(), strict=True))


def test_a_gguf_tensor_type_gguf_cannot_dequantize_is_one_line(tmp_path, capsys):
    from decode_cli_helpers import SMALL, cli, one_line

    path = write_gguf(tmp_path / "i8.gguf", cast={"blk.0.ffn_norm.weight": "int8"})
    with pytest.raises(UserError, match=r"blk\.0\.ffn_norm\.weight .*I8"):
        C.load(path)
    one_line(*cli(["--model", str(path), "--prompt-len", "3"] + SMALL, capsys), "blk.0.ffn_norm.weight")
