"""Rewrite the README's results block from the committed results files (numbers are never typed by hand).

The README quotes each study's current file (results/<gpu>/<study>.json); earlier runs kept beside it under their
commit (kernels_e339aaa.json, decode_2d128f4_tiny_capped.json) go to results/ARCHIVE.md, which the README links.

Run after copying new results in:  python benchmarks/readme_results.py
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- results:start -->", "<!-- results:end -->"
ARCHIVE = ROOT / "results" / "ARCHIVE.md"
ARCHIVED = re.compile(r"_[0-9a-f]{7}(_|$)")  # a run kept under its commit: <study>_<sha>[_what].json


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def archived(path: Path) -> bool:
    """A run kept under its commit, or a run stopped before its end (params.partial: roofline.partial.json, a
    decode.json cut short), which the README must not quote as the current result."""
    if ARCHIVED.search(path.stem) or path.stem.endswith(".partial"):
        return True
    try:
        params = json.loads(path.read_text()).get("params")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(params, dict) and bool(params.get("partial"))


def block(paths: list[Path], base: Path = ROOT) -> str:
    """A summary table per results file; links relative to `base` (the folder of the page that quotes them)."""
    lines = []
    for path in paths:
        doc = json.loads(path.read_text())
        if "summary" not in doc or "study" not in doc:
            continue
        rel = path.relative_to(base)
        dev = doc.get("device", {}).get("name", "?")
        ver = doc.get("versions", {})
        cut = " · partial (stopped before its end)" if (doc.get("params") or {}).get("partial") else ""
        lines.append(f"**{doc['study']}** — [`{rel}`]({rel}) · {dev} · torch {ver.get('torch')} · "
                     f"commit `{str(doc.get('git'))[:12]}` · {doc.get('created', '')[:10]}{cut}")
        lines.append("")
        lines.append("| summary key | value |")
        lines.append("|---|---|")
        for k, v in doc["summary"].items():
            lines.append(f"| `{k}` | {_fmt(v)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | tuple = ()) -> int:
    # parsed first: --help, or an argument it does not take, must leave README.md and ARCHIVE.md as they are
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print("README.md has no results markers", file=sys.stderr)
        return 2
    paths = sorted(ROOT.glob("results/*/*.json"))
    current = block([p for p in paths if not archived(p)])
    current += ("\nEarlier runs, each kept under its commit and quoted in the text above where it matters: "
                "[`results/ARCHIVE.md`](results/ARCHIVE.md).\n")
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{current}\n{END}", text,
                 flags=re.S)
    readme.write_text(new)
    ARCHIVE.write_text("# Earlier runs\n\nWritten by `python benchmarks/readme_results.py` from the results files "
                       "kept under the commit they ran at (the current ones are quoted in the README).\n\n"
                       + block([p for p in paths if archived(p)], base=ARCHIVE.parent) + "\n")
    print("README results block and results/ARCHIVE.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
