"""QA round 13: results that gpuspeed reads back (a roofline's ceilings, rows kept from an earlier benchmark file,
tuning notes pasted from kernels.json) are used only where they were measured on this device; a file from another
GPU, a CPU's file, one with no device recorded, a truncated one or one of another study is refused, left out with a
note, or labelled with the device it came from -- never mixed into this device's numbers in silence (CPU only: the
documents are small fake results files written in tmp_path)."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpuspeed.device import get_device
from gpuspeed.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
H200 = {"kind": "cuda", "name": "NVIDIA H200", "cc": "9.0", "sms": 132, "slug": "nvidia-h200"}
FAST = dict(budget_s=0.02, warmup_s=0.005)


def _here() -> dict:
    info = get_device("cpu")
    return info.to_dict() | {"slug": info.slug}


def _roofline_doc(device: dict | None, study: str = "roofline") -> dict:
    """A roofline results document as `gpuspeed roofline --json` writes one, measured on `device` (its stamp)."""
    rows = [{"section": "ceiling", "name": "copy", "kind": "memory", "value": 20.0, "unit": "GB/s"},
            {"section": "ceiling", "name": "fp32", "kind": "compute", "value": 0.5, "unit": "TFLOP/s"}]
    doc = {"study": study, "schema": 1, "created": "2026-12-06T00:00:00+00:00", "command": ["gpuspeed", "roofline"],
           "git": "0123456789abcdef0123456789abcdef01234567", "device": device,
           "versions": {"python": "3.11", "torch": torch.__version__},
           "params": {"quick": True}, "summary": {"copy_GBps": 20.0}, "rows": rows, "notes": []}
    if device is None:
        del doc["device"]
        doc["device"] = {}
    else:
        doc["params"] |= {"device": device["kind"], "device_name": device["name"]}
    return doc


# --- gpuspeed.roofline.study.ceilings_from_results: the one way from a results document to Ceilings


def test_ceilings_from_results_refuses_a_document_of_another_study():
    # decode.json handed where a roofline goes: no ceiling rows, and every placement got no roof without a word
    from gpuspeed.roofline.study import ceilings_from_results

    with pytest.raises(UserError, match=r"a decode results document, not a roofline") as e:
        ceilings_from_results(_roofline_doc(H200, study="decode"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cut", ["rows", "device", "schema"])
def test_ceilings_from_results_refuses_a_truncated_document_in_one_line(cut):
    from gpuspeed.roofline.study import ceilings_from_results

    doc = _roofline_doc(H200)
    del doc[cut]
    with pytest.raises(UserError, match=cut) as e:  # was a KeyError traceback, or Ceilings of no device
        ceilings_from_results(doc)
    assert "\n" not in str(e.value)


def test_ceilings_from_results_refuses_a_roofline_with_no_ceilings():
    from gpuspeed.roofline.study import ceilings_from_results

    doc = _roofline_doc(H200)
    doc["rows"] = [r for r in doc["rows"] if r["section"] != "ceiling"]
    with pytest.raises(UserError, match="no ceiling rows"):
        ceilings_from_results(doc)


def test_ceilings_from_results_takes_the_device_from_the_stamp_where_params_lack_it():
    # params.device_name is the study's own copy; without it the device was '' and the kind guessed 'cuda'
    from gpuspeed.roofline.study import ceilings_from_results

    doc = _roofline_doc(_here())
    doc["params"] = {"quick": True}
    c = ceilings_from_results(doc)
    assert (c.device_kind, c.device_name) == ("cpu", get_device("cpu").name)


# --- gpuspeed.results: where a results document was measured


def test_measured_elsewhere_names_the_other_device_or_none():
    from gpuspeed.results import measured_elsewhere, measured_on

    here = get_device("cpu")
    assert measured_on(_roofline_doc(H200)) == "NVIDIA H200"
    assert measured_on({"device": {}}) is None and measured_on({"device": "x"}) is None and measured_on([]) is None
    assert measured_elsewhere(_roofline_doc(_here()), here) is None
    assert measured_elsewhere(_roofline_doc(H200), here) == "NVIDIA H200"
    assert measured_elsewhere(_roofline_doc(None), here) == "an unrecorded device"
    # the same name of another kind is not this device (a CPU's name on a GPU machine, a GPU's 'cuda' stamp)
    assert measured_elsewhere({"device": {"kind": "cuda", "name": here.name}}, here) == f"{here.name} (a GPU)"
    assert measured_elsewhere({"device": {"kind": "cuda", "name": "NVIDIA H200"}},
                              get_device("cpu")) == "NVIDIA H200"


# --- place(): a roof of another device is said to be one


def test_place_on_another_devices_roof_says_so():
    # GPUSPEED_ROOFLINE_RESULTS=results/nvidia-h200/roofline.json in notebook 01 on another machine: the live points
    # were placed on the H200's roof, their % of roof printed as this machine's
    from gpuspeed.roofline.place import place
    from gpuspeed.roofline.study import ceilings_from_results

    x = torch.rand(4096) + 0.5
    p = place(torch.sum, x, flops=4096, ceilings=ceilings_from_results(_roofline_doc(H200)), name="sum",
              device="cpu", **FAST)
    said = [n for n in p.notes if "NVIDIA H200" in n]
    assert len(said) == 1 and "not this" in said[0] and get_device("cpu").name in said[0], p.notes
    mine = place(torch.sum, x, flops=4096, ceilings=ceilings_from_results(_roofline_doc(_here())), name="sum",
                 device="cpu", **FAST)
    assert not [n for n in mine.notes if "roof measured on" in n], mine.notes


# --- kernel_report's ceilings: given, or found under results/<gpu>/roofline.json


def test_kernel_report_refuses_given_ceilings_of_another_device(tmp_path):
    from gpuspeed.kernel.report import _ceilings
    from gpuspeed.roofline.study import ceilings_from_results

    here = get_device("cpu")
    path = tmp_path / "roofline.json"
    path.write_text(json.dumps(_roofline_doc(H200)))
    for given in (_roofline_doc(H200), path, str(path), ceilings_from_results(_roofline_doc(H200)),
                  _roofline_doc(None)):
        with pytest.raises(UserError, match=r"measured on (NVIDIA H200, this|an unrecorded device)") as e:
            _ceilings(given, here)
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="a decode results document"):
        _ceilings(_roofline_doc(H200, study="decode"), here)
    ceil, source, notes = _ceilings(_roofline_doc(_here()), here)  # this device's: used
    assert ceil.value("copy") == 20.0 and source == "given results document" and not notes


def test_committed_roofline_of_another_device_or_study_or_truncated_is_left_out_with_a_note(tmp_path):
    from gpuspeed.kernel.report import committed_ceilings

    here = get_device("cpu")
    roots = [tmp_path / "a", tmp_path / "b"]
    first, second = (r / "results" / here.slug / "roofline.json" for r in roots)
    first.parent.mkdir(parents=True)
    second.parent.mkdir(parents=True)
    mine = _roofline_doc(_here())
    mine["rows"][0]["value"] = 33.0
    second.write_text(json.dumps(mine))
    for bad, said in ((_roofline_doc(H200), "measured on NVIDIA H200"),
                      (_roofline_doc(None), "measured on an unrecorded device"),
                      (_roofline_doc(_here(), study="decode"), "a decode results document"),
                      (None, "not valid JSON")):
        first.write_text(json.dumps(mine)[:100] if bad is None else json.dumps(bad))  # None: cut off mid-write
        ceil, source, notes = committed_ceilings(here, roots)
        assert ceil.value("copy") == 33.0 and source == str(second)  # the next one, this device's
        assert len(notes) == 1 and str(first) in notes[0] and said in notes[0] and "not used" in notes[0], notes
    second.unlink()
    assert committed_ceilings(here, roots)[0] is None  # none of this device's: measured now by the caller


# --- benchmarks/optimize.py: rows kept from an earlier optimize.json


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _earlier_optimize(tmp_path, device) -> Path:
    doc = _roofline_doc(device, study="optimize")
    doc["rows"] = [{"example": "ema_filter", "ok": True, "minutes": 2.0, "speedup": 7.5, "git": "abc1234",
                    "correct": True, "within_budget": True}]
    doc["summary"] = {"wall_minutes": 2.0}
    path = tmp_path / "optimize.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("device,said", [(H200, "NVIDIA H200"), (None, "an unrecorded device")])
def test_optimize_benchmark_keeps_no_rows_of_another_device(tmp_path, device, said):
    # --limit 1: no example starts (too little time), the file is written from the kept rows and the unstarted one
    _earlier_optimize(tmp_path, device)
    assert _bench("optimize").main(["--out", str(tmp_path), "--examples", "black_scholes", "--limit", "1",
                                    "--device", "cpu"]) == 0
    doc = json.loads((tmp_path / "optimize.json").read_text())
    assert doc["device"]["name"] == get_device("cpu").name
    assert [r["example"] for r in doc["rows"]] == ["black_scholes"], doc["rows"]  # the H200's ema_filter: not kept
    assert doc["summary"]["geomean_speedup"] is None and doc["summary"]["wall_minutes"] < 1
    assert any(said in n and "not kept" in n for n in doc["notes"]), doc["notes"]


def test_optimize_benchmark_keeps_this_devices_rows_and_says_when_the_earlier_file_is_unreadable(tmp_path):
    path = _earlier_optimize(tmp_path, _here())
    bench = _bench("optimize")
    assert bench.main(["--out", str(tmp_path), "--examples", "black_scholes", "--limit", "1", "--device", "cpu"]) == 0
    doc = json.loads(path.read_text())
    assert [r["example"] for r in doc["rows"]] == ["ema_filter", "black_scholes"]
    path.write_text(path.read_text()[:200])  # truncated
    assert bench.main(["--out", str(tmp_path), "--examples", "black_scholes", "--limit", "1", "--device", "cpu"]) == 0
    doc = json.loads(path.read_text())
    assert [r["example"] for r in doc["rows"]] == ["black_scholes"]
    assert any("not valid JSON" in n and "not kept" in n for n in doc["notes"]), doc["notes"]


# --- benchmarks/kernel_notes.py: tuning notes pasted into the hand kernels' docstrings


def _kernels_doc(device: dict | None, study: str = "kernels") -> dict:
    doc = _roofline_doc(device, study=study)
    doc["rows"] = [{"example": "no_such_example", "variant": "triton", "main_kernel": "no_such_kernel",
                    "time_s": None, "note": "no GPU"}]
    return doc


def _kernel_notes(tmp_path, doc) -> subprocess.CompletedProcess:
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(doc))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/kernel_notes.py"), str(path)], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))


@pytest.mark.parametrize("device,study,said", [
    ("cpu", "kernels", "measured without a GPU"),  # its rows time nothing: 'not measured there' over the GPU's notes
    (None, "kernels", "no device recorded"),
    (H200, "decode", "a decode results document"),
])
def test_kernel_notes_refuses_a_cpu_an_unrecorded_or_another_studys_file(tmp_path, device, study, said):
    proc = _kernel_notes(tmp_path, _kernels_doc(_here() if device == "cpu" else device, study))
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert not proc.stdout  # no kernel was touched


def test_kernel_notes_names_the_gpu_the_note_was_measured_on(tmp_path):
    # the head said 'H200' whatever GPU kernels.json came from; a note of another GPU replaces the earlier one
    kn = _bench("kernel_notes")
    assert kn.KERNELS.is_dir() and (kn.KERNELS / "heat_stencil.py").is_file()  # the folder it pastes into
    row = {"time_s": 12.5e-6, "grid": [1024, 4, 1], "num_warps": 4, "num_stages": 1, "registers": 32, "spills": 0,
           "shared_bytes": 0, "occupancy_pct": 100.0, "limiter": "warps", "GBps": 3000.0, "pct_of_roof": 70.0,
           "roof": "copy", "verdict": "near the roof"}
    text = kn.note(row, "abcdef0123", "NVIDIA H100 80GB HBM3")
    assert text.startswith("Tuning note (gpuspeed kernel, H100 80GB HBM3, commit abcdef0): ")
    assert kn.note(row, "abcdef0123", "NVIDIA H200").startswith("Tuning note (gpuspeed kernel, H200, commit abcdef0)")
    module = tmp_path / "k.py"
    original = (ROOT / "src/gpuspeed/examples/hand_kernels/heat_stencil.py").read_text()
    module.write_text(original)
    func = "heat_step_kernel"
    assert kn.paste(module, func, text)
    pasted = module.read_text()
    assert "Tuning note (gpuspeed kernel, H100 80GB HBM3, commit abcdef0)" in pasted
    assert pasted.count("Tuning note (") == original.count("Tuning note (")  # replaced, not added
    again = kn.note(copy.deepcopy(row) | {"pct_of_roof": 71.0}, "1234567", "NVIDIA H200")
    assert kn.paste(module, func, again)  # and an H100's note is replaced in turn
    assert "H100 80GB HBM3" not in module.read_text()


def test_kernel_notes_pastes_an_h100_files_notes_naming_the_h100(tmp_path, monkeypatch, capsys):
    # the committed H200 kernels.json as an H100 would write it, pasted into a copy of the hand kernels
    import shutil

    kn = _bench("kernel_notes")
    kernels = tmp_path / "hand_kernels"
    shutil.copytree(kn.KERNELS, kernels, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(kn, "KERNELS", kernels)
    doc = json.loads((ROOT / "results/nvidia-h200/kernels.json").read_text())
    doc["device"] = H200 | {"name": "NVIDIA H100 80GB HBM3", "slug": "nvidia-h100-80gb-hbm3"}
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(sys, "argv", ["kernel_notes.py", str(path)])
    assert kn.main() == 0
    out = capsys.readouterr().out
    assert out.count("pasted into") == len(doc["rows"]) and "no placeholder" not in out, out
    text = "".join(p.read_text() for p in kernels.glob("*.py"))
    assert text.count("Tuning note (gpuspeed kernel, H100 80GB HBM3, commit ") >= len(doc["rows"])
    assert "Tuning note (gpuspeed kernel, H200," not in text  # every earlier note replaced, none said H200


def test_quick_ceilings_are_measured_once_per_device_not_per_spelling(monkeypatch):
    # 'auto' and 'cpu' name one device on a machine without a GPU: one measurement; the cache is keyed by the device
    # the call resolves to (and a GPU's current index), not by the string a caller passed
    import importlib

    from gpuspeed import device as _device

    if _device.cuda_available():
        pytest.skip("checks the spelling on a machine without a GPU")
    # the package's `ceilings` and `place` are the functions: the modules by name
    ceilings_mod = importlib.import_module("gpuspeed.roofline.ceilings")
    place_mod = importlib.import_module("gpuspeed.roofline.place")
    measured = []
    monkeypatch.setattr(ceilings_mod, "ceilings", lambda kind, quick: measured.append(kind) or f"roof of {kind}")
    monkeypatch.setattr(place_mod, "_cache", {})
    assert place_mod.cached_ceilings("auto") == place_mod.cached_ceilings("cpu") == "roof of cpu"
    assert place_mod.cached_ceilings("CPU") == "roof of cpu" and measured == ["cpu"]
