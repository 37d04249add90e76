"""load_function(): a user's `file.py:function`, and every way the target can be wrong."""

import pytest

from gpuspeed.errors import UserError
from gpuspeed.loading import load_function, load_module


def test_loads_function_and_method(tmp_path):
    f = tmp_path / "user_code.py"
    f.write_text("X = 3\n\ndef double(a):\n    return 2 * a\n\nclass K:\n    @staticmethod\n    def m(a):\n"
                 "        return a + 1\n")
    assert load_function(f"{f}:double")(21) == 42
    assert load_function(f"{f}:K.m")(1) == 2
    assert load_module(f).X == 3


@pytest.mark.parametrize("target,message", [
    ("no_colon.py", "expected path/to/file.py:function"),
    ("missing.py:f", "no such file"),
    ("{dir}/notes.txt:f", "is not a .py file"),
    ("{dir}/user_code.py:", "no function name"),
    ("{dir}/user_code.py:nope", "has no attribute"),
    ("{dir}/user_code.py:X", "is not callable"),
    ("{dir}/broken.py:f", "syntax error"),
])
def test_bad_targets_are_user_errors(tmp_path, target, message):
    (tmp_path / "user_code.py").write_text("X = 3\n")
    (tmp_path / "notes.txt").write_text("hi\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(UserError, match=message):
        load_function(target.format(dir=tmp_path))


@pytest.mark.parametrize("body,message", [
    ("import no_such_module_xyz\n", r"importing .*raising\.py raised ModuleNotFoundError: No module named 'no_such_module_xyz'$"),
    ("raise RuntimeError('bad config\\nsecond line')\n", r"raised RuntimeError: bad config$"),
    ("import sys\nsys.exit(3)\n", r"raised SystemExit\(3\)$"),
])
def test_module_raising_on_import_is_one_line_user_error(tmp_path, body, message):
    f = tmp_path / "raising.py"
    f.write_text(body + "def f():\n    return 1\n")
    with pytest.raises(UserError, match=message) as info:
        load_function(f"{f}:f")
    assert "\n" not in str(info.value)


def test_cli_profile_module_raising_on_import_exit_2(tmp_path, capsys):
    from gpuspeed.cli import main

    f = tmp_path / "raising.py"
    f.write_text("raise ValueError('no GPU config found')\ndef f():\n    return 1\n")
    assert main(["profile", "--function", f"{f}:f", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ValueError: no GPU config found" in err and "raising.py" in err


def test_a_loaded_example_does_not_shadow_a_package_the_stack_imports(monkeypatch):
    # load_module puts an example's folder first on sys.path (as `python example.py` does), so every name in
    # that folder becomes a top-level import. A sub-package once named `kernels` there hid the Hugging Face
    # `kernels` package, and transformers, probing for it, imported ours and failed in the same process.
    import importlib.util
    import sys
    from pathlib import Path

    import gpuspeed.examples as examples

    monkeypatch.setattr(sys, "path", list(sys.path))
    folder = Path(examples.__file__).parent
    module = load_module(folder / "mandelbrot.py", "gpuspeed_user_mandelbrot_shadow_check")
    monkeypatch.delitem(sys.modules, module.__name__)  # named inside its package (gpuspeed.examples)
    for probed in ("kernels", "triton", "numba", "cupy", "torch", "numpy", "transformers"):
        spec = importlib.util.find_spec(probed)
        assert spec is None or folder not in Path(spec.origin or "").parents, probed


@pytest.mark.parametrize("layout", ["module", "package"])
def test_two_user_files_in_one_process_each_import_their_own_sibling(tmp_path, monkeypatch, layout):
    """A notebook that optimizes two projects in one process: each file's `from helpers import scale` must reach its
    own folder's helpers (the second got the first's from sys.modules, and so a reference from the wrong code)."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    for project, value in (("a", 2.0), ("b", 3.0)):
        folder = tmp_path / project
        folder.mkdir()
        if layout == "module":
            (folder / "helpers.py").write_text(f"scale = {value}\n")
        else:
            (folder / "helpers").mkdir()
            (folder / "helpers" / "__init__.py").write_text("from helpers.consts import scale\n")
            (folder / "helpers" / "consts.py").write_text(f"scale = {value}\n")
        (folder / "work.py").write_text("from helpers import scale\n\ndef original(x):\n    return x * scale\n")
    try:
        a = load_module(tmp_path / "a" / "work.py", "gpuspeed_user_work_a")
        b = load_module(tmp_path / "b" / "work.py", "gpuspeed_user_work_b")
        again = load_module(tmp_path / "a" / "work.py", "gpuspeed_user_work_a2")
        assert (a.original(1.0), b.original(1.0), again.original(1.0)) == (2.0, 3.0, 2.0)
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in ("helpers", "gpuspeed_user_work_a",
                                                                   "gpuspeed_user_work_b", "gpuspeed_user_work_a2")]:
            del sys.modules[name]


def test_a_folder_given_as_the_file_says_it_is_a_folder(tmp_path):
    with pytest.raises(UserError, match="is a folder, not a .py file"):
        load_function(f"{tmp_path}:f")
