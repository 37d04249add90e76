"""Rewrite the README's results block from the committed results files (numbers are never typed by hand).

Run after copying new results in:  python benchmarks/readme_results.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def block() -> str:
    lines = []
    for path in sorted(ROOT.glob("results/*/*.json")):
        doc = json.loads(path.read_text())
        if "summary" not in doc or "study" not in doc:
            continue
        rel = path.relative_to(ROOT)
        dev = doc.get("device", {}).get("name", "?")
        ver = doc.get("versions", {})
        lines.append(f"**{doc['study']}** — [`{rel}`]({rel}) · {dev} · torch {ver.get('torch')} · "
                     f"commit `{str(doc.get('git'))[:12]}` · {doc.get('created', '')[:10]}")
        lines.append("")
        lines.append("| summary key | value |")
        lines.append("|---|---|")
        for k, v in doc["summary"].items():
            lines.append(f"| `{k}` | {_fmt(v)} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print("README.md has no results markers", file=sys.stderr)
        return 2
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{block()}\n{END}", text,
                 flags=re.S)
    readme.write_text(new)
    print("README results block updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
