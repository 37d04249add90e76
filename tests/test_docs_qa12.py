"""QA round 12: the first hour as the README tells it. Its Python snippet runs on a CPU-only machine, every option it
gives a command exists on that command, and the numbers its prose quotes from results files are those files'
numbers (the generated block between results:start and results:end is benchmarks/readme_results.py's, checked by
test_readme_results.py; the prose around it is typed, so it is checked here)."""

import json
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
H200 = ROOT / "results" / "nvidia-h200"


def _flat(text: str) -> str:
    return " ".join(text.split())


PROSE = _flat(re.sub(r"<!-- results:start -->.*?<!-- results:end -->", "", README, flags=re.S))


def test_measurement_core_snippet_runs_on_a_cpu_only_machine(capsys):
    """The README's first Python snippet, copied into a CPU-only machine, runs and prints what its comments say (it
    made its tensor with device="cuda": torch's 'Torch not compiled with CUDA enabled' traceback on the first line,
    where 'every command runs on a machine without a GPU too'). The size is cut from 4096 to 256 for the test's
    time only."""
    pytest.importorskip("torch")
    block = re.search(r"## The measurement core\s*```python\n(.*?)```", README, re.S)
    assert block, "the README's measurement-core snippet is gone"
    code = block.group(1).replace("4096", "256")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cap() without a GPU warns that nothing is enforced: the README says so
        exec(compile(code, "README.md", "exec"), {})  # the snippet is the test
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("mm: ") and "median" in lines[0] and "n=" in lines[0], lines[0]  # print(m)
    assert lines[1].startswith("PASS"), lines[1]  # r.summary: fp32 mm against its float64 product
    assert "fits in 8.00 GiB with 15% headroom" in lines[2], lines[2]  # mem.fits("8GiB").message


def test_bench_keywords_the_readme_writes_are_options_or_said_to_be_recorded():
    """In the README's bench() section a `name=value` is an option of bench() unless the text says it is what the
    Measurement records ('recorded as `flush="per-replay"`'). It wrote '(`device_sync=True`)' as it writes
    `flush=False` and `rotate=N`: bench(..., device_sync=False) is a TypeError, device_sync being a Measurement
    field."""
    import dataclasses
    import inspect

    import gpuspeed
    from gpuspeed.stats import Measurement

    start = README.index("**`bench(fn, *args, **options)`**")
    section = README[start:README.index("**`check(", start)]
    options = set(inspect.signature(gpuspeed.bench).parameters)
    fields = {f.name for f in dataclasses.fields(Measurement)}
    wrong = []
    for m in re.finditer(r"`([a-z_]+)=[^`]*`", section):
        name, before = m.group(1), _flat(section[max(0, m.start() - 60):m.start()])
        if name not in options and not (name in fields and "recorded as" in before):
            wrong.append(f"{m.group(0)} after '...{before[-40:]}'")
    assert not wrong, wrong


def _command_options() -> tuple[dict[str, set[str]], set[str]]:
    typer = pytest.importorskip("typer")
    from gpuspeed.cli import app

    group = typer.main.get_command(app)
    per = {name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} for name, cmd in group.commands.items()}
    return per, {o for p in group.params for o in p.opts}


def test_every_option_the_readme_gives_a_command_is_one_of_its_options():
    """`gpuspeed CMD ... --flag` in the Commands block and in the prose's code spans: CMD exists and takes --flag."""
    per, top = _command_options()
    block = re.search(r"## Commands\s*```\n(.*?)```", README, re.S)
    assert block, "the README's Commands block is gone"
    spans = block.group(1).splitlines()
    spans += re.findall(r"`([^`\n]*gpuspeed [a-z]+[^`]*)`", re.sub(r"```.*?```", "", README, flags=re.S))
    checked, wrong = 0, []
    for span in spans:
        for part in span.split(" | "):  # `gpuspeed launch [...] | gpuspeed launch --explain ...`: two commands
            m = re.search(r"gpuspeed (?:--debug )?([a-z]+)", part)
            if not m:
                continue
            cmd = m.group(1)
            if cmd not in per:
                wrong.append(f"no command {cmd!r}: {part}")
                continue
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", part[m.end():]):
                checked += 1
                if flag not in per[cmd] | top:
                    wrong.append(f"gpuspeed {cmd} has no {flag}: {part}")
    assert checked > 40 and not wrong, wrong


def _doc(name: str) -> dict:
    return json.loads((H200 / name).read_text(encoding="utf-8"))


def _row(name: str, example: str, variant: str) -> dict:
    (row,) = [r for r in _doc(name)["rows"] if r.get("example") == example and r.get("variant") == variant]
    return row


def _pct(name: str, example: str, variant: str, key: str = "pct_of_roof") -> float:
    row = _row(name, example, variant)
    return row[key]["pct_of_roof"] if key == "scaled_up" else row[key]


def _f(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def _kernel_claims() -> list[str]:
    k, c9, e3, a24 = "kernels.json", "kernels_c9c4f64.json", "kernels_e339aaa.json", "kernels_a24f240.json"
    bb = "kernels_bb15aa0.json"
    at_k = _doc(k)["git"][:7]
    rn, hs, hg, mb = ("row_normalize_loop", "triton_fp32"), "heat_stencil", "histogram", "mandelbrot"
    before = ["kernels_a24f240.json", "kernels_2f01d3e.json", "kernels_b758d82.json", "kernels_9a6aeb3.json",
              "kernels_1d9314b.json", "kernels_b8911b6.json", "kernels_163f2c9.json", "kernels_f1db579.json",
              "kernels_f869982.json", "kernels_dc8f3c6.json"]
    pcts = [f"{_pct(f, *rn):.1f} %" for f in before]
    s = _doc(k)["summary"]
    scaled = {f: _f(_pct(f, *rn, key="scaled_up"), 0) for f in (k, bb, c9, "kernels_9a6aeb3.json",
                                                                 "kernels_b758d82.json")}
    assert scaled["kernels_9a6aeb3.json"] == scaled["kernels_b758d82.json"], scaled  # quoted as one number
    fp32_row = _row(k, *rn)
    events_fixed = _doc("bench_accuracy.json")["summary"]["events_fixed_overhead_us"]
    return [
        f"{s['kernels_at_70pct_roof']} of its {s['kernels']} kernels reach 70 %",
        f"row_stats has a Numba kernel ({_f(_pct(k, 'row_stats', 'numba_cuda'), 0)} %)",
        f"{_f(_pct(k, *rn), 1)} % here, against {_f(_pct(k, *rn, key='copy_same_launches_pct_of_roof'), 1)} % for the copies",
        f"{_f(_pct(bb, *rn), 1)} % ({_f(_pct(bb, *rn, key='copy_same_launches_pct_of_roof'), 1)} % for the copies, "
        f"`{bb}`)",
        f"{_f(_pct(c9, *rn), 1)} % ({_f(_pct(c9, *rn, key='copy_same_launches_pct_of_roof'), 1)} % for the copies, "
        f"`{c9}`)",
        f"{_f(_pct(e3, *rn), 1)} % ({_f(_pct(e3, *rn, key='copy_same_launches_pct_of_roof'), 1)} % for the copies, "
        f"`{e3}`)",
        f"{', '.join(pcts[:-1])} and {pcts[-1]} in the runs before ({', '.join(f'`{f}`' for f in before)})",
        f"({events_fixed:.1f} us, `events_fixed_overhead_us` in `bench_accuracy.json`) is about "
        f"{round(100 * events_fixed / (fp32_row['time_s'] * 1e6), -1):.0f} % of its {fp32_row['time_s'] * 1e6:.1f} us",
        f"it reaches {scaled[k]} % of the copy roof ({scaled[bb]} % at bb15aa0, {scaled[c9]} % at c9c4f64, "
        f"{scaled['kernels_9a6aeb3.json']} % at 9a6aeb3 and b758d82)",
        f"rose from {_f(_pct('kernels_9200d2d.json', *rn), 0)} % and "
        f"{_f(_pct('kernels_9200d2d.json', *rn, key='copy_same_launches_pct_of_roof'), 0)} % (`kernels_9200d2d.json`)",
        f"{_f(_pct(k, hs, 'triton_fp32'), 0)} % of the copy roof and "
        f"{_row(k, hs, 'triton_fp32')['speedup_vs_auto_same_precision']:.2f}x torch.compile's float32 kernel "
        f"({_f(_pct('kernels_62a5101.json', hs, 'triton_fp32'), 0)} % as 1-row tiles, `kernels_62a5101.json`)",
        f"float64 Triton stencil went from {_f(_pct(e3, hs, 'triton'), 0)} % to {_f(_pct(c9, hs, 'triton'), 0)} % "
        f"({_row(c9, hs, 'triton')['time_s'] * 1e6:.0f} us,",
        f"the Numba one from {_f(_pct(e3, hs, 'numba_cuda'), 0)} % to {_f(_pct(c9, hs, 'numba_cuda'), 0)} % "
        f"({_f(_pct(k, hs, 'numba_cuda'), 0)} % at {at_k})",
        f"The Triton histogram now reaches {_f(_pct(k, hg, 'triton'), 0)} % ({_row(k, hg, 'triton')['time_s'] * 1e6:.0f} "
        f"us; {_f(_pct(bb, hg, 'triton'), 0)} %, {_row(bb, hg, 'triton')['time_s'] * 1e6:.0f} us, in `{bb}`; "
        f"{_f(_pct(c9, hg, 'triton'), 0)} %, {_row(c9, hg, 'triton')['time_s'] * 1e6:.0f} us, in `{c9}`; "
        f"{_f(_pct(a24, hg, 'triton'), 0)} %, {_row(a24, hg, 'triton')['time_s'] * 1e6:.0f} us, in `{a24}`)",
        f"shared-memory atomics, reaches {_f(_pct(k, hg, 'numba_cuda'), 0)} %",
        f"(the histogram: {_f(_pct(a24, hg, 'triton'), 0)} % against "
        f"{_f(_pct(a24, hg, 'triton', key='copy_same_launches_pct_of_roof'), 0)} % for its copies)",
        f"Mandelbrot ({_f(_pct(k, mb, 'triton'), 0)} % and {_f(_pct(k, mb, 'numba_cuda'), 0)} %; "
        f"{_f(_pct(e3, mb, 'numba_cuda'), 0)} % for Numba at e339aaa)",
        f"mandelbrot then reaches {_f(_pct(k, mb, 'triton', key='scaled_up'), 0)} % (Triton",
        f"and {_f(_pct(k, mb, 'numba_cuda', key='scaled_up'), 0)} % (Numba)",
        f"row_normalize_loop's Numba prange loop, {_row(k, 'row_normalize_loop', 'triton')['best_auto_s'] * 1e3:.1f} ms",
        f"a CuPy loop at {_row(c9, 'row_normalize_loop', 'triton')['best_auto_s']:.2f} s was before",
        f"against torch.compile's {_row(k, mb, 'triton')['best_auto_s']:.2f} s",
        *_h100_kernel_claims(),
    ]


def _h100_kernel_claims() -> list[str]:
    """The H100's kernels.json (no H200 came for that run): its own roof, and no speedup against the H200's runs."""
    doc = json.loads((H200.parent / "nvidia-h100" / "kernels.json").read_text(encoding="utf-8"))
    (row,) = [r for r in doc["rows"] if (r.get("example"), r.get("variant")) == ("row_normalize_loop", "triton_fp32")]
    s = doc["summary"]
    assert doc["device"]["name"].startswith("NVIDIA H100") and s["kernels_faster_than_auto"] is None
    return [f"at {doc['git'][:7]}, `results/nvidia-h100/kernels.json`) {s['kernels_at_70pct_roof']} of the "
            f"{s['kernels']} kernels reach 70 % of that GPU's roof, the float32 row normalization "
            f"{row['pct_of_roof']:.1f} % ({row['copy_same_launches_pct_of_roof']:.1f} % for the copies) in "
            f"{row['time_s'] * 1e6:.1f} us; it gives no speedups"]


def _decode_claims() -> list[str]:
    s = _doc("decode.json")["summary"]
    old = _doc("decode_dd6d009.json")["summary"]
    capped = _doc("decode_2d128f4_tiny_capped.json")["summary"]
    return [
        f"V5 {s['llama-3.2-1b_bf16_v5_ms_per_token']:.3f} ms/token on llama-3.2-1b "
        f"({s['llama-3.2-1b_bf16_p4096_best_ms_per_token']:.3f} at P = 4096), "
        f"{s['smollm2-135m_bf16_v5_ms_per_token']:.3f} on smollm2-135m and {s['llama-3-8b_bf16_v5_ms_per_token']:.3f} "
        "on llama-3-8b",
        f"(V2 {old['tiny_fp32_v2_ms_per_token']:.1f} ms/token against {s['tiny_fp32_v2_ms_per_token']:.1f}, HF static "
        f"{old['tiny_fp32_hf_static_ms_per_token']:.1f} against {s['tiny_fp32_hf_static_ms_per_token']:.1f}; round 9)",
        f"(V5 {capped['tiny_fp32_v5_ms_per_token']:.4f} ms/token; round 11)",
    ]


def _optimize_claims() -> list[str]:
    doc = _doc("optimize.json")
    rows = {r["example"]: r for r in doc["rows"]}

    def at(*examples):
        commits = {rows[e]["git"][:7] for e in examples}
        assert len(commits) == 1, (examples, commits)
        return commits.pop()

    def budget(*examples):
        budgets = {rows[e]["time_budget_s"] for e in examples}
        assert len(budgets) == 1, (examples, budgets)
        return f"{budgets.pop():.0f} s"

    four, two, pair, three = (("ema_filter", "heat_stencil", "black_scholes", "pairwise_distance"),
                              ("row_stats", "polynomial_features"), ("torch_mlp", "image_filter"),
                              ("histogram", "mandelbrot", "row_normalize_loop"))
    alone = _doc("optimize_alone_2c6d805/mandelbrot/optimize_mandelbrot.json")
    (prange,) = [r for r in alone["rows"] if r.get("name") == "numba-prange"]
    return [
        f"`optimize.json` holds {doc['summary']['examples']} examples",
        f"ema_filter, heat_stencil, black_scholes and pairwise_distance at {at(*four)} (4 at once, {budget(*four)} "
        "budgets",
        f"row_stats and polynomial_features at {at(*two)} ({budget('row_stats')} and {budget('polynomial_features')}, "
        "4 at once)",
        f"torch_mlp and image_filter at {at(*pair)} ({budget(*pair)} each, 3 at once)",
        f"(histogram, mandelbrot, row_normalize_loop) again at {at(*three)} ({budget(*three)} each, 3 at once)",
        f"Numba prange took {prange['device_s'] * 1e3:.1f} ms in a run of mandelbrot alone",
    ]


def _roofline_claims() -> list[str]:
    worst = _doc("roofline.json")["summary"]["elementwise_torch_worst"]
    assert worst == "torch sin bf16", worst  # the README: "on the H200 torch.sin on bf16 is the slowest"
    return ["on the H200 torch.sin on bf16 is the slowest"]


@pytest.mark.parametrize("claims", [_kernel_claims, _decode_claims, _optimize_claims, _roofline_claims],
                         ids=lambda f: f.__name__.strip("_"))
def test_numbers_the_prose_quotes_match_the_results_files_it_cites(claims):
    """Each phrase is written from the results file's own numbers, rounded as the README rounds them: a phrase the
    README does not hold is a number typed by hand that its file does not say (or a sentence rewritten: then
    rewrite its phrase here from the file). It quoted heat_stencil's float32 Triton kernel at '1.39x
    torch.compile's float32 kernel' beside kernels.json's 100 %, where kernels.json says 1.396 (1.39 was
    kernels_c9c4f64.json's)."""
    missing = [phrase for phrase in claims() if phrase not in PROSE]
    assert not missing, "README prose disagrees with its results files (or says it differently):\n" + "\n".join(missing)


def test_architecture_tree_names_every_module_of_the_package():
    """docs/architecture.md's tree 'keeps it true' (design.md): every module of src/gpuspeed is named there (a module
    at the top by its file name, one in a subpackage by its name; the bundled examples are one entry). sharing.py,
    __main__.py and decode/kernels' four files were not."""
    arch = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    tree = re.search(r"## The tree \(what exists now\)\s*```\n(.*?)```", arch, re.S)
    assert tree, "architecture.md's tree is gone"
    tree = tree.group(1)
    src = ROOT / "src" / "gpuspeed"
    missing = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if path.name == "__init__.py" or rel.parts[0] == "examples":
            continue
        name = re.escape(path.name) if len(rel.parts) == 1 else rf"{re.escape(path.stem)}(\.py)?\b"
        if not re.search(rf"(?<![\w/]){name}", tree):
            missing.append(rel.as_posix())
    for folder in sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith("__")):
        if f"{folder.name}/" not in tree:
            missing.append(f"{folder.name}/")
    assert not missing, f"modules missing from docs/architecture.md's tree: {missing}"


def test_readme_results_block_and_archive_are_what_readme_results_writes(tmp_path):
    """The README's generated block and results/ARCHIVE.md are benchmarks/readme_results.py's output for the
    committed results files ('nothing here is typed by hand'): a results file replaced without rerunning it, or a
    number edited in the block, shows here. The script runs on a copy (README and ARCHIVE.md written there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_results_qa12", ROOT / "benchmarks" / "readme_results.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (tmp_path / "README.md").write_text(README, encoding="utf-8")
    (tmp_path / "results").mkdir()
    for folder in (ROOT / "results").iterdir():
        if folder.is_dir():
            (tmp_path / "results" / folder.name).symlink_to(folder, target_is_directory=True)
    script.ROOT, script.ARCHIVE = tmp_path, tmp_path / "results" / "ARCHIVE.md"
    script.block.__defaults__ = (tmp_path,)  # links relative to the copy's root, as to the repository's
    assert script.main() == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == README, \
        "README's results block is stale: run python benchmarks/readme_results.py"
    assert script.ARCHIVE.read_text(encoding="utf-8") == (ROOT / "results" / "ARCHIVE.md").read_text(encoding="utf-8"), \
        "results/ARCHIVE.md is stale: run python benchmarks/readme_results.py"
