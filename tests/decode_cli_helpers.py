"""What the `gpuspeed decode` CLI tests share: the smallest run's flags, the command called in-process, and the check
that a refusal is one line and exit 2. Imported as a plain module (pytest puts tests/ on sys.path: no __init__.py)."""

import os

import pytest

# the smallest run that still measures: one rung, two tokens, a short timing budget, on the CPU; add the model,
# --prompt-len (or --prompt) and what the test is about
SMALL = ["--new-tokens", "2", "--no-hf", "--no-profile", "--budget", "0.05", "--device", "cpu", "--variants", "V2"]
# the same for a named model (tiny), cut to one layer; a checkpoint refuses --layers, so those take SMALL
TINY = ["--layers", "1", *SMALL]
# a given read ceiling, for a run whose test is not about the ceiling: none is measured (on a CPU, ~2 s before the
# rungs and ~2 s again after them, as a cached 1-layer model reads faster than DRAM), the rows are the same
ROOF = ["--read-roof", "20"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread, here and in the processes a test starts, while a module that imports this runs: `make test`
    runs two workers on CI's two cores, and two OpenMP threads a worker waited on each other at every small op (a
    1-layer decode's linear took ~3 ms instead of ~0.2 ms on a loaded 2-core machine). Autouse where imported."""
    import torch

    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


def cli(args, capsys):
    """`gpuspeed decode ARGS` in this process: (exit code, what it printed, and only that)."""
    from gpuspeed.cli import main

    capsys.readouterr()  # what came before is not this command's
    rc = main(["decode", *args])
    return rc, capsys.readouterr()


def benchmark_module(script: str):
    """benchmarks/<script> imported as a module (it is a script, not part of the package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / script
    spec = importlib.util.spec_from_file_location(f"_benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_benchmark(script: str, *argv):
    """`python benchmarks/<script> ARGV` run in this process through its main() (a merge reads and writes files: it
    needs no process of its own, and each would import torch again): .returncode, .stdout and .stderr as a process's."""
    import contextlib
    import io
    import sys
    import types

    module = benchmark_module(script)
    path = module.__file__
    out, err, argv_before = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = [str(path), *map(str, argv)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = module.main()
            except SystemExit as exc:  # argparse's usage errors
                rc = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        sys.argv = argv_before
    return types.SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def one_line(rc, cap, needle):
    """A user mistake: exit 2 and one `gpuspeed: error:` line on stderr naming `needle`, no traceback."""
    assert rc == 2, cap.err
    assert cap.err.startswith("gpuspeed: error:") and needle in cap.err, cap.err
    assert len(cap.err.strip().splitlines()) == 1 and "Traceback" not in cap.err


def random_hf_llama(base: dict, seed: int = 0, norms_off_one: bool = True, **over):
    """A random transformers LlamaForCausalLM of config `base | over`, in eval mode; norms_off_one moves the norm
    weights away from 1, so that eps and the norms' mapping count in a comparison. Skips without transformers."""
    import pytest
    import torch

    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    pytest.importorskip("safetensors", reason="safetensors not installed")
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**(base | over))).eval()
    if norms_off_one:
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
    return m
