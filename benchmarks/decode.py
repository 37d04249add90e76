"""results/<gpu>/decode.json: the decode ladder on every named model, one `gpuspeed decode` process each.

    python3 benchmarks/decode.py --out DIR [--total-s 470] [--models tiny:fp32,smollm2-135m:bf16,...]
    python3 benchmarks/decode.py --out DIR --merge RUN_DIR [RUN_DIR ...]   (runs made in separate calls)
    python3 benchmarks/decode.py --out DIR --merge RUN_DIR --keep results/nvidia-h200/decode.json
                                 (the new runs replace their own models; the file's other models stay)

Each model runs in its own process under a time cap (a crash or a hang loses that model only; a model cut
off by its cap keeps the variants it finished, which the CLI writes as it goes). The runs are merged into
DIR/decode.json with decode_ladder.png, decode_bandwidth.png and traces/ beside it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (model, dtype, share of the time, extra CLI arguments)
PLAN = [
    ("tiny", "fp32", 0.14, []),  # 95 s of a 545 s run at 5d513ec, every rung
    ("smollm2-135m", "bf16", 0.24, []),  # 30 layers: three ~23 s compiles; 0.18 cut it after V0
    ("llama-3.2-1b", "bf16", 0.28, ["--long-prompt", "4096", "--batches", "8,32"]),  # 194 s at 5d513ec
    ("llama-3-8b", "bf16", 0.34, []),
]
GRACE_S = 60  # past a model's soft cap (--time-cap) its current variant may finish before the hard kill: smollm2's
# V3 (a 31 s compile, a 9 s explain) started inside its cap and was killed at b651bde with 25


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--total-s", type=float, default=470.0, help="Wall-clock budget for all models (a model's "
                    "variants start only until its share less GRACE_S, 60 s: one model alone with --total-s 165 "
                    "gets 105 s).")
    ap.add_argument("--models", default=None, help="model:dtype,... (default: the four of the issue)")
    ap.add_argument("--budget", type=float, default=1.0, help="Seconds of timing per variant.")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--merge", nargs="+", default=None, help="Merge the runs/*/decode.json of these earlier "
                                                                  "outputs into one decode.json instead of running.")
    ap.add_argument("--keep", default=None, help="With --merge: an earlier merged decode.json whose models the new "
                                                 "runs do not cover stay in the output, with their own commits.")
    ap.add_argument("--bundle", default=None, help="Also pack the results into DIR/decode_results.tar.gz and the "
                                                   "traces into DIR/decode_traces_<model>.tar.gz (one per model: "
                                                   "few files, each small, for a device machine's $OUT).")
    ap.add_argument("--cli-args", default="", help="Extra arguments for every `gpuspeed decode` (CPU smoke runs: "
                                                    "'--layers 2 --compile-backend eager').")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from gpuspeed.decode import study
    from gpuspeed.errors import UserError
    from gpuspeed.results import check_out_dir

    why = bad_input(args)
    if why:  # before --out is made: bad input leaves nothing behind
        print(why, file=sys.stderr)
        return 2
    out = check_out_dir(args.out)
    if args.merge:
        return merge_only(args, out, study)
    plan = PLAN
    if args.models:
        wanted = [tuple(m.split(":")) for m in args.models.split(",") if m]
        plan = [p for p in PLAN if (p[0], p[1]) in wanted] + [
            (m, d, 0.25, []) for m, d in wanted if (m, d) not in {(p[0], p[1]) for p in PLAN}]
    t0 = time.perf_counter()
    docs, failures = [], []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(ROOT / "src"), os.environ.get("PYTHONPATH")] if p))
    shares_left = sum(p[2] for p in plan)
    read_roof = None  # measured by the first model's run, handed to the others
    for model, dtype, share, extra in plan:
        left = args.total_s - (time.perf_counter() - t0)
        cap = max(45.0, left * share / shares_left)
        shares_left -= share
        run_dir = run_dir_for(out, model, dtype)
        name = run_dir.name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "gpuspeed", "decode", "--model", model, "--dtype", dtype, "--variants", "all",
               "--device", args.device, "--budget", str(args.budget), "--time-cap", f"{cap - GRACE_S:.0f}",
               "--out", str(run_dir), "--json"] + extra + args.cli_args.split()
        if read_roof:
            cmd += ["--read-roof", f"{read_roof:.1f}"]
        t = time.perf_counter()
        print(f"[{time.perf_counter() - t0:6.0f}s] {model} {dtype}: cap {cap:.0f}s (variants start until "
              f"{cap - GRACE_S:.0f}s)", flush=True)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=cap, cwd=ROOT)
            rc, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, err = "timeout", (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        (out / "runs").mkdir(exist_ok=True)
        (out / "runs" / f"{name}.log").write_text(err or "")
        path = run_dir / "decode.json"
        doc, status = None, "no results"
        try:
            doc = study.read_run(path) if path.is_file() else None
        except UserError as exc:  # a run killed as it wrote: its model has no results, the others go on
            status = f"unreadable results ({exc})"
        if doc is not None:
            docs.append(doc)
            status = "partial" if doc["params"].get("partial") else "done"
            read_roof = read_roof or (doc["params"].get("read_ceiling") or {}).get("GBps")
        if rc != 0:
            failures.append(f"{model} {dtype}: exit {rc} ({status}); last line: {(err or '').strip().splitlines()[-1:]}")
        print(f"[{time.perf_counter() - t0:6.0f}s] {model} {dtype}: {status}, rc={rc}, {time.perf_counter() - t:.0f}s",
              flush=True)
        if (run_dir / "traces").is_dir():
            dst = out / "traces"
            dst.mkdir(exist_ok=True)
            for f in (run_dir / "traces").iterdir():
                shutil.copy2(f, dst / f.name)
    if not docs:
        print("no model produced results", file=sys.stderr)
        return 1
    finish(docs, failures, out, study)
    if args.bundle:
        bundle(out, Path(args.bundle))
    return 0


def run_dir_for(out: Path, model: str, dtype: str) -> Path:
    """Where a model's run writes: runs/<model key>_<dtype> (a checkpoint's path is no folder name: an absolute one
    put the run, and the rmtree of an earlier one, beside the checkpoint, outside --out)."""
    from gpuspeed.decode.study import model_key

    return out / "runs" / f"{model_key(model)}_{dtype}"


def bad_input(args) -> str | None:
    """The one-line reason these arguments cannot run (None: they can): each --models entry a named config or a
    checkpoint path with a dtype the CLI takes, --keep an existing file given with --merge."""
    from gpuspeed.decode.model import CONFIGS
    from gpuspeed.decode.study import DTYPES

    if args.keep and not args.merge:
        return "--keep needs --merge"
    if args.keep and not Path(args.keep).is_file():
        return f"--keep {args.keep}: no such file"
    if args.keep:  # corrupt, truncated or another study's: refused before --out is made
        from gpuspeed.decode.study import read_run
        from gpuspeed.errors import UserError

        try:
            read_run(args.keep, "decode.json to keep")
        except UserError as exc:
            return f"--keep {exc}"
    entries = [e for e in (args.models or "").split(",") if e]
    for entry in entries:
        model, _, dtype = entry.partition(":")
        if entries.count(entry) > 1:  # run twice into one runs/ folder, merged twice over
            return f"--models {entry} is given twice"
        if model not in CONFIGS and not Path(model).exists():
            return f"--models {entry}: {model!r} is neither a named model ({', '.join(CONFIGS)}) nor a path"
        if dtype not in DTYPES:
            return f"--models {entry}: want MODEL:DTYPE with DTYPE one of {', '.join(DTYPES)}"
    return None


def bundle(out: Path, dest: Path) -> None:
    """decode_results.tar.gz (JSON, plots, logs) and one decode_traces_<model>.tar.gz per model."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / "decode_results.tar.gz", "w:gz") as tar:
        for f in sorted(out.rglob("*")):
            if f.is_file() and "traces" not in f.relative_to(out).parts:
                tar.add(f, arcname=str(f.relative_to(out)))
    traces = sorted((out / "traces").glob("*.json.gz")) if (out / "traces").is_dir() else []
    for model in sorted({t.name.split("_")[0] for t in traces}):
        with tarfile.open(dest / f"decode_traces_{model}.tar.gz", "w") as tar:  # the traces are gzipped already
            for t in traces:
                if t.name.split("_")[0] == model:
                    tar.add(t, arcname=f"traces/{t.name}")
    for f in sorted(dest.glob("decode_*.tar.gz")):
        print(f"bundled {f} ({f.stat().st_size / 2**20:.1f} MiB)")


def finish(docs, failures, out, study) -> None:
    merged = study.merge(docs, command=["python3", "benchmarks/decode.py"] + sys.argv[1:])
    merged["notes"] += [f for f in failures if f not in merged["notes"]]
    for r in merged["rows"]:
        if r.get("trace"):
            r["trace"] = "traces/" + Path(r["trace"]).name
    path = study.write_artifacts(merged, out)[0]  # plots first: a plot failure is a note, not lost numbers
    print(f"wrote {path}")
    for k, v in merged["summary"].items():
        print(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")
    for f in failures:
        print(f"  FAILED {f}")


def merge_only(args, out, study) -> int:
    """decode.json from the per-model runs of earlier outputs (each model once: the first finished one found, else the
    first partial one). A run file that does not read as a decode run, or runs (--keep's included) measured on
    different devices: one line, exit 2, and nothing written."""
    from gpuspeed.errors import UserError
    from gpuspeed.results import remove_created

    docs, names, seen = [], [], {}
    try:
        for d in args.merge:
            for path in sorted(Path(d).glob("runs/*/decode.json")):
                doc = study.read_run(path)
                key = _key(doc)
                if key in seen:  # its summary keys are the first one's: one file holds one run of each
                    i = names.index(seen[key])
                    if docs[i]["params"].get("partial") and not doc["params"].get("partial"):  # a cut run gives way
                        print(f"skipped {seen[key]} (partial): {study.run_label(doc)} comes from {path}",
                              file=sys.stderr)
                        docs[i], names[i] = doc, str(path)
                        seen[key] = str(path)
                    else:
                        print(f"skipped {path}: {study.run_label(doc)} comes from {seen[key]} already", file=sys.stderr)
                    continue
                seen[key] = str(path)
                docs.append(doc)
                names.append(str(path))
        if not docs:
            raise UserError(f"no runs/*/decode.json under {', '.join(args.merge)}")
        if args.keep:
            kept = [d for d in split(study.read_run(args.keep, "decode.json to keep")) if _key(d) not in seen]
            docs += kept
            names += [f"{args.keep} ({study.run_label(d)})" for d in kept]
        study.check_one_device(docs, names)
    except UserError as exc:
        print(exc, file=sys.stderr)
        remove_created()  # bad input: no empty --out left behind
        return 2
    for d in args.merge:
        for trace in Path(d).glob("traces/*.json.gz"):
            (out / "traces").mkdir(exist_ok=True)
            shutil.copy2(trace, out / "traces" / trace.name)
    finish(docs, [], out, study)
    return 0


def _key(doc: dict) -> tuple:
    """What tells two runs apart in one file: their rows' (model, dtype, quant, tp), and so their summary keys."""
    from gpuspeed.decode.study import model_key

    p = doc["params"]
    return model_key(str(p.get("model"))), p.get("dtype"), p.get("quant"), p.get("tp") or 1


def _row_key(r: dict) -> tuple:
    return r.get("model"), r.get("dtype"), r.get("quant"), r.get("tp") or 1  # a tp 1 row names no tp


def _names_run(note: str, git: str | None) -> bool:
    """False for a note on a git stamp corrected to another commit than this run's (it went with a replaced run)."""
    m = re.match(r"git corrected .* to ([0-9a-f]{7,40})\b", note)
    return not m or bool(git) and git.startswith(m.group(1))


def split(merged: dict) -> list[dict]:
    """The per-run docs a merged decode.json was made from: each run's rows (same model, dtype, quant and tp), its
    summary keys (named <model>_<dtype or int8>_...), its commit and date; the notes that name no run go with
    every doc (merge() keeps one of each)."""
    from gpuspeed.decode.study import run_label

    if not isinstance(merged["params"].get("runs"), list):  # one run's own decode.json (gpuspeed decode --out)
        return [merged]
    docs = []
    derived = ("the runs come from several commits", "partial: the run had not finished")
    runs = [dict(p) for p in merged["params"].get("runs", [])]
    # a checkpoint's keys and rows go under its model key, not its path
    labels = [run_label({"params": p}) + "_" for p in runs]

    def owner(key: str) -> str | None:  # the longest label a key starts with: tiny_fp32_tp2_x is tp2's, not tiny_fp32's
        return max((lb for lb in labels if key.startswith(lb)), key=len, default=None)

    for p, prefix in zip(runs, labels, strict=True):
        git, created = p.pop("git", None), p.pop("created", None)
        rows = [r for r in merged["rows"] if _row_key(r) == _key({"params": p})]
        notes = [n for n in merged["notes"] if not n.startswith(derived)
                 and (("int8" in n) == (p.get("quant") == "int8")) and _names_run(n, git)]
        if p.get("partial"):
            notes.insert(0, "partial: the run had not finished when this was written")
        docs.append({"study": merged.get("study"), "schema": merged.get("schema"), "created": created,
                     "command": merged.get("command"), "git": git, "device": merged.get("device"),
                     "versions": merged.get("versions"), "params": p, "rows": rows, "notes": notes,
                     "summary": {k: v for k, v in merged["summary"].items() if owner(k) == prefix}})
    return docs


if __name__ == "__main__":
    sys.exit(main())
