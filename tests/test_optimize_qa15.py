"""QA pass 15 on `gpuspeed optimize` and its optimized_<name>.py: a user's own project on a machine without a GPU,
run the way the README says. CPU only: small real runs and the emitted script in fresh processes."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPUSPEED = [sys.executable, "-m", "gpuspeed"]

HELPERS = """
    import numpy as np


    def smooth(x):
        return np.sqrt(x * x + 1.0)
    """

RELATIVE = """
    import numpy as np

    from .helpers import smooth


    def original(x):
        return smooth(x).sum(axis=1)


    def inputs(rng):
        return (rng.standard_normal((200, 16)),)
    """

ABSOLUTE = RELATIVE.replace("from .helpers", "from shop.helpers")


def _package(tmp_path) -> Path:
    """A user's package `shop` (helpers.py and two workloads, one importing its sibling relatively, one by the
    package's name) in a folder with a space, as `python -m shop.work` runs it from the project's root."""
    pkg = tmp_path / "my project" / "shop"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(textwrap.dedent(HELPERS))
    (pkg / "work.py").write_text(textwrap.dedent(RELATIVE))
    (pkg / "work_abs.py").write_text(textwrap.dedent(ABSOLUTE))
    return pkg


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(q for q in [str(ROOT / "src"), env.get("PYTHONPATH")] if q)
    return env


@pytest.mark.parametrize("stem", ["work", "work_abs"])
def test_a_workload_inside_a_package_imports_its_siblings_and_so_does_its_script(tmp_path, stem):
    # `from .helpers import f` (or `from shop.helpers import f`) in shop/work.py, which `python -m shop.work` runs: optimize
    # said "attempted relative import with no known parent package" / "No module named 'shop'" and stopped
    pkg = _package(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    r = subprocess.run([*GPUSPEED, "optimize", str(pkg / f"{stem}.py"), "--device", "cpu", "--backends", "numpy",
                        "--time-budget", "60", "--bench-budget", "0.05", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=elsewhere, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    script = out / f"optimized_{stem}.py"
    # the script, run from a third folder, finds the package too and passes its check against the original
    other = tmp_path / "third"
    other.mkdir()
    s = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=other)
    assert s.returncode == 0 and "correctness: PASS" in s.stdout, s.stdout + s.stderr
    use = other / "use_it.py"
    use.write_text(textwrap.dedent(f"""
        import importlib.util
        import numpy as np
        spec = importlib.util.spec_from_file_location("optimized", {str(script)!r})
        opt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(opt)
        fn, how = opt.build_optimized()
        x = np.random.default_rng(1).standard_normal((7, 3))
        print(np.allclose(fn(x), np.sqrt(x * x + 1.0).sum(axis=1), rtol=1e-12))
        """))
    u = subprocess.run([sys.executable, str(use)], capture_output=True, text=True, timeout=180, cwd=other)
    assert u.returncode == 0 and u.stdout.strip().endswith("True"), u.stdout + u.stderr


CONSOLE_SCRIPT = """
    import sys
    from gpuspeed.cli import main
    if __name__ == '__main__':
        sys.exit(main())
    """


def test_the_gpuspeed_command_finds_modules_of_the_folder_it_runs_in_as_python_m_gpuspeed_does(tmp_path):
    # scripts/work.py's `from utils import f`, utils.py at the project's root, run from that root: `python -m gpuspeed
    # optimize` found it (the cwd on sys.path) and the `gpuspeed` command (a script in the venv's bin/) did not
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "utils.py").write_text(textwrap.dedent(HELPERS))
    (project / "scripts" / "work.py").write_text(textwrap.dedent(RELATIVE).replace("from .helpers", "from utils"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gpuspeed").write_text(textwrap.dedent(CONSOLE_SCRIPT))  # what pip writes into .venv/bin
    r = subprocess.run([sys.executable, str(bin_dir / "gpuspeed"), "optimize", "scripts/work.py", "--device", "cpu",
                        "--backends", "numpy", "--time-budget", "60", "--bench-budget", "0.05", "--out", "out"],
                       capture_output=True, text=True, timeout=300, cwd=project, env=_env())
    assert r.returncode == 0, r.stderr[-2000:]
    s = subprocess.run([sys.executable, "out/optimized_work.py"], capture_output=True, text=True, timeout=180,
                       cwd=project)
    assert s.returncode == 0 and "correctness: PASS" in s.stdout, s.stdout + s.stderr


def test_a_required_keyword_only_parameter_says_how_to_pass_it(tmp_path):
    # `def original(x, *, alpha)`: inputs(rng)'s tuple is passed by position, so the reference call failed with Python's
    # own "missing 1 required keyword-only argument" and nothing said that the workload format cannot pass one
    (tmp_path / "kw.py").write_text(textwrap.dedent("""
        import numpy as np


        def original(x, *, alpha):
            return np.tanh(x * alpha)


        def inputs(rng):
            return (rng.standard_normal((30, 4)),)
        """))
    r = subprocess.run([*GPUSPEED, "optimize", "kw.py", "--device", "cpu", "--out", "out"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env=_env())
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuspeed: error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "keyword-only" in errors[0] and "by position" in errors[0] and "def original(x, alpha)" in errors[0], errors


NUMBA_CUDA_VARIANT = """
    import numpy as np
    from numba import cuda


    @cuda.jit
    def double(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = 2 * x[i]


    def launch(x):
        d = cuda.to_device(x)
        out = cuda.device_array_like(d)
        double[(x.size + 127) // 128, 128](d, out)
        return out.copy_to_host()


    def original(x):
        return 2 * x


    def inputs(rng):
        return (rng.standard_normal(100),)


    variants = {"cuda": launch}
    """


def test_a_numba_cuda_variant_on_a_machine_without_a_gpu_says_why_it_could_not_run(tmp_path):
    # its row said "CudaSupportError: Error at driver init:" and stopped there: Numba's reason is on the lines after
    (tmp_path / "dbl.py").write_text(textwrap.dedent(NUMBA_CUDA_VARIANT))
    env = {k: v for k, v in _env().items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([*GPUSPEED, "optimize", "dbl.py", "--device", "cpu", "--backends", "variants", "--time-budget",
                        "60", "--bench-budget", "0.05", "--out", "out", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    rows = {row["name"]: row for row in json.loads((tmp_path / "out" / "optimize_dbl.json").read_text())["rows"]}
    said = rows["variant:cuda"]["reason"]
    assert "Error at driver init" in said and "CUDA driver library cannot be found" in said, said


FLOAT32_SUM = """
    import numpy as np


    def original(x, y):
        s = np.float32(0)
        for i in range(x.shape[0]):
            s += x[i] * y[i]
        return s


    def inputs(rng):
        return rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    """


def test_a_numba_candidate_returning_a_float32_number_is_checked_as_one(tmp_path):
    # Numba hands a float32 result back as a Python float: the original's np.float32 made every Numba candidate
    # "WRONG shape/dtype: output 0: dtype float64, the original's float32", for the same number
    import numpy as np
    from optimize_script_helpers import LOAD_OPTIMIZED, optimize_text, rewrite

    run = optimize_text(tmp_path, "dot32", FLOAT32_SUM, ["numba"])
    row = run.results["numba-serial"]
    assert row["status"] == "ok", row.get("reason")
    script = rewrite(run, "numba-serial")
    use = tmp_path / "use_it.py"
    use.write_text(LOAD_OPTIMIZED + textwrap.dedent("""
        import numpy as np
        x, y = np.arange(5, dtype=np.float32), np.ones(5, dtype=np.float32)
        out = fn(x, y)
        print(how, type(out).__name__, float(out))
        """))
    r = subprocess.run([sys.executable, str(use), str(script)], capture_output=True, text=True, timeout=180,
                       cwd=tmp_path.parent)
    assert r.returncode == 0 and r.stdout.strip().endswith("float32 10.0"), r.stdout + r.stderr
    assert "serial" in r.stdout and np.float32(10.0) == 10.0


def test_the_commands_the_report_and_the_script_give_run_as_pasted_for_a_file_with_spaces(tmp_path):
    # "my work.py": report.md's E section said `python -m cProfile -s cumtime optimized_my work.py --cpu` and
    # `gpuspeed profile --function /path/my work.py:original`, and the script's docstring `python optimized_my work.py`:
    # pasted into a shell, each split the name in two
    import re
    import shlex

    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "my work", FLOAT32_SUM, ["numpy"])
    report = (run.out_dir / "report.md").read_text()
    script_name = "optimized_my work.py"
    spans = [c for ln in report.splitlines() if ln.startswith("- ") for c in re.findall(r"`([^`]+)`", ln)]
    commands = [c for c in spans if c.startswith(("python ", "gpuspeed ", "nsys ", "ncu "))]
    assert len(commands) >= 4, commands  # a CPU run names no GPU tools (nsys, ncu)
    for command in commands:
        argv = shlex.split(command)
        assert script_name in argv or f"{run.wl.path}:original" in argv, command
    doc = (run.out_dir / script_name).read_text().split('"""')[1]
    runs = [ln.split("#")[0].strip() for ln in doc.splitlines() if ln.strip().startswith("python ")]
    assert runs and all(shlex.split(r)[1] == script_name for r in runs), runs


TWO_PROJECTS = """
import importlib.util
import sys

import numpy as np

fns = []
for script in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location(f"opt{len(fns)}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fns.append(module.build_optimized()[0])
print([float(fn(np.ones(2))[0]) for fn in fns])
"""


def test_two_projects_optimized_scripts_in_one_process_each_use_their_own_helpers(tmp_path):
    # a notebook loading project a's and project b's optimized_work.py, each workload doing `from helpers import scale`
    # from its own folder: b's function used a's helpers (already in sys.modules) and returned a's answers
    from optimize_script_helpers import optimize_text

    scripts = []
    for project, factor in (("a", 2.0), ("b", 3.0)):
        folder = tmp_path / project
        folder.mkdir()
        (folder / "helpers.py").write_text(f"def scale(x):\n    return x * {factor}\n")
        run = optimize_text(folder, "work", """
            from helpers import scale


            def original(x):
                return scale(x) + 1


            def inputs(rng):
                return (rng.standard_normal(50),)
            """, ["numpy"])
        scripts.append(str(run.out_dir / "optimized_work.py"))
    use = tmp_path / "notebook.py"
    use.write_text(TWO_PROJECTS)
    r = subprocess.run([sys.executable, str(use), *scripts], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "[3.0, 4.0]", r.stdout + r.stderr


SPARSE_WRITE = """
    import numpy as np


    def original(x, out):
        for i in range(x.shape[0]):
            out[i * 512] = x[i]  # one element a page: a fresh np.zeros output is all first-touch page faults


    def inputs(rng):
        return rng.standard_normal(2000), np.zeros(2000 * 512)
    """


def test_an_out_style_candidate_writing_into_fresh_zeros_is_not_said_to_cache_its_results(tmp_path):
    # the fresh-inputs probe read each fresh argument before its call but never wrote it: a fresh np.zeros output took
    # a page fault on every first write, which the repeated arguments had taken long before, so Numba was said to
    # "cache its results by input" (167x slower on fresh ones) and was timed at those page faults (19 ms, not ~0.1)
    from optimize_script_helpers import optimize_text

    run = optimize_text(tmp_path, "sparse", SPARSE_WRITE, ["numba"])
    row = run.results["numba-serial"]
    assert row["status"] == "ok", row.get("reason")
    assert not any("caches its results" in n for n in row["notes"]), row["notes"]
