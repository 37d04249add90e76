"""Load a user's function from `path/to/file.py:name` (shared by profile, launch --explain, optimize)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

from gpuspeed.errors import UserError


def load_module(path: str | Path, name: str | None = None):
    """Import a Python file as a module (its folder goes on sys.path so sibling imports work)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p} is a folder, not a .py file: name the file (path/to/file.py:function)")
    if not p.is_file():
        raise UserError(f"no such file: {p}")
    if p.suffix != ".py":
        raise UserError(f"{p} is not a .py file")
    mod_name = name or f"gpuspeed_user_{p.stem}"
    package = package_of(p)
    if package is not None:  # named inside its package, so that its `from .helpers import f` resolves
        mod_name = f"{package[1]}.{mod_name}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {p}")
    module = importlib.util.module_from_spec(spec)
    folder = str(p.resolve().parent)
    # the standard modules gpuspeed itself imports later (the hotspot pass's cProfile, which imports profile) are
    # bound first, so a profile.py beside the user's file serves the user's imports only
    import cProfile  # noqa: F401
    _forget_other_folders(folder)
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)  # first, ahead of an earlier user folder's: its siblings are the ones imported
    if os.getcwd() not in sys.path and "" not in sys.path:  # last, as `python -m gpuspeed` has it (first there)
        sys.path.append(os.getcwd())  # the `gpuspeed` command's too: a project's root modules, run from that root
    if package is not None and package[0] not in sys.path:  # `from shop.helpers import f`, as `python -m` runs it
        sys.path.insert(1, package[0])
    before = set(sys.modules)
    sys.modules[mod_name] = module
    argv = sys.argv
    sys.argv = [str(p)]  # module-level code that reads sys.argv sees its own file, not gpuspeed's flags
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(mod_name, None)
        # the file that has it: the user's file, or a module it imports (`from helpers import f`)
        where = exc.filename if exc.filename and Path(exc.filename).resolve() != p.resolve() else p
        raise UserError(f"{where}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except (Exception, SystemExit) as exc:  # the user's module failed at import: theirs to fix, in one line
        sys.modules.pop(mod_name, None)
        raise UserError(f"importing {p} raised {_first_line(exc)}{_install_hint(exc)}") from exc
    finally:
        sys.argv = argv
    _record_siblings(folder, before, package[0] if package else None)
    return module


# import name -> pip name, for the packages workloads commonly import; another missing name may be a sibling file
PIP_NAMES = {"scipy": "scipy", "sklearn": "scikit-learn", "skimage": "scikit-image", "cv2": "opencv-python",
             "PIL": "pillow", "yaml": "pyyaml", "pandas": "pandas", "numba": "numba", "numexpr": "numexpr",
             "jax": "jax", "h5py": "h5py", "matplotlib": "matplotlib", "torch": "torch", "triton": "triton",
             "cupy": "cupy-cuda12x", "cupyx": "cupy-cuda12x", "transformers": "transformers", "tqdm": "tqdm"}


def _install_hint(exc: BaseException) -> str:
    """`: install it with <this python> -m pip install <package>` for a known package the file imports that is missing."""
    name = (getattr(exc, "name", None) or "").split(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
    if name not in PIP_NAMES:
        return ""
    import shlex

    return f": {name} is not installed in this Python; {shlex.quote(sys.executable)} -m pip install {PIP_NAMES[name]}"


def package_of(path: Path) -> tuple[str, str] | None:
    """(the folder above its top package, the dotted package name) for a file inside a package (its folder holds
    an __init__.py), as `python -m shop.work` would import it from that folder; else None."""
    folder, parts = Path(path).resolve().parent, []
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.insert(0, folder.name)
        folder = folder.parent
    return (str(folder), ".".join(parts)) if parts else None


_SIBLINGS: dict[str, set[str]] = {}  # a loaded user file's folder -> the modules from that folder its import brought in


def _forget_other_folders(folder: str) -> None:
    """Drop the modules that another user file's import brought in from its own folder (its `helpers.py`, a
    package beside it), so that this file's `import helpers` finds its own sibling, not the one a file loaded
    earlier in this process (a notebook optimizing two projects) left in sys.modules. The earlier file keeps
    the modules it already bound."""
    for other, names in _SIBLINGS.items():
        if other == folder:
            continue
        for name in list(sys.modules):
            if name.split(".")[0] in names:
                del sys.modules[name]


def _record_siblings(folder: str, before: set[str], root: str | None = None) -> None:
    """Remember the top-level modules the file's import loaded from its own folder (or its package's root)."""
    for name in set(sys.modules) - before:
        where = getattr(sys.modules.get(name), "__file__", None)
        if "." in name or not where or name.startswith("gpuspeed"):
            continue
        f = Path(where).resolve()
        home = f.parent.parent if f.name == "__init__.py" else f.parent
        if str(home) in (folder, root):
            _SIBLINGS.setdefault(folder, set()).add(name)


def _first_line(exc: BaseException) -> str:
    """`Type: first line of the message` for an exception raised by user code."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def split_target(target: str) -> tuple[str, str]:
    """'file.py:function' -> ('file.py', 'function'), or a one-line error."""
    if ":" not in target:
        raise UserError(f"expected path/to/file.py:function, got {target!r}")
    path, _, attr = target.rpartition(":")
    if not attr:
        raise UserError(f"no function name after ':' in {target!r}")
    return path, attr


def attribute(module, path: str, attr: str) -> Callable:
    """The callable `attr` ('function' or 'Class.method') of a loaded module, or a one-line error (also for a
    method read from its class, whose first argument would be taken for self)."""
    obj = owner = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{path} has no attribute {attr!r}")
        owner, obj = obj, getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{path}:{attr} is not callable")
    refuse_unbound_method(owner, attr.rpartition(".")[2], f"{path}:{attr}")
    return obj


def refuse_unbound_method(owner, name: str, target: str) -> None:
    """`file.py:Class.method` read from the class: its first argument would be taken for self."""
    import inspect

    if inspect.isclass(owner) and inspect.isfunction(inspect.getattr_static(owner, name, None)):
        raise UserError(f"{target} is a method of class {owner.__name__}: its first argument would be taken for "
                        "self; name a function, a @staticmethod or a module-level instance's method")


def load_function(target: str) -> Callable:
    """'file.py:function' (or 'file.py:Class.method') -> the callable."""
    path, attr = split_target(target)
    return attribute(load_module(path), path, attr)
