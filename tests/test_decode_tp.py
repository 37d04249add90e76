"""Tensor-parallel decode on the CPU: the shards, 2 gloo ranks against one process, rank failures, the CLI."""

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpuspeed.decode import model as M, study, tp as TP
from gpuspeed.errors import UserError
from gpuspeed.verify import check
from signal_helpers import tagged_processes
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)

ROOT = Path(__file__).resolve().parents[1]
# V3: its prefill runs eagerly (the in-place dist.all_reduce / all_gather), its decode steps compiled (the
# functional collectives, traced by dynamo with fullgraph=True)
SPEC = study.Spec(model="tiny", dtype="fp32", variants=["V3"], prompt_len=5, new_tokens=8, device="cpu",
                  compile_backend="eager", max_layers=2, seed=3)


class _Rank:
    """The fields shard_model reads (no process group: nothing here communicates)."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world


@pytest.mark.parametrize("name,world", [("tiny", 2), ("smollm2-135m", 2), ("llama-3.2-1b", 4)])
def test_shards_put_back_together_give_the_whole_model(name, world):
    over = dict(n_layers=1, vocab_size=1001, dim=48)  # a vocabulary N does not divide: padded shards
    if name == "tiny":
        over |= dict(n_heads=4, n_kv_heads=4, ffn_dim=40)
    elif name == "smollm2-135m":  # 3 KV heads over 2 ranks: 2 + 1 (and 9 query heads: 6 + 3)
        over |= dict(n_heads=9, n_kv_heads=3, ffn_dim=30, head_dim=8)
    else:
        over |= dict(n_heads=8, n_kv_heads=4, ffn_dim=64)
    a = M.named_config(name, **over)
    full = M.build(a, seed=5)
    shards = [TP.shard_model(full, _Rank(r, world), "cpu") for r in range(world)]
    assert sum(s.args.n_kv_heads for s in shards) == a.n_kv_heads
    assert sum(s.args.n_heads for s in shards) == a.n_heads
    # vocabulary rows: the shards in order, then zero padding
    emb = torch.cat([s.tok_emb for s in shards])
    assert torch.equal(emb[:a.vocab_size], full.tok_emb) and not emb[a.vocab_size:].any()
    L, S = full.layers[0], [s.layers[0] for s in shards]
    q, k, v = L.wqkv.split([a.q_rows, a.kv_rows, a.kv_rows])
    parts = [s.wqkv.split([sh.args.q_rows, sh.args.kv_rows, sh.args.kv_rows]) for s, sh in zip(S, shards, strict=True)]
    assert torch.equal(torch.cat([p[0] for p in parts]), q)
    assert torch.equal(torch.cat([p[1] for p in parts]), k)
    assert torch.equal(torch.cat([p[2] for p in parts]), v)
    assert torch.equal(torch.cat([s.wo for s in S], dim=1), L.wo)
    gate, up = L.w_gate_up.split([a.ffn_dim, a.ffn_dim])
    gu = [s.w_gate_up.chunk(2) for s in S]
    assert torch.equal(torch.cat([g for g, _ in gu]), gate) and torch.equal(torch.cat([u for _, u in gu]), up)
    assert torch.equal(torch.cat([s.w_down for s in S], dim=1), L.w_down)
    # GQA stays paired: each rank's query heads read its own KV heads (G per KV head, as in the whole model)
    assert all(s.args.n_heads == s.args.n_kv_heads * (a.n_heads // a.n_kv_heads) for s in shards)


def test_too_few_kv_heads_and_too_many_gpus_are_one_line_errors():
    with pytest.raises(UserError, match="KV heads, fewer than 4 ranks"):
        TP.local_args(M.named_config("smollm2-135m"), 4)
    # one more rank than this machine has GPUs (3 where there are none: no GPU machine has 2 by default)
    n = torch.cuda.device_count() + 1 if torch.cuda.is_available() else 3
    with pytest.raises(UserError, match=f"--tp {n} needs {n} GPUs; this machine has"):
        TP.check_launch(n, "cuda")
    with pytest.raises(UserError, match="--tp must be >= 1"):
        TP.check_launch(0, "cpu")


def test_two_gloo_ranks_give_one_process_tokens_and_logits():
    one = TP.run_variants(SPEC)
    two = TP.launch(SPEC, 2, target=TP.tokens_worker)
    for name in SPEC.variants:
        assert two[name]["tokens"] == one[name]["tokens"], name
        # the row-parallel sums run in another order: fp32 rounding apart, the same logits
        res = check(two[name]["logits"], one[name]["logits"].double())
        assert res.passed, (name, res.summary)
    assert two["V3"]["info"]["graph_breaks"] == 0  # the functional collectives trace whole (fullgraph=True)


@pytest.mark.parametrize("tied", [True, False])
def test_a_checkpoint_over_two_ranks_gives_one_process_tokens(tmp_path, tied):
    """An HF folder (3 KV heads: split 2 + 1; a vocabulary of 257: padded shards; a tied head, or an untied one in
    two files with an index), each rank reading only its slices (tp.load_hf_shard)."""
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    from gpuspeed.decode import checkpoints as C

    a = M.named_config("smollm2-135m", vocab_size=257, dim=48, n_layers=2, n_heads=6, n_kv_heads=3, ffn_dim=40)
    a = replace(a, tie_embeddings=tied)
    m = M.build(a, seed=11)
    sd = {k: v.contiguous() for k, v in C.hf_state_dict(m).items()}
    if tied:
        save_file(sd, str(tmp_path / "model.safetensors"))
    else:
        names = sorted(sd)
        files = {"model-1.safetensors": names[::2], "model-2.safetensors": names[1::2]}
        for f, keys in files.items():
            save_file({k: sd[k] for k in keys}, str(tmp_path / f))
        index = {"weight_map": {k: f for f, keys in files.items() for k in keys}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps(C.hf_config(a)))
    spec = replace(SPEC, model=str(tmp_path), variants=["V2"], max_layers=None)
    one = TP.run_variants(spec)
    two = TP.launch(spec, 2, target=TP.tokens_worker)
    assert two["V2"]["tokens"] == one["V2"]["tokens"]
    assert check(two["V2"]["logits"], one["V2"]["logits"].double()).passed


def _cli(*args, env=None, timeout=120):
    e = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **(env or {}))
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gpuspeed", "decode", *args], capture_output=True, text=True,
                       env=e, timeout=timeout, cwd=ROOT)
    return p, time.perf_counter() - t


SMALL = ["--model", "tiny", "--layers", "1", "--new-tokens", "3", "--prompt-len", "4", "--device", "cpu",
         "--no-profile", "--budget", "0.1", "--compile-backend", "eager"]


@pytest.mark.parametrize("how,cause", [("exit", "exited with code 17")])  # "raise": the exception's message
def test_a_failing_rank_ends_the_run_with_one_line_naming_it(how, cause):
    tag = f"h3-{os.getpid()}-{time.time_ns()}"  # marks every process of this run, to look for leftovers
    p, took = _cli(*SMALL, "--tp", "2", "--variants", "V2", env={TP.FAIL_ENV: f"1:{how}", "GPUSPEED_TEST_TAG": tag})
    assert p.returncode == 2, p.stderr[-2000:]
    left = tagged_processes(tag)
    assert not left, f"processes of the failed run still alive: {left}"
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("gpuspeed: error: rank 1 failed:") and cause in lines[-1], p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert took < 90  # the launcher ended rank 0 (blocked in the rendezvous or a collective): nothing hung


@pytest.mark.parametrize("args,needle", [
    (["--tp", "0"], "--tp must be >= 1"),
    (["--tp", "4", "--model", "smollm2-135m"], "3 KV heads, fewer than 4 ranks"),
])
def test_cli_bad_tp_is_one_line_before_any_rank_starts(args, needle, capsys):
    from gpuspeed.cli import main

    assert main(["decode", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuspeed: error:") and needle in err and len(err.strip().splitlines()) == 1


def test_a_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p, _ = _cli(*SMALL, "--tp", "2", "--variants", "V2", env={TP.PORT_ENV: str(port)})
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == f"gpuspeed: error: --tp 2: the rendezvous port {port} ({TP.PORT_ENV}) is in use"


def test_cli_tp2_runs_the_timed_study_in_lockstep_and_rank0_writes(tmp_path):
    """bench picks its number of calls by time, per rank: lockstep() makes every rank follow rank 0's, or the
    ranks' collectives would not pair up and the run would hang until the process group's timeout."""
    p, _ = _cli(*SMALL, "--tp", "2", "--variants", "V0,V2", "--out", str(tmp_path), "--json", timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads((tmp_path / "decode.json").read_text())
    assert doc["params"]["tp"] == 2
    rows = {r["variant"]: r for r in doc["rows"]}
    assert all(rows[v]["tp"] == 2 and rows[v]["ms_per_token"] > 0 for v in ("V0", "V2"))
    assert rows["V2"]["tokens_identical_to_V0"]
    s = doc["summary"]
    assert s["tiny_fp32_tp2_tokens_identical"] is True
    assert s["tiny_fp32_tp2_tokens_per_s"] > 0 and s["tiny_fp32_tp2_aggregate_weight_GBps"] > 0
    # a rank's weight bytes: its half of the layers and of the LM head, the norms whole
    a = M.named_config("tiny", n_layers=1)
    half = replace(a, n_heads=4, n_kv_heads=4, ffn_dim=a.ffn_dim // 2, vocab_size=a.vocab_size // 2)
    assert rows["V2"]["weight_bytes_per_token"] == half.weight_bytes_per_token(4)


def test_tp_figures_per_rank_share_and_aggregate_bandwidth():
    doc = {"params": {"read_ceiling": {"GBps": 4000.0}}, "notes": [], "summary": {"m_bf16_tp2_best_ms_per_token": 2.0},
           "rows": [{"variant": "V5", "study": "ladder", "ms_per_token": 2.0, "weight_GBps": 3000.0, "tokens_per_s": 500.0},
                    {"variant": "V4", "study": "ladder", "ms_per_token": 4.0, "weight_GBps": 1500.0}]}
    per_rank = [{"V5": {"comm_kernel_ms_per_token": 0.5}, "V4": {"comm_kernel_ms_per_token": None}},
                {"V5": {"comm_kernel_ms_per_token": 0.6}}]
    t = TP.TP(group=None, rank=0, world=2, vocab_size=0, vocab_local=0, notes=["a note"])
    TP.add_tp_figures(doc, per_rank, t, "m_bf16_tp2")
    v5, v4 = doc["rows"]
    assert v5["allreduce_share_of_step_per_rank"] == [0.25, 0.3] and v5["allreduce_share_of_step"] == 0.3
    assert v5["aggregate_weight_GBps"] == 6000.0 and v5["aggregate_pct_of_read_roof"] == 75.0
    assert "allreduce_share_of_step" not in v4 and v4["tp"] == 2
    s = doc["summary"]
    assert s["m_bf16_tp2_allreduce_share"] == 0.3 and s["m_bf16_tp2_aggregate_pct_of_read_roof"] == 75.0
    assert s["m_bf16_tp2_tokens_per_s"] == 500.0 and doc["notes"] == ["a note"]
