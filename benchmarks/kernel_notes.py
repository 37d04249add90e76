"""Paste each hand kernel's tuning note from a kernels.json (written by benchmarks/kernels.py through
`gpuspeed.kernel_report` on a GPU) into the kernel's docstring, in place of its "Tuning note ...: pending" line
or of an earlier note.

    python benchmarks/kernel_notes.py results/nvidia-h200/kernels.json

Nothing is typed by hand: every figure comes from the results file, stamped with its commit and the GPU it was
measured on. A file of another study, of no device recorded or measured without a GPU (no timings: its rows would
write 'not measured' over the GPU's notes) is refused, nothing pasted.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuspeed.results import measured_on  # noqa: E402

KERNELS = ROOT / "src" / "gpuspeed" / "examples" / "hand_kernels"
MODULE = {"row_normalize_loop": "row_normalize"}  # example -> module where the names differ
# an earlier note, of whichever GPU it names
PLACEHOLDER = re.compile(r"^(?P<indent>\s*)Tuning note \(gpuspeed kernel, [^,()]+, commit [^)]*\):.*$")


def note(row: dict, sha: str, device: str) -> str:
    """The tuning note of one kernels.json row, measured on `device` (the file's device name) at commit `sha`."""
    gpu = re.sub(r"^NVIDIA\s+", "", device).replace(",", " ").strip() or device  # 'NVIDIA H200' -> 'H200'
    head = f"Tuning note (gpuspeed kernel, {gpu}, commit {sha[:7]}): "
    if row.get("time_s") is None:
        return head + f"not measured there ({row.get('error') or row.get('note') or 'no time'})."
    geo = f"grid {'x'.join(str(g) for g in row['grid'] if g != 1) or 1}"
    if row.get("block"):
        geo += f", block {'x'.join(str(b) for b in row['block'] if b != 1)}"
    else:
        geo += f", num_warps {row.get('num_warps')}, num_stages {row.get('num_stages')}"
    tuned = row.get("autotune_chosen") or {}
    cfg = ", ".join(f"{k}={v}" for k, v in tuned.items() if k not in ("num_warps", "num_stages"))
    parts = [geo + (f" (autotuned: {cfg})" if cfg else ""),
             f"{row.get('registers')} registers, {row.get('spills')} spills, {row.get('shared_bytes')} B shared",
             f"occupancy {row.get('occupancy_pct'):.0f} % ({row.get('limiter')}-limited)",
             f"{row['time_s'] * 1e6:.1f} us, {row.get('GBps', 0):.0f} GB/s = {row.get('pct_of_roof', 0):.0f} % of the "
             f"{row.get('roof')} roof"]
    if row.get("speedup_vs_auto") is not None:
        parts.append(f"{row['speedup_vs_auto']:.2f}x the best automatic candidate ({row.get('best_auto')})")
    verdict, lever = row.get("verdict") or "", row.get("next_lever")
    nxt = f"; next: {lever}" if lever and lever not in verdict else ""  # a verdict that names its lever already
    return head + "; ".join(parts) + f". Verdict: {verdict}{nxt}."


def paste(path: Path, func: str, text: str) -> bool:
    lines = path.read_text().splitlines()
    in_func = False
    for i, line in enumerate(lines):
        if re.match(rf"\s*def {re.escape(func)}\(", line):
            in_func = True
        elif in_func and PLACEHOLDER.match(line):
            indent = PLACEHOLDER.match(line)["indent"]
            end = i + 1  # an earlier note's wrapped lines go too: the paragraph ends at a blank line or the quotes
            while end < len(lines) and lines[end].strip() and lines[end].startswith(indent) \
                    and '"""' not in lines[end]:
                end += 1
            # "9 %" and "triton-lang/..." stay whole: the wrap breaks at spaces only, and never before a percent sign
            wrapped = textwrap.wrap(text.replace(" %", "\0%"), 116 - len(indent), initial_indent=indent,
                                    subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)
            lines[i:end] = [w.replace("\0", " ") for w in wrapped]
            path.write_text("\n".join(lines) + "\n")
            return True
    return False


def main() -> int:
    if sys.argv[1:] in (["--help"], ["-h"]):
        print(f"usage: python benchmarks/kernel_notes.py results/<gpu>/kernels.json\n\n{__doc__.strip()}")
        return 0
    if len(sys.argv) != 2:
        print("usage: python benchmarks/kernel_notes.py results/<gpu>/kernels.json", file=sys.stderr)
        return 2
    try:
        doc = json.loads(Path(sys.argv[1]).read_text())
        sha, rows = doc["git"], doc["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:  # nothing pasted from an unreadable file
        print(f"kernel_notes: {sys.argv[1]} is not a readable kernels.json ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return 2
    device = measured_on(doc)
    kind = doc["device"].get("kind") if isinstance(doc.get("device"), dict) else None
    why = (f"a {doc.get('study')} results document, not a kernels one" if doc.get("study") != "kernels" else
           "no device recorded: the notes could not say which GPU measured them" if device is None else
           f"measured without a GPU ({device}): its rows time nothing, and would write 'not measured' over the GPU's "
           "notes" if kind != "cuda" else None)
    if why:
        print(f"kernel_notes: {sys.argv[1]}: {why}; nothing pasted", file=sys.stderr)
        return 2
    for row in rows:
        path = KERNELS / f"{MODULE.get(row['example'], row['example'])}.py"
        func = row.get("main_kernel")
        if not func:  # a kernel that did not run: its module's kernel of that backend
            kind = "numba" if "numba" in row["variant"] else "kernel"
            names = re.findall(r"^\s*def (\w+)\(", path.read_text(), re.M)
            func = next((n for n in names if kind in n and n.endswith("kernel") and not n.startswith("_")), None)
        ok = func is not None and paste(path, func, note(row, row.get("git") or sha, device))  # kept row: its commit
        print(f"{row['example']}:{row['variant']}: {'pasted into ' + func if ok else 'no placeholder found'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
