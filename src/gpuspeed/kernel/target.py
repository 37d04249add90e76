"""Load `FILE.py:NAME` and its example arguments for `gpuspeed kernel`.

NAME may be a dotted path through attributes or dict keys (`variants.triton_softmax` reaches into a
workload's `variants` dict). Arguments come from `--input` specs (made in the array library the launcher's
module uses, as `profile --function` does), else from the file's `inputs(rng)` / `inputs(rng, scale)`
(the optimize workload format; moved to the GPU as torch or CuPy arrays when the launcher says
`fn.gpuspeed_inputs = "torch"` / `"cupy"`, as optimize's variant backend does), else none when the launcher
takes none. Without a GPU, TRITON_INTERPRET=1 and NUMBA_ENABLE_CUDASIM=1 are set before the file is
imported, so its kernels are defined under the interpreters (the command imports neither triton nor numba
before that).
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from pathlib import Path
from typing import Callable

from gpuspeed.errors import UserError

LAZY_HOME = "gpuspeed.examples.hand_kernels"  # where the lazy variants' launchers live
INTERPRETER_ENV = {"TRITON_INTERPRET": "1", "NUMBA_ENABLE_CUDASIM": "1"}


def interpreters_left_on(environ, cuda: bool) -> str | None:
    """One line when a run on a GPU (`cuda`) would have its kernels interpreted because TRITON_INTERPRET or
    NUMBA_ENABLE_CUDASIM is set in `environ` (left over from a CPU session): the interpreted kernels would be timed
    and reported as the GPU's. Refused rather than cleared: the user set them, and which run they meant (timed on
    the GPU, or checked under the interpreters) is theirs to say. None otherwise."""
    if not cuda:
        return None
    on = [f"{k}={environ[k]}" for k in INTERPRETER_ENV
          if str(environ.get(k, "")).strip().lower() not in ("", "0", "false", "off", "no")]
    if not on:
        return None
    return (f"{' and '.join(on)} {'is' if len(on) == 1 else 'are'} set: on this GPU the kernels would run under the "
            "interpreters and their times be reported as the GPU's; unset "
            f"{'it' if len(on) == 1 else 'them'} (env -u {on[0].split('=')[0]} ...) to time the compiled kernels, or "
            "pass --device cpu to run them interpreted")


def use_interpreters() -> None:
    """Make kernels defined from now on run on the CPU: Triton reads its variable when a kernel is decorated
    (its own library functions, tl.sum and the like, are decorated when triton is imported), Numba when
    numba.cuda is first imported; so neither may be imported yet without it."""
    os.environ.update(INTERPRETER_ENV)
    lang = sys.modules.get("triton.language")
    if lang is not None and type(getattr(lang, "sum", None)).__name__ == "JITFunction":
        raise UserError("triton was imported before its interpreter could be switched on: run `gpuspeed kernel` in a "
                        "fresh process (or set TRITON_INTERPRET=1 first)")
    cuda = sys.modules.get("numba.cuda")
    if cuda is not None and "simulator" not in getattr(getattr(cuda, "jit", None), "__module__", "simulator"):
        raise UserError("numba.cuda was imported before the CUDA simulator could be switched on: run `gpuspeed kernel` "
                        "in a fresh process (or set NUMBA_ENABLE_CUDASIM=1 first)")


def load_target(target: str) -> tuple[Callable, object, str]:
    """'file.py:name' (name may be dotted through attributes and dict keys) -> (callable, module, name)."""
    from gpuspeed.loading import load_module, refuse_unbound_method
    from gpuspeed.trees import lazy_kind

    if ":" not in target:
        raise UserError(f"expected path/to/file.py:function, got {target!r}")
    path, _, attr = target.rpartition(":")
    if not attr:
        raise UserError(f"no function name after ':' in {target!r}")
    if not path.strip():  # Path('') is '.': it would be called a folder
        raise UserError(f"no file before ':' in {target!r}: expected path/to/file.py:function")
    module = load_module(_bundled_example(path))
    obj = parent = module
    for part in attr.split("."):
        parent = obj
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            raise UserError(f"{path} has no {attr!r}{_names_near(obj, part, path, attr[:len(attr) - len(part)])}")
    refuse_unbound_method(parent, attr.rsplit(".", 1)[-1], target)
    refuse_kernel(obj, target, attr.rsplit(".", 1)[-1], "name the Python function that launches it")
    if inspect.isclass(obj):
        raise UserError(f"{target} is a class, not a launcher: name the function that launches the kernel")
    if not callable(obj):
        raise UserError(_not_a_launcher(obj, target))
    if (what := lazy_kind(obj)) is not None:
        raise UserError(f"{target} is {what}: a call runs none of its body, so no kernel would launch; name a "
                        "plain function that launches the kernel")
    return obj, module, attr


def _names_near(obj, missing: str, path: str, prefix: str) -> str:
    """': did you mean file.py:launch?' -- the callables of `obj` (a module, a dict of variants, a class or an
    instance) named close to the missing part, else the first few of them (a module's: those the file defines);
    '' when it holds none."""
    import difflib

    names = (list(obj) if isinstance(obj, dict) else list(vars(obj)) if isinstance(obj, types.ModuleType)
             else [n for n in dir(obj) if not n.startswith("__")])  # a class or an instance: what it holds
    values = {n: obj[n] if isinstance(obj, dict) else getattr(obj, n, None) for n in names if isinstance(n, str)}
    # launchers only: not the kernels themselves (refused when named) nor imported classes
    names = [n for n, v in values.items() if not n.startswith("_") and callable(v) and not inspect.isclass(v)
             and not is_triton_kernel(v) and "numba" not in type(v).__module__]
    close = difflib.get_close_matches(missing, names, n=3, cutoff=0.6)
    if close:
        return ": did you mean " + " or ".join(f"{path}:{prefix}{n}" for n in close) + "?"
    if isinstance(obj, types.ModuleType):  # none close: the functions the file defines itself are the choices
        names = [n for n in names if getattr(values[n], "__module__", None) == obj.__name__]
    elif inspect.isclass(obj):  # a class's plain methods are refused when named (self): its static ones are not
        names = [n for n in names if isinstance(inspect.getattr_static(obj, n), (staticmethod, classmethod))]
    if names:
        return (f": {prefix.rstrip('.') or 'it'} holds " + ", ".join(f"{path}:{prefix}{n}" for n in names[:4])
                + (", ..." if len(names) > 4 else ""))
    return ""


def _bundled_example(path: str) -> str:
    """A bundled example's name ('histogram', as optimize takes it) -> its file; any other path unchanged."""
    p = Path(path)
    if p.suffix or p.exists() or len(p.parts) != 1:
        return path
    from gpuspeed.optimize.workload import EXAMPLES_DIR, bundled_examples

    return str(EXAMPLES_DIR / f"{p.name}.py") if p.name in bundled_examples() else path


def _not_a_launcher(obj, target: str) -> str:
    """What a target that is not callable is, and for a dict (a workload's `variants`) which entries to name."""
    kind = "a module" if isinstance(obj, types.ModuleType) else type(obj).__name__
    kind = kind if kind.startswith("a ") else ("an " if kind[:1].lower() in "aeiou" else "a ") + kind
    said = f"{target} is {kind}, not a launcher"
    if isinstance(obj, dict):
        names = [k for k in obj if isinstance(k, str) and "." not in k and callable(obj[k])]
        if names:
            shown = ", ".join(f"{target}.{k}" for k in names[:3]) + (", ..." if len(names) > 3 else "")
            return f"{said}: name one of its entries ({shown})"
    return f"{said}: name the Python function that launches the kernel"


def is_triton_kernel(obj) -> bool:
    """Whether obj is a @triton.jit kernel (a JITFunction or InterpretedFunction, maybe under an Autotuner or
    Heuristics), read from its classes: triton is not imported here."""
    return any(c.__name__ == "KernelInterface" and c.__module__.startswith("triton") for c in type(obj).__mro__)


def kernel_name(obj) -> str:
    """A kernel's function name, through the Autotuner / Heuristics wrappers (which have none of their own)."""
    inner, depth = obj, 0
    while getattr(inner, "__name__", None) is None and getattr(inner, "fn", None) is not None and depth < 8:
        inner, depth = inner.fn, depth + 1
    return getattr(inner, "__name__", None) or "kernel"


def refuse_kernel(obj, label: str, name: str | None, advice: str) -> None:
    """A @triton.jit kernel (autotuned or not) or an unconfigured @cuda.jit kernel where a launcher belongs: a
    UserError naming it and how to launch it. `kern[grid]` / `kern[blocks, threads]` are launchers and pass."""
    cls = type(obj)
    name = name if name not in (None, "kernel") else kernel_name(obj)
    label = label if label != "kernel" else name
    if is_triton_kernel(obj):
        raise UserError(f"{label} is a @triton.jit kernel, not a launcher: {advice} ({name}[grid](...))")
    if "numba" not in cls.__module__:
        return
    # numba-cuda's kern[blocks, threads] is a _LaunchConfiguration over the dispatcher; the simulator's a FakeCUDAKernel
    inner = getattr(obj, "dispatcher", obj) if cls.__name__ == "_LaunchConfiguration" else obj
    options = getattr(inner, "targetoptions", None)
    device = bool(getattr(inner, "_device", False) or (isinstance(options, dict) and options.get("device")))
    if device or cls.__name__ in ("CUDADispatcher", "Dispatcher") or (
            cls.__name__ == "FakeCUDAKernel" and getattr(obj, "grid_dim", None) is None):  # the simulator's unconfigured
        if device:
            # a device function is called from inside kernels: it has no launch configuration to give it
            raise UserError(f"{label} is a @cuda.jit(device=True) device function, not a launcher: it runs only when a "
                            "kernel calls it; name the Python function that launches that kernel")
        raise UserError(f"{label} is a @cuda.jit kernel, not a launcher: {advice} ({name}[blocks, threads](...))")


def is_lazy_variant(fn) -> bool:
    """Whether fn is a bundled example's lazy variant (hand_kernels.lazy), which names its launcher in `target`."""
    where = getattr(fn, "target", None)
    # only hand_kernels.lazy's mark: a user's launcher may carry a `target` attribute of its own (a shape, a pair)
    return (isinstance(where, tuple) and len(where) == 2 and all(isinstance(w, str) for w in where)
            and where[0].startswith(LAZY_HOME + "."))


def unwrap_lazy(fn, device: str) -> tuple[Callable, list[str]]:
    """Without a GPU, a bundled example's lazy variant (gpuspeed.examples.hand_kernels.lazy: it refuses there, so that
    optimize never times interpreted kernels) is swapped for the launcher it names, which the interpreters run."""
    if device == "cuda" or not is_lazy_variant(fn):
        return fn, []
    import importlib

    module, name = fn.target
    launcher = getattr(importlib.import_module(module), name)
    return launcher, [f"no GPU: the variant's launcher {module}.{name} runs under the interpreters"]


def _required_params(fn) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _parameters(fn) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _move(args: tuple, where: str, device: str) -> tuple:
    """Host arrays -> torch tensors on `device` or CuPy arrays, as a variant's `gpuspeed_inputs` asks."""
    import numpy as np

    from gpuspeed.optimize.backends.common import tree_map

    if where == "torch":
        import torch

        return tree_map(lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(device)
                        if isinstance(x, np.ndarray) else x, args)
    if where == "cupy":
        if device != "cuda":
            raise UserError("the launcher wants CuPy inputs (gpuspeed_inputs = 'cupy') and there is no GPU here")
        import cupy

        return tree_map(lambda x: cupy.asarray(x) if isinstance(x, np.ndarray) else x, args)
    return args


def reference_check(module, attr: str, host_args: tuple | None, label: str) -> dict:
    """kernel_report's checking keywords (expected, rtol, atol, against, in_place) when NAME is one of a
    workload's `variants` (the optimize workload format) and its inputs came from the file's inputs(rng): the
    file's original() on copies of those inputs, under its TOLERANCE; for an original that returns None and
    writes into its arguments, those arguments after its call (in_place: their positions). Else {}."""
    from gpuspeed.trees import clone_tree

    original = getattr(module, "original", None)
    if host_args is None or not attr.startswith("variants.") or not callable(original):
        return {}
    tol = getattr(module, "TOLERANCE", None)
    tol = tol if isinstance(tol, dict) else {}
    copies = clone_tree(host_args)
    try:
        expected = original(*copies)
    except (Exception, SystemExit) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserError(f"{label}: original() raised {type(exc).__name__}: {first}") from exc
    in_place = None
    if expected is None:  # out=-style: what it wrote is what the launcher must write
        in_place = [i for i, (a, b) in enumerate(zip(host_args, copies, strict=True)) if _changed(a, b)]
        if not in_place:
            raise UserError(f"{label}: original() returned None and changed none of its arguments: nothing to "
                            "check against")
        expected = tuple(copies[i] for i in in_place)
    return {"expected": expected, "rtol": tol.get("rtol"), "atol": tol.get("atol"),
            "against": f"{label}'s original()", "in_place": in_place}


def _changed(before, after) -> bool:
    """Whether any array of a host argument differs after a call (NaN equal to NaN)."""
    import numpy as np

    from gpuspeed.trees import leaves

    for a, b in zip(leaves(before), leaves(after), strict=False):
        if hasattr(a, "shape"):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
                return True
    return False


def _shapes(args: tuple) -> str:
    """'float64[19, 333], float64[333], 0.2': what a call was given, arrays by dtype and shape."""
    said = [f"{a.dtype}[{', '.join(str(d) for d in a.shape)}]" if hasattr(a, "shape") and hasattr(a, "dtype")
            else repr(a) if isinstance(a, (int, float, bool, str)) else type(a).__name__ for a in args]
    return ", ".join(said[:6]) + (", ..." if len(said) > 6 else "")


def make_args(fn, module, specs: list[str], *, seed: int, backend: str,
              device: str) -> tuple[tuple, dict, list[str], tuple | None]:
    """(positional arguments, keyword arguments, notes, the host arguments they were made from: inputs(rng)'s,
    else None) for the launcher: see the module docstring. A --input spec that names a keyword-only parameter
    of the launcher is passed by that keyword. A launcher with `precision = "float32"` gets float64 arrays cast to
    float32 before they move (as optimize casts its float32 variants' inputs, outside the timing)."""
    import numpy as np

    from gpuspeed.inputs import parse_specs
    from gpuspeed.optimize.workload import CPU_SCALE, _keyword_only, _spec_order, _takes_scale
    from gpuspeed.profiling.backend import infer_backend, make_backend_inputs

    notes: list[str] = []
    if specs:
        parsed = parse_specs(specs)
        if backend == "auto":
            asked = getattr(fn, "gpuspeed_inputs", None)  # the launcher's own word, as inputs(rng)'s arrays follow
            if asked in ("torch", "numpy", "cupy"):
                backend, why = asked, f"the launcher says gpuspeed_inputs = {asked!r}"
            else:
                backend, why = infer_backend(fn)
            notes.append(f"inputs as {backend} arrays: {why} (--backend to choose)")
        values = make_backend_inputs(parsed, backend, seed=seed, device=device)
        keyword = _keyword_only(fn) & set(values)
        missing = [n for n in _required_params(fn) if n in _keyword_only(fn) and n not in values]
        if missing:
            raise UserError(f"{getattr(fn, '__name__', 'the launcher')} needs the keyword argument(s) "
                            f"{', '.join(missing)}: pass --input {missing[0]}=DTYPE[SHAPE] (or "
                            f"{missing[0]}=int:VALUE)")
        positional = [n for n in _spec_order(fn, [s.name for s in parsed]) if n not in keyword]
        required = [n for n in _required_params(fn) if n not in keyword]
        # specs that name its parameters leave out the ones they do not name; unnamed ones fill them in order
        left_out = ([n for n in required if n not in values] if set(positional) <= set(_parameters(fn))
                    else required[len(positional):])
        if left_out:  # its call would fail with Python's own TypeError
            raise UserError(f"{getattr(fn, '__name__', 'the launcher')} needs {', '.join(left_out)} too: pass --input "
                            f"{left_out[0]}=DTYPE[SHAPE] (or {left_out[0]}=int:VALUE)")
        return tuple(values[n] for n in positional), {n: values[n] for n in keyword}, notes, None
    maker = getattr(module, "inputs", None)
    if callable(maker):
        from gpuspeed.examples.hand_kernels import INTERPRETED_SCALE

        # a bundled example's hand kernel without a GPU: the size its kernels are checked at under the interpreters
        tiny = device != "cuda" and is_lazy_variant(fn)
        scale = 1.0 if device == "cuda" else INTERPRETED_SCALE if tiny else CPU_SCALE
        rng = np.random.default_rng(seed)
        try:
            out = maker(rng, scale=scale) if _takes_scale(maker) else maker(rng)
        except UserError:
            raise
        except (Exception, SystemExit) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UserError(f"inputs(rng) raised {type(exc).__name__}: {first}") from exc
        if out is None or isinstance(out, (types.GeneratorType, map, filter, zip)):  # not arguments: say so now
            what = "None (is its `return` missing?)" if out is None else f"a {type(out).__name__}"
            raise UserError(f"the file's inputs(rng) returned {what}: return the launcher's arguments as a tuple")
        args = out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)
        if _takes_scale(maker) and device != "cuda":
            notes.append(f"no GPU: inputs(rng, scale={scale:g}), " + (
                "tiny, as its kernels are checked under the interpreters (each Triton program and each Numba thread "
                "runs as Python)" if tiny else "a tenth of their typical size"))
        where = getattr(fn, "gpuspeed_inputs", "numpy")
        if where not in ("numpy", "torch", "cupy"):
            raise UserError(f"gpuspeed_inputs must be 'numpy', 'torch' or 'cupy', got {where!r}")
        notes.append(f"inputs from the file's inputs(rng) (seed {seed}): {_shapes(args)}")
        moved = args
        if getattr(fn, "precision", None) == "float32":
            from gpuspeed.optimize.backends.common import demote_dtype, tree_map

            moved = tree_map(lambda x: x.astype(demote_dtype(x.dtype)) if isinstance(x, np.ndarray) else x, args)
            notes.append("a float32 launcher: float64 inputs cast to float32 before they move (as optimize does)")
        return _move(moved, where, device), {}, notes, args
    needed = _required_params(fn)
    if needed:
        raise UserError(f"{getattr(fn, '__name__', 'the launcher')} needs arguments ({', '.join(needed)}): pass --input "
                        "NAME=DTYPE[SHAPE] or define inputs(rng) in its file")
    return (), {}, notes, None


def _python_math_on_a_block(exc: BaseException) -> str:
    """' (line N of the kernel calls math.exp on a block ...)' when an interpreted Triton kernel handed a block of values
    to one of Python's math functions (the interpreter's "only 0-dimensional arrays can be converted to Python
    scalars"); '' otherwise."""
    import re
    import traceback

    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if "can be converted to Python scalars" in str(e):
            for frame in reversed(traceback.extract_tb(e.__traceback__)):
                line = frame.line or ""
                call = re.search(r"\bmath\.(\w+)\(", line)
                if call:
                    return (f" (line {frame.lineno} of {frame.name}, `{line.strip()}`, calls Python's math.{call[1]} on "
                            f"a block of values, where it takes one number: in a Triton kernel use tl.{call[1]} or "
                            "tl.math / libdevice)")
        e = e.__cause__ or e.__context__
    return ""


def launcher_error_hint(fn, host_args: tuple | None, exc: BaseException, guessed: bool = False,
                        gpu: bool = True, numbers_given: bool = False) -> str:
    """What to change when the launcher failed on the arguments the file's inputs(rng) made ('' when nothing fits):
    a dict is one argument, not keywords; NumPy arrays handed to a launcher written for torch tensors want
    `gpuspeed_inputs = "torch"`, which moves them to the device first. For --input arrays whose library was
    guessed from the launcher's module (`guessed`), which library they were and how to choose another, unless a number
    among them (`numbers_given`: NAME=int:VALUE) was used as an array. Without a GPU (`gpu` False), a launcher that
    asks for CUDA itself (torch.cuda.synchronize(), device="cuda")."""
    import re

    import numpy as np

    missing = re.search(r"'Fake(CUDAModule|CUDAAtomic)' object has no attribute '(\w+)'", str(exc))
    if not gpu and missing:  # a GPU intrinsic the simulator lacks (warp shuffles and votes): not the user's CUDA call
        name = ("cuda." if missing[1] == "CUDAModule" else "cuda.atomic.") + missing[2]
        return (f" (Numba's CUDA simulator, which runs the kernel without a GPU, has no {name}, which a GPU has: check "
                "this kernel on a GPU, or give it a stand-in under NUMBA_ENABLE_CUDASIM=1, as the bundled row_stats "
                "kernel exchanges its warp's values through shared memory there)")
    scalar_call = _python_math_on_a_block(exc)
    if scalar_call:
        return scalar_call
    text = str(exc).lower()
    if not gpu and ("cuda" in text or "nvidia driver" in text):
        return (" (without a GPU the launcher runs on the CPU under the interpreters, so it must not ask for CUDA "
                "itself: make its arrays where its arguments are, device=x.device or torch.empty_like(x), and leave "
                "torch.cuda.synchronize() out of it or behind `if x.is_cuda:`)")
    if host_args is None:
        if not guessed or not isinstance(exc, (TypeError, AttributeError)):  # arrays of another library fail so
            return ""
        # an int:/float: --input used as an array: no library helps ('int' object is not callable is NumPy's x.size(0))
        if numbers_given and re.search(r"'(int|float)' object (has no attribute|is not subscriptable)", str(exc)):
            return (" (a Python number was used as an array: an --input given as NAME=int:VALUE or NAME=float:VALUE is "
                    "a number; give an array as NAME=DTYPE[SHAPE])")
        from gpuspeed.profiling.backend import infer_backend

        asked = getattr(fn, "gpuspeed_inputs", None)
        backend, why = (asked, f"the launcher says gpuspeed_inputs = {asked!r}") if asked in ("torch", "numpy", "cupy") \
            else infer_backend(fn)
        other = "--backend torch for torch tensors" if backend == "numpy" else "--backend numpy for NumPy arrays"
        return f" (its --input arrays were {backend} arrays, as {why}: {other})"
    if len(host_args) == 1 and isinstance(host_args[0], dict):
        from gpuspeed.optimize.workload import _one_argument_hint

        return _one_argument_hint(host_args[0])
    text = str(exc)
    numpy_given = any(isinstance(a, np.ndarray) for a in host_args)
    if (numpy_given and getattr(fn, "gpuspeed_inputs", None) is None and "numpy.ndarray" in text
            and "Tensor" in text):
        name = getattr(fn, "__name__", "the launcher")
        return (f" (inputs(rng) gave NumPy arrays and {name} wants torch tensors: set "
                f"`{name}.gpuspeed_inputs = \"torch\"` in its file to have them moved to the device as tensors)")
    return ""

