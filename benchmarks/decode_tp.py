"""results/<gpu>/decode_tp.json: tensor-parallel decode (tp 1, 2 and 4 where the GPUs allow) and int8 rows.

    python3 benchmarks/decode_tp.py --out DIR [--total-s 560] [--parts identity,tiny,8b,70b] [--tp 1,2,4]
    python3 benchmarks/decode_tp.py --out DIR --parts int8        (llama-3-8b --quant int8, one GPU)
    python3 benchmarks/decode_tp.py --merge-int8 DIR --into results/nvidia-h200/decode.json
    python3 benchmarks/decode_tp.py --out DIR --merge RUN_DIR [RUN_DIR ...]   (runs made in separate calls)

Parts: identity (greedy fp32 tokens of tiny and smollm2-135m with --tp 2 against one GPU, V2/V4/V5, no timing);
tiny (tiny fp32 V5 timed per tp), 8b (llama-3-8b bf16 V5 and V4c per tp), 70b (llama-3-70b bf16 V5 at tp >= 2:
141 GB of weights fit no single H200; random weights made per rank shard), int8 (llama-3-8b --quant int8 on one
GPU: its rows go into decode.json with --merge-int8). Each timed run is one `gpuspeed decode --tp N` process
under a time limit; with fewer GPUs than a tp asks for, that row is skipped with a one-line note.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (part, model, dtype, variants, share of the time, smallest tp)
TIMED = [
    ("tiny", "tiny", "fp32", "V5,V4", 0.12, 1),
    ("8b", "llama-3-8b", "bf16", "V5,V4c", 0.38, 1),
    ("70b", "llama-3-70b", "bf16", "V5", 0.50, 2),
]
INT8 = ("int8", "llama-3-8b", "bf16", "V5,V4c", 1.0, 1)


def say(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)


def identity(n_gpus: int, new_tokens: int) -> tuple[dict, list, list]:
    """{model}_fp32_tp2_tokens_identical for tiny and smollm2-135m; rows; notes."""
    import torch

    from gpuspeed.decode import study, tp as TP

    summary, rows, notes = {}, [], []
    if n_gpus < 2:
        notes.append(f"token identity --tp 2 vs --tp 1 skipped: {n_gpus} GPU(s)")
        return summary, rows, notes
    for model in ("tiny", "smollm2-135m"):
        spec = study.Spec(model=model, dtype="fp32", variants=["V2", "V4", "V5"], prompt_len=32,
                          new_tokens=new_tokens, device="cuda")
        one = TP.run_variants(spec)
        torch.cuda.empty_cache()
        two = TP.launch(spec, 2, target=TP.tokens_worker)
        same = True
        for name in spec.variants:
            a, b = one[name]["tokens"][0], two[name]["tokens"][0]
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
            row = {"study": "tokens", "model": model, "dtype": "fp32", "variant": name, "tp": 2,
                   "new_tokens": new_tokens, "tokens_identical_to_tp1": first is None,
                   "graph_mode": two[name]["info"].get("graph_mode"),
                   "max_logit_diff_vs_tp1_first_step": float((two[name]["logits"][1] - one[name]["logits"][1]).abs().max())}
            if first is not None:  # where it parted: how close one GPU's two best logits were there
                top2 = one[name]["logits"][first][0].topk(2).values
                row |= {"first_divergence": first, "tp1_top2_gap_at_divergence": float(top2[0] - top2[1])}
                same = False
            rows.append(row)
        summary[f"{model}_fp32_tp2_tokens_identical"] = same
    return summary, rows, notes


def timed_run(out: Path, part, model, dtype, variants, tp, cap_s, budget, extra=(), device="cuda"):
    run_dir = out / "runs" / f"{model}_{'int8' if part == 'int8' else dtype}_tp{tp}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "gpuspeed", "decode", "--model", model, "--dtype", dtype, "--variants", variants,
           "--tp", str(tp), "--no-hf", "--budget", str(budget), "--device", device, "--out", str(run_dir), *extra]
    # a soft cap keeps the rungs finished before it (TP ranks too: rank 0's clock decides for all, tp.rank0_says)
    cmd += ["--time-cap", f"{max(30.0, cap_s - 40):.0f}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(ROOT / "src"), os.environ.get("PYTHONPATH")] if p))
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=cap_s, cwd=ROOT)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, err = "timeout", (exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr) or ""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "stderr.log").write_text(err or "")
    path = run_dir / "decode.json"
    doc = json.loads(path.read_text()) if path.is_file() else None
    last = (err or "").strip().splitlines()[-1:] or [""]
    return doc, "" if rc == 0 else f"{model} {dtype} tp{tp}{' int8' if part == 'int8' else ''}: exit {rc}: {last[0][:200]}"


def combine(docs: list[dict], extra_summary: dict, extra_rows: list, notes: list, n_gpus: int, argv) -> dict:
    from gpuspeed.results import make_results

    summary: dict = {}
    rows = list(extra_rows)
    params: dict = {"gpus": n_gpus, "runs": []}
    for d in docs:
        s = dict(d["summary"])
        for k in [k for k in s if k.endswith("_tokens_identical")]:
            v = s.pop(k)  # the run's rungs vs its own V0 (not run here); *_tokens_identical is the tp-vs-tp1 check
            if "V0" in (d["params"].get("variants") or []):
                s[k + "_to_V0"] = v
        summary |= s
        rows += [dict(r, run_tp=d["params"].get("tp", 1)) for r in d["rows"]]
        notes += [n for n in d["notes"] if n not in notes]
        params["runs"].append({k: d["params"].get(k) for k in ("model", "dtype", "tp", "quant", "variants",
                                                                 "new_tokens", "prompt_len", "read_ceiling")})
    summary |= extra_summary
    from gpuspeed.decode.study import run_label, stamp_from_runs

    # what a run decoded: a tp speedup compares two runs of the same work (runs merged from separate calls may differ)
    work = {run_label(d): {k: d["params"].get(k) for k in ("batch", "prompt_len", "prompt", "new_tokens")}
            for d in docs}
    for model, dtype in {(d["params"]["model"], d["params"]["dtype"]) for d in docs}:
        one = summary.get(f"{model}_{dtype}_best_ms_per_token")
        for tp in (2, 4):
            many = summary.get(f"{model}_{dtype}_tp{tp}_best_ms_per_token")
            if one and many:
                a, b = work.get(f"{model}_{dtype}"), work.get(f"{model}_{dtype}_tp{tp}")
                key = f"{model}_{dtype}_tp{tp}_speedup_over_tp1"
                summary[key] = one / many if a == b else None
                if a != b:
                    notes.append(f"{key}: none: tp1 and tp{tp} decoded different work ({a} vs {b})")

    doc = stamp_from_runs(make_results("decode_tp", params=params, summary=summary, rows=rows, notes=notes), docs)
    doc["command"] = ["python3", "benchmarks/decode_tp.py", *argv]
    return doc


def merge_int8(run_dir: Path, into: Path) -> int:
    """Add an int8 run's rows, summary keys and notes to an existing decode.json (its bf16 rows stay)."""
    from gpuspeed.results import write_results

    from gpuspeed.decode import study

    src = sorted(Path(run_dir).glob("runs/*int8*/decode.json")) or sorted(Path(run_dir).glob("**/decode.json"))
    if not src or not into.is_file():
        print(f"need an int8 run under {run_dir} and an existing {into}", file=sys.stderr)
        return 1
    doc = study.read_run(into, "decode.json to merge into")
    for path in src:
        run = study.read_run(path)
        study.check_one_device([doc, run], [str(into), str(path)])  # an H100's int8 rows are not the H200 file's
        if run["params"].get("quant") != "int8" and "int8" in path.parent.name and run["params"].get("partial") \
                and any("_int8_" in k for k in run["summary"]):
            # a run cut by its time cap before 382357a wrote its partial file without the int8 naming: given it
            # now by the code a finished run goes through (its reference was the unquantized bf16 model)
            from gpuspeed.decode import quant

            label = next(k for k in run["summary"] if "_int8_" in k).split("_int8_")[0] + "_int8"
            run["params"]["quant"] = "int8"
            for r in run["rows"]:
                r["quant"] = "int8"
            quant.relabel(run, label)
            run["notes"].append("partial int8 run: relabelled on merge (*_vs_bf16: its reference was the bf16 model)")
        if run["params"].get("quant") != "int8":
            continue

        def same(r, p=run["params"]) -> bool:  # the model's int8 run from this dtype: one from another has its own label
            return r.get("quant") == "int8" and (r.get("model"), r.get("dtype")) == (p["model"], p["dtype"])

        doc["rows"] = [r for r in doc["rows"] if not same(r)]
        doc["rows"] += run["rows"]
        label = study.run_label(run) + "_"  # the replaced int8 run's keys go with it: none left beside the new run's
        doc["summary"] = {k: v for k, v in doc["summary"].items() if not k.startswith(label)} | run["summary"]
        doc["notes"] += [n for n in run["notes"] if n not in doc["notes"]]
        doc["params"]["runs"] = [p for p in doc["params"].get("runs", []) if not same(p)]  # a second merge replaces the first
        doc["params"]["runs"].append(run["params"] | {"git": run.get("git"), "created": run.get("created")})
        print(f"merged {path} into {into}")
    write_results(doc, into)
    return 0


def merged_runs(args) -> dict:
    """decode_tp.json from the runs/ of earlier outputs, with the identity rows and keys of their decode_tp.json; a
    file that does not read, another study's, or runs from different devices: a UserError, one line."""
    from gpuspeed.decode import study
    from gpuspeed.errors import UserError
    from gpuspeed.results import read_results

    paths, docs, seen = [], [], {}
    for path in (p for d in args.merge for p in sorted(Path(d).glob("runs/*/decode.json"))):
        doc = study.read_run(path)
        label = study.run_label(doc)  # its summary keys' prefix: one file holds one run of each
        if label in seen:
            print(f"skipped {path}: {label} comes from {seen[label]} already", file=sys.stderr)
            continue
        seen[label] = path
        paths.append(path)
        docs.append(doc)
    extra_rows, extra_summary, olds = [], {}, []
    for d in args.merge:
        prev = Path(d) / "decode_tp.json"
        if prev.is_file():  # the identity rows and keys of an earlier call
            old = read_results(prev)
            if old["study"] != "decode_tp":
                raise UserError(f"{prev} is a {old['study']!r} results file, not a decode_tp.json")
            olds.append(old)
            paths.append(prev)
            extra_rows += [r for r in old["rows"] if r.get("study") == "tokens"]
            extra_summary |= {k: v for k, v in old["summary"].items() if k.endswith("_tp2_tokens_identical")}
    if not docs and not olds:
        raise UserError(f"no runs/*/decode.json or decode_tp.json under {', '.join(args.merge)}")
    study.check_one_device(docs + olds, [str(p) for p in paths])  # combine() stamps one device on them all
    n = max([o["params"].get("gpus", 0) for o in olds] or [0])
    return combine(docs, extra_summary, extra_rows, [], n, sys.argv[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--total-s", type=float, default=560.0, help="Wall-clock budget for the timed runs.")
    ap.add_argument("--parts", default="identity,tiny,8b,70b", help="identity,tiny,8b,70b,int8")
    ap.add_argument("--tp", default="1,2,4", help="Ranks to time (those above the GPU count are skipped).")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=float, default=1.0, help="Seconds of timing per variant.")
    ap.add_argument("--merge", nargs="+", default=None, help="decode_tp.json from the runs/ of earlier outputs.")
    ap.add_argument("--merge-int8", default=None, help="An output holding an int8 run (--parts int8).")
    ap.add_argument("--into", default=None, help="The decode.json that --merge-int8 adds the int8 rows to.")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the plumbing (gloo ranks, no GPU numbers).")
    ap.add_argument("--cli-args", default="", help="Extra `gpuspeed decode` arguments (CPU smoke: '--layers 1 "
                                                    "--compile-backend eager --prompt-len 4').")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from gpuspeed.errors import UserError

    if args.merge_int8:
        try:
            return merge_int8(Path(args.merge_int8), Path(args.into or "results/nvidia-h200/decode.json"))
        except UserError as exc:  # a corrupt file, another study's, another device's run: one line
            print(exc, file=sys.stderr)
            return 2
    if not args.out:
        ap.error("--out is required")
    from gpuspeed.results import check_out_dir, remove_created, write_results

    out = check_out_dir(args.out)
    if args.merge:
        try:
            doc = merged_runs(args)
        except UserError as exc:
            print(exc, file=sys.stderr)
            remove_created()  # bad input: no empty --out left behind
            return 2
        path = write_results(doc, out)
        print(f"wrote {path}")
        return 0
    import torch

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cpu":
        n_gpus = max(int(t) for t in args.tp.split(",") if t.strip())  # gloo ranks: as many as asked
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    tps = [int(t) for t in args.tp.split(",") if t.strip()]
    t0 = time.perf_counter()
    notes, failures, docs = [], [], []
    if n_gpus < max(tps):
        line = (f"{n_gpus} GPU(s) here: the tp {', '.join(str(t) for t in tps if t > n_gpus)} rows are skipped "
                f"(run on nvidia-h200-x{max(tps)} for them)")
        print(line, flush=True)
        notes.append(line)
    summary, rows = {}, []
    if "identity" in parts:
        say(t0, "token identity: tiny and smollm2-135m fp32, --tp 2 vs one GPU")
        try:
            s, r, n = identity(n_gpus, args.new_tokens)
            summary |= s
            rows += r
            notes += n
        except Exception as exc:
            failures.append(f"identity: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    plan = [p for p in TIMED if p[0] in parts] + ([INT8] if "int8" in parts else [])
    runs = [(p, tp) for p in plan for tp in (tps if p[0] != "int8" else [1]) if tp >= p[5] and tp <= n_gpus]
    share_left = sum(p[4] for p, _ in runs) or 1.0
    for (part, model, dtype, variants, share, _), tp in runs:
        left = args.total_s - (time.perf_counter() - t0)
        cap = max(60.0, left * share / share_left)
        share_left -= share
        say(t0, f"{model} {dtype} tp{tp}{' int8' if part == 'int8' else ''}: cap {cap:.0f}s")
        extra = ["--quant", "int8"] if part == "int8" else []
        extra += ["--new-tokens", str(args.new_tokens), *args.cli_args.split()]
        doc, err = timed_run(out, part, model, dtype, variants, tp, cap, args.budget, extra, args.device)
        if doc:
            docs.append(doc)
        if err:
            failures.append(err)
        say(t0, f"{model} {dtype} tp{tp}: {'done' if doc and not err else err or 'no results'}")
    doc = combine(docs, summary, rows, notes + failures, n_gpus, sys.argv[1:])
    path = write_results(doc, out)
    print(f"wrote {path}")
    for k, v in sorted(doc["summary"].items()):
        print(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")
    for f in failures:
        print(f"  FAILED {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
