"""Profile the planted workloads (tests/planted) and record whether every planted finding is reported.

    PYTHONPATH=src python benchmarks/profile_planted.py [--out results/nvidia-h200] [--device auto]

Writes <out>/profile_planted.json through gpuspeed.results; summary keys planted_findings_expected and
planted_findings_found must be equal. On a CPU only the host-side plants run (one-line note).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gpuspeed import device as _device  # noqa: E402
from gpuspeed.results import default_dir, make_results, write_results  # noqa: E402
from planted import expect  # noqa: E402

EXPECTED = {"cuda": 12, "cpu": 8}  # plants per device: see planted/expect.py run_all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results folder (default results/<gpu-slug>)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args(argv)
    where = _device.resolve_device(args.device)
    notes = [] if where == "cuda" else ["no CUDA device: host-side plants only (host syncs, Python hotspot)"]
    if notes:
        print(f"note: {notes[0]}")
    rows = expect.run_all(where)
    found = sum(r["found"] for r in rows)
    expected = max(EXPECTED[where], len(rows))
    for r in rows:
        print(f"{'FOUND  ' if r['found'] else 'MISSING'} {r['planted']:<18} expected {r['expected']}; "
              f"reported {r['reported']}" + (f"; error {r['error']}" if r.get("error") else ""))
    doc = make_results("profile_planted", params={"device": where}, rows=rows, notes=notes, device=where,
                       summary={"planted_findings_expected": expected, "planted_findings_found": found,
                                "all_found": found == expected})
    path = write_results(doc, args.out or default_dir(where))
    print(f"{found}/{expected} planted findings reported; wrote {path}")
    return 0 if found == expected else 1


if __name__ == "__main__":
    sys.exit(main())
