"""Tensor-parallel decode on torch.distributed (NCCL on GPUs, gloo on the CPU), Megatron-style.

Each of N ranks holds a shard and runs the same decode study on its own device:
- wqkv by heads (the rank's KV heads and the query heads that read them; uneven where N does not divide
  them, e.g. SmolLM2's 3 KV heads over 2 ranks as 2 + 1), w_gate_up by its
  gate and up halves then by columns of the FFN, both column-parallel: no communication;
- wo and w_down row-parallel: the partial products are all-reduced, then the residual is added once
  (model.linear_residual / silu_mul_linear_residual with tp=...);
- the embedding and the LM head by vocabulary rows (padded to N equal shards): the embedding is a masked
  lookup plus an all-reduce; the LM head's local logits are all-gathered. We gather the logits rather than
  (max, index) pairs because the engines, sampling (top-k / top-p) and the teacher-forced logit checks all
  consume full logits, so every rung runs unchanged; at batch 1 the gather moves V x 2 bytes (250 KB for a
  128k vocabulary, well under a microsecond on NVLink): it costs one collective's latency, as the pair
  gather would.

Collectives are torch.distributed's: in eager code (and so inside an eagerly captured CUDA graph: NCCL is
graph-capturable) the in-place dist.all_reduce; under torch.compile the functional collectives
(torch.distributed._functional_collectives), which trace with no graph break. `launch()` starts the ranks
with torchrun's launcher (torch.distributed.launcher.api.elastic_launch): a rank that fails ends the others
(the agent kills them) and the failure comes back as one UserError line naming the rank and the cause.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F

# record: torchrun's error file, so a failing rank's exception reaches the launcher as its message
from torch.distributed.elastic.multiprocessing.errors import record

from gpuspeed.errors import UserError

# test hook: "RANK:exit" (the rank dies) or "RANK:raise" (it raises) as it starts; "RANK:HOW:step" (or stepN) in the
# first timed call of its first (N-th) timing, while the other ranks wait in that call's collectives (an OOM in a step)
FAIL_ENV = "GPUSPEED_TP_FAIL"
PORT_ENV = "GPUSPEED_TP_PORT"  # the rendezvous port (default: a free one)
TIMEOUT_ENV = "GPUSPEED_TP_TIMEOUT_S"  # the process group's timeout: a rank stuck in a collective fails
PROGRESS_ENV = "GPUSPEED_TP_PROGRESS"  # launch() sets it: the file rank 0 appends its steps to, for the launcher's bar
DEFAULT_TIMEOUT_S = 600.0  # compiles and kernel choices differ per rank; a 70B shard compiles for minutes
# NVLink multicast (NVLS) stays off: on a shared host a program using it can take the GPUs out of service
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FULL_MODEL_MAX_PARAMS = 2e9  # random weights up to this size are made whole and sliced (same weights as --tp 1)


@dataclass(eq=False)
class TP:
    """One rank's view of the tensor-parallel group (held by the sharded model as model.tp)."""

    group: object
    rank: int
    world: int
    vocab_size: int  # the full vocabulary
    vocab_local: int  # rows per shard (the last one zero-padded)
    ctl: object = None  # a gloo group for host-side control (lockstep timing)
    args: object = None  # the whole model's ModelArgs
    notes: list = field(default_factory=list)
    timings: int = 0  # lockstep timings begun (FAIL_ENV's stepN)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_local

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            from torch.distributed import _functional_collectives as funcol

            return funcol.all_reduce(y, "sum", self.group)
        import torch.distributed as dist

        y = y.contiguous()
        dist.all_reduce(y, group=self.group)
        return y

    def all_reduce_max(self, y: torch.Tensor) -> torch.Tensor:
        """The elementwise max over ranks (eager only: int8 scales of column-split rows, quant.quantize_model)."""
        import torch.distributed as dist

        y = y.contiguous()
        dist.all_reduce(y, op=dist.ReduceOp.MAX, group=self.group)
        return y

    def embed(self, tokens: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The rows of this rank's vocabulary shard, zeros for the others', summed over ranks."""
        local = tokens - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_local)
        x = F.embedding(local.masked_fill(outside, 0), w).masked_fill(outside[..., None], 0.0)
        return self.all_reduce(x)

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, S, V/N] local logits -> [B, S, V] on every rank (the same bits everywhere)."""
        b, s, v = logits.shape
        flat = logits.reshape(b * s, v).contiguous()
        if torch.compiler.is_compiling():
            from torch.distributed import _functional_collectives as funcol

            g = funcol.all_gather_tensor(flat, 0, self.group)
        else:
            import torch.distributed as dist

            g = flat.new_empty(self.world * b * s, v)
            if flat.device.type == "cpu":  # gloo: the list form
                parts = list(g.chunk(self.world))
                dist.all_gather(parts, flat, group=self.group)
            else:
                dist.all_gather_into_tensor(g, flat, group=self.group)
        full = g.view(self.world, b, s, v).permute(1, 2, 0, 3).reshape(b, s, self.world * v)
        return full[..., :self.vocab_size]


# ---------------------------------------------------------------------------------------------------
# Sharding
# ---------------------------------------------------------------------------------------------------


def split(total: int, world: int, rank: int) -> tuple[int, int]:
    """(start, count) of rank's share of `total` items: equal shares, the first total % world ranks one more."""
    base, extra = divmod(total, world)
    return rank * base + min(rank, extra), base + (rank < extra)


def local_args(args, world: int, rank: int = 0):
    """The shapes of one rank's shard: its KV heads (and their query heads), its FFN columns, V/N vocabulary
    rows (rounded up). Heads that do not divide by N split unevenly (SmolLM2's 3 KV heads over 2 ranks: 2 + 1):
    the all-reduced tensors are [B, S, dim] on every rank all the same."""
    if world < 1:
        raise UserError(f"--tp must be >= 1, got {world}")
    if args.n_kv_heads < world:
        raise UserError(f"--tp {world}: {args.name} has {args.n_kv_heads} KV heads, fewer than {world} ranks "
                        "(each rank needs at least one)")
    if args.ffn_dim < world:
        raise UserError(f"--tp {world}: {args.name}'s FFN width {args.ffn_dim} is smaller than {world}")
    g = args.n_heads // args.n_kv_heads
    kv = split(args.n_kv_heads, world, rank)[1]
    return replace(args, n_heads=kv * g, n_kv_heads=kv, ffn_dim=split(args.ffn_dim, world, rank)[1],
                   vocab_size=math.ceil(args.vocab_size / world), head_dim=args.head_dim)


def shard_tensor(role: str, t: torch.Tensor, args, rank: int, world: int) -> torch.Tensor:
    """This rank's slice of a full tensor (any device; a view where it can be). role: q, k, v (rows by heads),
    gate, up (rows), o, down (columns), vocab (rows, zero-padded), replicated."""
    if role == "replicated":
        return t
    kv0, kvn = split(args.n_kv_heads, world, rank)
    g, d = args.n_heads // args.n_kv_heads, args.head_dim
    f0, fn = split(args.ffn_dim, world, rank)
    if role == "q":
        return t[kv0 * g * d:(kv0 + kvn) * g * d]
    if role in ("k", "v"):
        return t[kv0 * d:(kv0 + kvn) * d]
    if role == "o":
        return t[:, kv0 * g * d:(kv0 + kvn) * g * d]
    if role in ("gate", "up"):
        return t[f0:f0 + fn]
    if role == "down":
        return t[:, f0:f0 + fn]
    if role == "vocab":
        vl = math.ceil(args.vocab_size / world)
        part = t[rank * vl:(rank + 1) * vl]
        if part.shape[0] < vl:
            part = torch.cat([part, part.new_zeros(vl - part.shape[0], *part.shape[1:])])
        return part
    raise ValueError(role)


def set_vocab(tp: TP, args) -> None:
    tp.args, tp.vocab_size, tp.vocab_local = args, args.vocab_size, math.ceil(args.vocab_size / tp.world)


@torch.no_grad()
def shard_model(full, tp: TP, device, dtype=None):
    """A rank's shard of a whole model (slices taken where the full model lives, then moved: only the shard
    reaches `device`)."""
    from gpuspeed.decode import model as M

    a, r, n = full.args, tp.rank, tp.world
    la = local_args(a, n, r)
    set_vocab(tp, a)
    m = M.build(la, device=device, dtype=dtype or full.dtype, seed=None)

    def put(dst, src):
        dst.copy_(src.to(device=dst.device, dtype=dst.dtype))

    put(m.tok_emb, shard_tensor("vocab", full.tok_emb, a, r, n))
    put(m.norm, full.norm)
    if full.lm_head is not None:
        put(m.lm_head, shard_tensor("vocab", full.lm_head, a, r, n))
    for src, dst in zip(full.layers, m.layers, strict=True):
        put(dst.attn_norm, src.attn_norm)
        put(dst.ffn_norm, src.ffn_norm)
        q, k, v = src.wqkv.split([a.q_rows, a.kv_rows, a.kv_rows])
        put(dst.wqkv, torch.cat([shard_tensor(role, w, a, r, n) for role, w in (("q", q), ("k", k), ("v", v))]))
        put(dst.wo, shard_tensor("o", src.wo, a, r, n))
        gate, up = src.w_gate_up.split([a.ffn_dim, a.ffn_dim])
        put(dst.w_gate_up, torch.cat([shard_tensor("gate", gate, a, r, n), shard_tensor("up", up, a, r, n)]))
        put(dst.w_down, shard_tensor("down", src.w_down, a, r, n))
    m.tp = tp
    return m


def load_model(spec, device: str, tp: TP):
    """study.load_model for one rank: (Checkpoint holding the rank's shard, its fp32 reference shard or None).

    Random weights: up to FULL_MODEL_MAX_PARAMS the whole model is made from the seed (as --tp 1 makes it)
    and sliced, so the tokens compare with --tp 1; larger ones (the 70B never fits one GPU) are generated per
    shard on the device. An HF folder is read slice by slice (load_hf_shard); a GGUF file whole on the host,
    then sliced: only the rank's slices reach its device."""
    from gpuspeed.decode import checkpoints, model as M
    from gpuspeed.decode.study import DTYPES, _cast

    dtype = DTYPES[spec.dtype]
    want_ref = spec.agreement and spec.dtype != "fp32"
    if spec.model in M.CONFIGS:
        over = {"n_layers": spec.max_layers} if spec.max_layers else {}
        args = M.named_config(spec.model, **over)
        la = local_args(args, tp.world, tp.rank)
        set_vocab(tp, args)
        if want_ref and la.param_count() * 4 > 0.4 * _mem_bytes(device):
            want_ref = False
            tp.notes.append(f"no fp32 reference: an fp32 shard of {spec.model} would not fit beside the {spec.dtype} one")
        first = torch.float32 if want_ref else dtype
        if args.param_count() <= FULL_MODEL_MAX_PARAMS:
            full = M.build(args, device=device, dtype=first, seed=spec.seed)
            m = shard_model(full, tp, device)
            del full
        else:
            m = M.build(la, device=device, dtype=first, seed=spec.seed + 1009 * (tp.rank + 1))
            m.tp = tp
            tp.notes.append(f"random weights generated per rank shard ({args.param_count() / 1e9:.0f}B parameters): "
                            "tokens are not comparable with --tp 1")
        ck = checkpoints.Checkpoint(model=m, source="random")
    elif Path(spec.model).is_dir():
        ck = load_hf_shard(spec.model, tp, device, torch.float32 if want_ref else dtype)
        m = ck.model
    else:  # GGUF: quantized blocks are dequantized whole, so the file is read on the host and sliced there
        full = checkpoints.load(spec.model, device="cpu", dtype=torch.float32 if want_ref else dtype)
        local_args(full.model.args, tp.world)  # a clear error before any copy
        ck = full
        ck.model = shard_model(full.model, tp, device)
        m = ck.model
    ref = None
    if want_ref:
        ref, m = m, _cast(m, dtype)
        m.tp = tp
        ck.model = m
    return ck, ref


def full_shape(role: str, args) -> tuple[int, int]:
    """The whole model's shape of a sharded tensor (role as shard_tensor's), before any rank's slice."""
    q, kv, f, d = args.q_rows, args.kv_rows, args.ffn_dim, args.dim
    return {"q": (q, d), "k": (kv, d), "v": (kv, d), "o": (d, q), "gate": (f, d), "up": (f, d), "down": (d, f),
            "vocab": (args.vocab_size, d)}[role]


def _role(name: str, names: dict) -> str:
    """A checkpoint tensor's sharding role, from our name for it (checkpoints.HF_NAMES)."""
    import re

    template = re.sub(r"\.\d+\.", ".{i}.", name, count=1)
    ours = next((k for k, v in names["layer"].items() if v == template), None)
    if ours in ("q", "k", "v", "o", "gate", "up", "down"):
        return ours
    return "vocab" if name in (names["tok_emb"], names["lm_head"]) else "replicated"


@torch.no_grad()
def load_hf_shard(folder, tp: TP, device, dtype):
    """A Hugging Face folder read slice by slice (safetensors' get_slice): each rank reads only its rows or
    columns of every tensor, and only those reach its device."""
    from gpuspeed.decode import checkpoints as C

    def shape_args(args):
        set_vocab(tp, args)
        return local_args(args, tp.world, tp.rank)

    def read(handle, name: str, args) -> torch.Tensor:
        sl = handle.get_slice(name)
        role = _role(name, C.HF_NAMES)
        if role == "replicated":
            return sl[:]
        # a slice of a tensor larger than config.json says has the shard's shape: refused here, as one process does
        whole, want = tuple(sl.get_shape()), full_shape(role, args)
        if whole != want:
            raise UserError(f"checkpoint tensor {name} has shape {whole}, expected {want}")
        r, n = tp.rank, tp.world
        kv0, kvn = split(args.n_kv_heads, n, r)
        g, d = args.n_heads // args.n_kv_heads, args.head_dim
        f0, fn = split(args.ffn_dim, n, r)
        if role == "q":
            return sl[kv0 * g * d:(kv0 + kvn) * g * d]
        if role in ("k", "v"):
            return sl[kv0 * d:(kv0 + kvn) * d]
        if role == "o":
            return sl[:, kv0 * g * d:(kv0 + kvn) * g * d]
        if role in ("gate", "up"):
            return sl[f0:f0 + fn]
        if role == "down":
            return sl[:, f0:f0 + fn]
        vl = tp.vocab_local  # vocab: this rank's rows, zero-padded
        part = sl[r * vl:min((r + 1) * vl, args.vocab_size)]
        return torch.cat([part, part.new_zeros(vl - part.shape[0], *part.shape[1:])]) if part.shape[0] < vl else part

    ck = C.load_hf(folder, device=device, dtype=dtype, shape_args=shape_args, read=read)
    ck.model.tp = tp
    return ck


def _mem_bytes(device: str) -> int:
    if device == "cuda":
        from gpuspeed import device as _device

        return _device.get_device("cuda").mem_bytes
    return 1 << 62  # the host: no check here


# ---------------------------------------------------------------------------------------------------
# Lockstep timing: every rank must make the same number of collective calls
# ---------------------------------------------------------------------------------------------------


def _signal(tp: TP, value: int) -> int:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, 0, group=tp.ctl)
    return int(t.item())


def rank0_says(tp: TP, flag: bool) -> bool:
    """Rank 0's flag on every rank (a yes/no each rank decides by its own clock, as study.run's time cap, would
    differ between ranks and leave one in a collective the others skip)."""
    if tp.world == 1:
        return flag
    return bool(_signal(tp, int(flag)))


def lockstep(bench_fn, tp: TP | None):
    """gpuspeed.bench for a TP rank. bench decides the number of calls by time (warm-up, noise, budget),
    which differs per rank, and a call that runs collectives must run on every rank: rank 0 runs bench and,
    before each call, tells the others (a one-integer gloo broadcast, host side) to make the same call; at the
    end it sends stop and its Measurement, which every rank returns."""
    if tp is None or tp.world == 1:
        return bench_fn

    def run(fn, *args, **kw):
        import torch.distributed as dist

        tp.timings += 1
        nth = tp.timings
        if tp.rank == 0:
            def call(*a, **k):
                _signal(tp, 1)
                _inject_failure(tp.rank, "step", nth)
                return fn(*a, **k)
            call.__name__ = getattr(fn, "__name__", "fn")
            # a failure ends the run (study.run re-raises under TP) with no 'stop' sent: the other ranks may sit in
            # the failed call's collectives, where a broadcast on the control group would wait for them till timeout
            m = bench_fn(call, *args, **kw)
            _signal(tp, 0)
            dist.broadcast_object_list([m], 0, group=tp.ctl)
            return m
        while _signal(tp, 0):
            _inject_failure(tp.rank, "step", nth)
            fn(*args, **(kw.get("kwargs") or {}))
        box = [None]
        dist.broadcast_object_list(box, 0, group=tp.ctl)
        return box[0]

    return run


# ---------------------------------------------------------------------------------------------------
# Ranks and the launcher
# ---------------------------------------------------------------------------------------------------


def _inject_failure(rank: int, where: str = "start", nth: int = 1) -> None:
    what = os.environ.get(FAIL_ENV, "")
    if not what:
        return
    r, how, at = (what.split(":") + [""])[:3]
    if r.strip() == str(rank) and (at or "start") in ((where, f"{where}{nth}") if nth == 1 else (f"{where}{nth}",)):
        if how == "exit":
            os._exit(17)  # dies as a killed process would: no exception, no cleanup
        raise RuntimeError(f"failure injected by {FAIL_ENV}={what}")


def _record_then_leave(fn):
    """torchrun's @record (the rank's error file, the launcher's message), then os._exit(1) on a failure: the process
    group is left up on purpose (the peers' 'connection closed' must come after this rank's error), and a normal exit
    then aborted in one of gloo's threads still joinable ('terminate called without an active exception')."""
    import functools
    import sys

    recorded = record(fn)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return recorded(*args, **kwargs)
        except Exception:  # recorded: its error file is written
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # a closed stream: nothing left to say on it
                    pass
            os._exit(1)

    return run


def init(device: str) -> TP:
    """This process's rank (torchrun's environment): the process group, its device, the control group."""
    import torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    if device == "cuda":
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local))
        ctl = dist.new_group(backend="gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
        ctl = dist.new_group(backend="gloo", timeout=timeout)
    return TP(group=dist.group.WORLD, rank=rank, world=world, vocab_size=0, vocab_local=0, ctl=ctl)


@_record_then_leave
def worker(spec) -> dict | None:
    """One rank: the decode study on its shard; rank 0 returns the results document."""
    import torch.distributed as dist

    from gpuspeed import device as _device
    from gpuspeed.decode import study

    rank = int(os.environ["RANK"])
    _inject_failure(rank)
    device = _device.resolve_device(spec.device)
    tp = init(device)
    # no destroy_process_group after a failure: @record writes this rank's error, then its exit closes the
    # connections, so the other ranks' 'connection closed' comes after it (_failure_line names this rank)
    spec = replace(spec, hf=False, out=spec.out if rank == 0 else None)
    progress, total = _step_writers(os.environ.get(PROGRESS_ENV) if rank == 0 else None)
    doc = study.run(spec, tp=tp, progress=progress, total=total)
    # every rank's all-reduce share and its shard's GB/s, for the per-rank figures and the aggregate
    everyone = [None] * tp.world
    dist.all_gather_object(everyone, rank_figures(doc), group=tp.ctl)
    dist.destroy_process_group()
    if rank != 0:
        return None
    add_tp_figures(doc, everyone, tp, spec.label())
    return doc


RANK_FIGURES = ("comm_kernel_ms_per_token", "kernel_ms_per_token", "weight_GBps")


def row_key(r: dict) -> str | None:
    """A row's name among a rank's figures: a ladder row's variant; the best rung's --batches and --long-prompt
    rows run that variant again, so theirs add the study and its size (keyed by variant alone, they replaced it)."""
    name = r.get("variant")
    if name is None or r.get("study", "ladder") == "ladder":
        return name
    return f"{name} {r['study']} b{r.get('batch')} p{r.get('prompt_len')}"


def rank_figures(doc: dict) -> dict:
    """What add_tp_figures needs from one rank's results: each row's collective time and its shard's GB/s."""
    return {row_key(r): {k: r.get(k) for k in RANK_FIGURES} for r in doc["rows"] if r.get("variant")}


def add_tp_figures(doc: dict, per_rank: list, tp: TP, label: str) -> None:
    """tp, per-rank all-reduce shares and the aggregate weight GB/s on every row; TP summary keys."""
    doc["notes"] += [n for n in tp.notes if n not in doc["notes"]]
    roof = (doc["params"].get("read_ceiling") or {}).get("GBps")
    for r in doc["rows"]:
        r["tp"] = tp.world
        name = row_key(r)
        shares = []
        for k, ranks in enumerate(per_rank):
            fig = (ranks or {}).get(name) or {}
            comm = fig.get("comm_kernel_ms_per_token")
            if comm is not None and r.get("ms_per_token"):
                shares.append(comm / r["ms_per_token"])
                r.setdefault("allreduce_ms_per_token_per_rank", {})[str(k)] = comm
        if shares:
            r["allreduce_share_of_step_per_rank"] = shares
            r["allreduce_share_of_step"] = max(shares)
        if "weight_GBps" in r:
            r["weight_GBps_per_rank"] = r["weight_GBps"]
            r["aggregate_weight_GBps"] = _aggregate_GBps(r["weight_GBps"], name, per_rank, tp.world)
            if roof:
                r["aggregate_pct_of_read_roof"] = 100 * r["aggregate_weight_GBps"] / (tp.world * roof)
    ok = [r for r in doc["rows"] if r.get("study") == "ladder" and "ms_per_token" in r]
    best = min(ok, key=lambda r: r["ms_per_token"]) if ok else {}
    s = doc["summary"]
    s[f"{label}_tokens_per_s"] = best.get("tokens_per_s")  # None where every rung failed or was skipped
    s[f"{label}_aggregate_weight_GBps"] = best.get("aggregate_weight_GBps")
    if best.get("aggregate_pct_of_read_roof") is not None:
        s[f"{label}_aggregate_pct_of_read_roof"] = best["aggregate_pct_of_read_roof"]
    if best.get("allreduce_share_of_step") is not None:
        s[f"{label}_allreduce_share"] = best["allreduce_share_of_step"]


def _aggregate_GBps(rank0_GBps: float, name, per_rank: list, world: int) -> float:
    """The ranks' weight GB/s summed (each times its own shard in rank 0's lockstep time): uneven shards (3 KV heads
    over 2 ranks) make rank 0's the largest, so its figure times N counted bytes no rank read. Where a rank's figure
    is missing, rank 0's times N."""
    each = [((ranks or {}).get(name) or {}).get("weight_GBps") for ranks in per_rank]
    if len(each) != world or any(g is None for g in each):
        return rank0_GBps * world
    return sum(each)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_launch(n: int, device: str) -> None:
    """N ranks need N GPUs on a GPU run (NCCL does not share one GPU between ranks)."""
    if n < 1:
        raise UserError(f"--tp must be >= 1, got {n}")
    if device == "cuda":
        have = torch.cuda.device_count()
        if n > have:
            raise UserError(f"--tp {n} needs {n} GPUs; this machine has {have}")


# a rank's error that only says a peer went away (its process exited): the cause is that peer's, never this one's
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exit")


def _peer_gone(f) -> bool:
    msg = f.message.get("message") if isinstance(f.message, dict) else f.message
    return any(s in str(msg or "").lower() for s in _PEER_GONE)


def _every_rank_failure(exc) -> dict:
    """The failures torchrun reported (most often the one process it saw end first) and the error files the other
    ranks of the attempt left beside them (<attempt>/<rank>/error.json): all ranks had ended when it reported."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failures = dict(exc.failures)
    for f in list(failures.values()):
        if not f.error_file or not os.path.isfile(f.error_file):
            continue
        for other in Path(f.error_file).parent.parent.glob("*/error.json"):
            rank = other.parent.name
            if rank.isdigit() and int(rank) not in failures:
                try:
                    failures[int(rank)] = ProcessFailure(local_rank=int(rank), pid=0, exitcode=1, error_file=str(other))
                except Exception:  # a file half-written as the rank was killed: nothing to learn from it
                    pass
    return failures


def _failure_line(exc) -> str:
    """'rank R: cause' from torchrun's ChildFailedError (the worker's exception, or how the process ended). A rank that
    raised comes first, unless its error only says a peer's connection closed (that peer's exit caused it), then one
    that exited, then one killed; among those, the first error file by time: torchrun names the process it saw end
    first (both end within one of its polls) and its first failure is by whole seconds, so a rank that failed after
    another (gloo's 'connection closed by peer', a SIGSEGV in the teardown of one stopped) was named for the cause."""
    import signal

    def cause(item):
        r, f = item
        raised = isinstance(f.message, dict) and bool(f.message.get("message"))
        try:  # the error file's time to the nanosecond: the rank that raised first wrote first
            when = os.path.getmtime(f.error_file)
        except (OSError, TypeError):
            when = float(f.timestamp)
        return (_peer_gone(f), not raised, f.exitcode is None or f.exitcode < 0, when, r)

    failures = _every_rank_failure(exc) if exc.failures else {}
    rank, f = min(failures.items(), key=cause) if failures else exc.get_first_failure()
    msg = f.message
    if isinstance(msg, dict):
        msg = msg.get("message") or ""
    msg = str(msg or "").strip()
    if not msg or msg.startswith("To enable traceback") or msg.startswith("Signal"):
        if f.exitcode is not None and f.exitcode < 0:
            try:
                msg = f"killed by {signal.Signals(-f.exitcode).name}"
            except ValueError:
                msg = f"killed by signal {-f.exitcode}"
        else:
            msg = f"exited with code {f.exitcode}"
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    return f"rank {rank} failed: {lines[-1] if lines else msg}"[:400]


def run_variants(spec, tp: TP | None = None) -> dict:
    """Greedy tokens and per-step logits of each of spec.variants (no timing): the --tp N vs --tp 1 identity
    check (of the int8 weights under spec.quant). With tp=None the whole model in this process (study.load_model),
    else this rank's shard."""
    from gpuspeed import device as _device
    from gpuspeed.decode import study, variants as V
    from gpuspeed.decode.generate import generate

    device = _device.resolve_device(spec.device)
    spec = replace(spec, agreement=False)
    ck, _ = study.load_model(spec, device) if tp is None else load_model(spec, device, tp)
    if spec.quant:  # the weights the study's --quant rungs run (prepare()'s, with no reference kept)
        from gpuspeed.decode import quant

        quant.quantize_model(ck.model)
        ck.model.int8_choices = quant.choose(ck.model, [])
    prompt, _ = study.make_prompt(spec, ck, device)
    out = {}
    for name in spec.variants:
        e = V.make_engine(name, ck.model, prompt.shape[0], V.max_len_for(prompt.shape[1], spec.new_tokens),
                          compile_backend=spec.compile_backend)
        rec = study._Logits()
        toks = generate(e, prompt, spec.new_tokens, on_logits=rec)
        out[name] = {"tokens": toks.tolist(), "logits": torch.stack([x.cpu() for x in rec.steps]),
                     "info": {k: e.info[k] for k in ("graph_mode", "graph_breaks", "triton_gemv_shapes") if k in e.info}}
        e.__dict__.clear()
    return out


@_record_then_leave
def tokens_worker(spec) -> dict | None:
    """One rank of run_variants; rank 0 returns the tokens and logits."""
    import torch.distributed as dist

    from gpuspeed import device as _device

    rank = int(os.environ["RANK"])
    _inject_failure(rank)
    tp = init(_device.resolve_device(spec.device))
    out = run_variants(spec, tp)  # a failure leaves the group to the process's exit, as worker's does
    dist.destroy_process_group()
    return out if rank == 0 else None


def _step_writers(path: str | None):
    """study.run's progress and total callbacks for rank 0: one JSON line each in the launcher's file (None, None
    without one)."""
    if not path:
        return None, None
    import json

    def write(kind: str, value) -> None:
        with open(path, "a") as f:  # one short line per step: appended whole, read by _relay_steps
            f.write(json.dumps([kind, value]) + "\n")

    return (lambda what: write("step", what)), (lambda n: write("total", n))


@contextmanager
def _relay_steps(progress, total):
    """While the ranks run: rank 0's steps (written to a file named in PROGRESS_ENV) reach progress(text) and
    total(n) in this process, from a thread that reads the file's new lines as they come."""
    if progress is None and total is None:
        yield
        return
    import json
    import tempfile

    fd, path = tempfile.mkstemp(prefix="gpuspeed-tp-steps-", suffix=".jsonl")
    os.close(fd)
    before = os.environ.get(PROGRESS_ENV)
    os.environ[PROGRESS_ENV] = path  # the ranks inherit this process's environment
    stop = threading.Event()

    def relay(f) -> None:
        pending = ""
        while True:
            last = stop.is_set()  # read once more after the ranks ended: their last lines
            pending += f.read()
            *lines, pending = pending.split("\n")
            for line in lines:
                try:
                    kind, value = json.loads(line)
                    if kind == "step" and progress:
                        progress(str(value))
                    elif kind == "total" and total:
                        total(int(value))
                except Exception:  # a progress line is never worth the run
                    pass
            if last:
                return
            stop.wait(0.1)

    with open(path) as f:
        thread = threading.Thread(target=relay, args=(f,), name="gpuspeed-tp-steps", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            if before is None:
                os.environ.pop(PROGRESS_ENV, None)
            else:
                os.environ[PROGRESS_ENV] = before
            Path(path).unlink(missing_ok=True)


def launch(spec, n: int, target=None, progress=None, total=None) -> dict:
    """Run the study (or target: a module-level function of spec) on N ranks with torchrun's launcher, from
    Python; rank 0's return value. progress(text) and total(n): study.run's callbacks, called here as rank 0 of
    the study calls them."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from gpuspeed import device as _device
    from gpuspeed.decode.study import check_fits

    started = time.time()  # a partial decode.json written after this is this run's (study.partial_kept)
    device = _device.resolve_device(spec.device)
    check_launch(n, device)
    spec = replace(spec, tp=n)  # the ranks' study is labelled as N ranks' (Spec(tp=1) gave 2 ranks tp 1's keys)
    check_fits(spec, device)  # rank 0's shard fits its GPU, before any rank starts
    for key, value in NO_MULTICAST.items():  # the ranks inherit this environment
        os.environ.setdefault(key, value)
    # torchrun's own default for several ranks on one host: N ranks each with a pool of one thread a core
    # oversubscribe the CPU (gloo ranks compute there), and fewer native threads live beside gloo's
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    port = os.environ.get(PORT_ENV)
    if port:
        try:
            port = int(port)
        except ValueError:
            raise UserError(f"{PORT_ENV} must be a port number, got {port!r}") from None
        if not port_free(port):
            raise UserError(f"--tp {n}: the rendezvous port {port} ({PORT_ENV}) is in use")
    else:
        port = free_port()
    # torch.multiprocessing: its "Terminating process N via signal SIGTERM" as the agent stops the other ranks
    quiet = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run", "torch.multiprocessing")
    for name in [*quiet, *(n for n in logging.root.manager.loggerDict if n.startswith(quiet))]:
        # the one-line error below says what failed; torch gives each module's logger its own level (LOGLEVEL)
        logging.getLogger(name).setLevel(logging.CRITICAL)
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=f"gpuspeed-{uuid.uuid4().hex[:8]}",
                       rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{port}", max_restarts=0,
                       monitor_interval=0.1, start_method="spawn", local_addr="127.0.0.1")
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from gpuspeed.results import Terminated

    # the agent puts its own handlers on SIGTERM, SIGINT, SIGHUP and SIGQUIT (they stop the ranks, then raise
    # SignalException) and leaves them there: ours come back when it returns
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    # a signal the caller ignores (trap '' TERM) stays ignored: the agent handles only the others
    cfg.signals_to_handle = ",".join(s.name for s, h in handlers.items() if h is not signal.SIG_IGN)
    try:
        with _relay_steps(progress, total):
            out = elastic_launch(cfg, target or worker)(spec)
    except SignalException as exc:  # the ranks are stopped: the command's stop_signals says it in one line
        raise (Terminated(int(exc.sigval)) if exc.sigval == signal.SIGTERM else KeyboardInterrupt()) from None
    except ChildFailedError as exc:
        from gpuspeed.decode.study import partial_kept

        kept = partial_kept(getattr(spec, "out", None), started)  # rank 0 wrote the rungs before the failure
        raise UserError(_failure_line(exc) + (f"; {kept}" if kept else "")) from None
    except Exception as exc:  # the rendezvous itself (a port taken meanwhile, a store that did not start)
        text = str(exc).strip().splitlines()
        raise UserError(f"--tp {n}: the launcher failed: {type(exc).__name__}: {text[0][:200] if text else ''}") from None
    finally:
        if threading.current_thread() is threading.main_thread():  # handlers are the main thread's only
            for s, h in handlers.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
    return out[0]

