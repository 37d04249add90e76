"""The standalone optimized_<name>.py: the chosen implementation with install notes, main(), device
detection and a CPU fallback, a benchmark harness and a correctness test against the original (imported
from the workload file). It needs NumPy (and the backend's library for the GPU path), not gpuspeed."""

from __future__ import annotations

import contextlib
import datetime as _dt
import inspect
import json
import os
import re
import shlex
import sys
import textwrap
from pathlib import Path

import numpy as np

from gpuspeed.optimize.backends import chunking, common

INSTALL = {"cupy": "pip install cupy-cuda12x   # or cupy-cuda13x, to match your CUDA driver",
           "torch_compile": "pip install torch   # a CUDA build: see pytorch.org", "torch": "pip install torch",
           "numba": "pip install numba", "jax": 'pip install "jax[cuda12]"', "numpy": "pip install numpy",
           "variant": "whatever the variant imports (see the workload file)", "original": "pip install numpy"}
GPU_BACKENDS = ("cupy", "torch_compile", "torch", "jax")
_IMPORT = re.compile(r"^from gpuspeed\.optimize\.backends\.\w+ import .*$", re.M)


def _module_source(mod) -> str:
    return re.sub(r"\n{3,}", "\n\n\n", _IMPORT.sub("", inspect.getsource(mod))).strip() + "\n"


def backend_module(backend: str):
    import importlib

    from gpuspeed.optimize.worker import BACKEND_MODULES

    return importlib.import_module(f"gpuspeed.optimize.backends.{BACKEND_MODULES[backend]}")


def backend_source(backend: str) -> str:
    """The backend's own source, as pasted into the script (without the gpuspeed imports)."""
    from gpuspeed.optimize.worker import BACKEND_MODULES

    path = Path(common.__file__).with_name(BACKEND_MODULES[backend] + ".py")
    return re.sub(r"\n{3,}", "\n\n\n", _IMPORT.sub("", path.read_text())).strip() + "\n"


def implementation_source(run, name: str | None) -> str:
    """What section B/C shows: the recipe, how it is built and called, and the backend's code."""
    if not name:
        return ""
    rec = run.results[name]["recipe"]
    opts = ", ".join(f"{k}={v!r}" for k, v in rec.items() if k in ("mode", "variant", "prange", "precision", "fuse", "parallel"))
    head = [f"# {name}: {run.results[name].get('label')}",
            f"# impl = build(workload_module, func={run.wl.func!r}, {opts})"
            + ("  # then wrapped in a CUDA graph (gpuspeed.graphs.capture)" if rec.get("graph") else ""),
            "# out = impl(*args)   # host arrays in, host arrays out (impl.run(*impl.prepare(args)) keeps them on the device)"]
    if rec.get("chunk"):
        head.append(f"# chunked: {json.dumps(rec['chunk'])}, {run.results[name].get('chunk_size')} items per chunk "
                    "(chunking.chunked)")
    if rec["backend"] == "variant":
        try:
            src = inspect.getsource(run.wl.variants[rec["variant"]])
        except (OSError, TypeError, KeyError):
            src = f"# variant {rec.get('variant')!r}: source not available\n"
        return "\n".join(head) + "\n\n" + src
    if rec["backend"] == "original":
        try:
            src = inspect.getsource(run.wl.original)
        except (OSError, TypeError):  # a functools.partial, a module instance...: callable, without source of its own
            src = f"# {run.wl.func} = {type(run.wl.original).__name__} object: no source to show\n"
        return "\n".join(head) + "\n\n" + src
    how = {"cupy": "with `np` bound to CuPy (SciPy to cupyx.scipy)", "numpy": "in NumPy on the CPU",
           "torch_compile": "traced by torch.compile through torch.compiler.wrap_numpy on CUDA tensors",
           "torch": "on CUDA tensors (new tensors default to the GPU)", "numba": "compiled by numba.njit(parallel=True)",
           "jax": "with `np` bound to jax.numpy, under jax.jit"}.get(rec["backend"], "")
    if rec["backend"] == "torch" and rec.get("device") == "cpu":
        how = "compiled by torch.compile on the CPU (Inductor's C++/OpenMP code)"
    if rec["backend"] == "numba" and rec.get("parallel") is False:
        how = "compiled by numba.njit (serial)"
    try:
        orig = inspect.getsource(run.wl.original)
    except (OSError, TypeError):
        orig = ""
    precision = f" ({rec['precision']})" if rec.get("precision") not in (None, "as-written") else ""
    body = f"# your {run.wl.func}, unchanged, runs {how}{precision}:\n{orig}\n" if orig else ""
    return "\n".join(head) + "\n\n" + body + "\n# the backend that runs it (gpuspeed.optimize.backends):\n" + \
        backend_source(rec["backend"])


TEMPLATE = '''#!/usr/bin/env python3
"""optimized_{name}.py -- written by `gpuspeed optimize` on {date} from {workload_name}.

Primary: {label}
Measured on {device}: {measured}
{verdict_line}

Install:
    {install}
Run:
    python {script_arg}            # correctness test against the original, then exit 0 / 1
    python {script_arg} --bench    # and a benchmark (CUDA events, or gpuspeed.bench when installed)
    python {script_arg} --cpu      # force the CPU fallback
{fallback_line}
build_optimized()'s function returns what the original returns (its dtypes for your inputs' dtypes, its kinds of
numbers, your own array where it hands one back, a view of your array where it returns one: `x[1:]`, `x.T`).
Its FIRST call on arguments of other dtypes than the run's and their other precision (OUT_FORMS below: int32
arrays, say) runs the original itself, at the original's speed, and keeps what its result looked like for the
later calls on those dtypes, which run the optimized code: which dtypes the original returns there cannot be known
without running it, and a float32 result cast back to a guessed dtype could be a wrong answer. Call it once on such
arguments before you time it.
{range_line}"""

import argparse
import contextlib
import copy
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

WORKLOAD_FILE = {workload_file!r}
WORKLOAD_PATH = {workload_path!r}  # where it was when this script was written
IMPORT_ROOT = {import_root!r}  # the folder `gpuspeed optimize` ran in: the workload's imports were found there too
FUNC = {func!r}
RAN_ON_GPU = {ran_on_gpu!r}  # where gpuspeed optimize measured it
RECIPE = {recipe}
# what the original returns (output_form: each output's kind and dtype, the arguments it hands back), by the kinds and
# dtypes of a call's arguments (dtype_signature): the run's inputs, and those in the other precision; the optimized
# call's results are made to look the same (None: as computed); a call on arguments of other dtypes is the original's
OUT_FORMS = {out_forms}
RTOL, ATOL = {rtol!r}, {atol!r}  # None: gpuspeed.check's defaults, by dtype (below)
TOLERANCES = {tolerances!r}  # default rtol by dtype: the less precise of output and original
SCALE = {scale!r}  # the inputs' scale when the workload's inputs() takes one
INPUT_SPECS = {input_specs!r}  # --input specs, made in this order
ARG_ORDER = {arg_order!r}  # and passed in this one (the function's parameters)
CHUNK = {chunk}  # chunking along a batch axis (None: the whole input at once)
NONDETERMINISTIC = {nondeterministic!r}  # the run found the original gives other results on the same inputs
IN_PLACE = {in_place!r}  # the arguments {func} writes into (None: it only returns its result)
IN_PLACE_RETURNS = {in_place_returns!r}  # it also returns a result (checked with what it wrote)
CACHES_RESULTS = {caches_results!r}  # the run found these cache their results by input (timed on fresh inputs)
TORCH_WORKLOAD = {torch_workload!r}  # the original takes torch tensors: the optimized version returns tensors too
RUN_TIMES = {run_times!r}  # what gpuspeed optimize measured (seconds, end to end), for --bench to print beside its own


# ---------------------------------------------------------------------------------------------------
# Shared helpers (gpuspeed.optimize.backends.common)
# ---------------------------------------------------------------------------------------------------
{common}

# ---------------------------------------------------------------------------------------------------
# Chunked execution over two streams (gpuspeed.optimize.backends.chunking)
# ---------------------------------------------------------------------------------------------------
{chunking}

# ---------------------------------------------------------------------------------------------------
# The chosen implementation ({backend}); its library is imported only when it is used
# ---------------------------------------------------------------------------------------------------
def _backend_build():
{backend_src}
    return build


def load_workload(unique=""):
    """The workload file as a module (its folder on sys.path, so its own imports work)."""
    here = Path(__file__).resolve().parent
    path = next((p for p in (here / WORKLOAD_FILE, Path(WORKLOAD_PATH)) if p.is_file()), None)
    if path is None:
        sys.exit(f"cannot find {{WORKLOAD_FILE}} next to this script or at {{WORKLOAD_PATH}}")
    sys.path.insert(0, str(path.parent))
    name, folder, parts = f"workload_{{path.stem}}{{unique}}", path.resolve().parent, []
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():  # a file inside a package
        parts.insert(0, folder.name)
        folder = folder.parent
    if parts:  # named inside its package (its `from .helpers import f`), the package importable (`from shop...`)
        name = ".".join(parts + [name])
        if str(folder) not in sys.path:
            sys.path.insert(1, str(folder))
    if Path(IMPORT_ROOT).is_dir() and IMPORT_ROOT not in sys.path:  # after everything else, as optimize had it
        sys.path.append(IMPORT_ROOT)
    forget_shadowed([path.resolve().parent, folder] if parts else [path.resolve().parent])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:  # the workload's own imports: a one-line message, not a traceback
        sys.exit(f"{{WORKLOAD_FILE}} imports {{exc.name}}, which is not installed here (nor beside the workload file, "
                 f"nor in {{IMPORT_ROOT}})")
    except Exception as exc:  # a data file it reads by a relative path, say: one line, and where optimize ran it
        text = str(exc).strip().splitlines()
        sys.exit(f"{{WORKLOAD_FILE}} failed to load: {{type(exc).__name__}}: {{text[0] if text else ''}} (gpuspeed "
                 f"optimize ran it from {{IMPORT_ROOT}}: run this script from there)")
    return module


def forget_shadowed(folders):
    """Drop the modules another folder's code brought in under a name these folders hold too (a second project's
    helpers.py, its optimized script loaded earlier in this process), so that this workload's `from helpers import f`
    finds its own, not theirs; the code that imported them keeps what it bound. Libraries are left alone."""
    import sysconfig

    libraries = [Path(p).resolve() for k, p in sysconfig.get_paths().items()
                 if k in ("stdlib", "platstdlib", "purelib", "platlib")]
    for name, mod in list(sys.modules.items()):
        where = getattr(mod, "__file__", None)
        top = name.partition(".")[0]
        if not where or top.startswith("__") or not any(
                (f / f"{{top}}.py").is_file() or (f / top / "__init__.py").is_file() for f in folders):
            continue
        where = Path(where).resolve()
        if not any(f in where.parents for f in folders) and not any(lib in where.parents for lib in libraries):
            del sys.modules[name]


def on_the_host():
    """What the original and its inputs() create stays on the CPU, as they were written: a torch backend makes
    new tensors on the GPU by default (torch.set_default_device), which would mix devices in them."""
    torch = sys.modules.get("torch")
    return torch.device("cpu") if torch is not None else contextlib.nullcontext()


def make_args(module, seed):
    """The original's arguments for one seed, as gpuspeed made them."""
    import inspect as _inspect

    rng = np.random.default_rng(seed)
    if INPUT_SPECS:
        values = {{}}
        for text in INPUT_SPECS:
            name, rhs = text.split("=", 1)
            if rhs.startswith(("int:", "float:")):
                kind, val = rhs.split(":", 1)
                values[name] = int(val) if kind == "int" else float(val)
                continue
            dtype, shape = rhs[:-1].split("[")
            shape = tuple(int(s) for s in shape.split(",") if s)
            if dtype.startswith("float"):
                values[name] = rng.standard_normal(shape, dtype=np.float64 if dtype == "float64" else np.float32).astype(dtype)
            elif dtype == "bool":
                values[name] = rng.integers(0, 2, shape).astype(bool)
            else:
                values[name] = rng.integers(0, 16, shape).astype(dtype)
        return tuple(values[name] for name in ARG_ORDER)
    takes_scale = "scale" in _inspect.signature(module.inputs).parameters
    try:
        with on_the_host():
            out = module.inputs(rng, scale=SCALE) if takes_scale else module.inputs(rng)
    except Exception as exc:  # a data file it reads by a relative path, say: one line, as for a failing import
        text = str(exc).strip().splitlines()
        where = "" if Path.cwd() == Path(IMPORT_ROOT) else (f" (gpuspeed optimize ran it from {{IMPORT_ROOT}}: run this "
                                                            "script from there)")
        call = f"inputs(rng, scale={{SCALE!r}})" if takes_scale else "inputs(rng)"  # the call that failed
        sys.exit(f"{{WORKLOAD_FILE}}: {{call}} raised {{type(exc).__name__}}: {{text[0] if text else ''}}{{where}}")
    return out if isinstance(out, tuple) else tuple(out) if isinstance(out, list) else (out,)


def gpu_available():
    """A usable CUDA device, asked through whichever library is installed."""
    for probe in (_torch_gpu, _cupy_gpu):
        try:
            if probe():
                return True
        except Exception:
            pass
    return False


def _torch_gpu():
    import torch

    return torch.cuda.is_available()


def _cupy_gpu():
    import cupy

    return cupy.cuda.runtime.getDeviceCount() > 0


def build_optimized(force_cpu=False):
    """(callable: host arrays in -> host arrays out (torch tensors on the CPU for a PyTorch original), or written
    into as the original does when IN_PLACE, description). Falls back to the CPU without a GPU."""
    module = load_workload("_optimized")
    backend = RECIPE["backend"]
    needs_gpu = backend in {gpu_backends!r} and RECIPE.get("device") != "cpu"  # chosen on a CPU: stays there
    if backend == "variant":  # a variant taking torch or CuPy inputs ran on the GPU (when optimize had one)
        takes = getattr(getattr(module, "variants", {{}}).get(RECIPE.get("variant")), "gpuspeed_inputs", "numpy")
        needs_gpu = RAN_ON_GPU and takes in ("torch", "cupy")
    if backend == "original" or (needs_gpu and (force_cpu or not gpu_available())):
        why = "chosen" if backend == "original" else ("--cpu" if force_cpu else "no GPU")
        return module.{func_attr}, f"the original on the CPU ({{why}})"
    try:
        build = _backend_build()
    except (ImportError, OSError, ValueError) as exc:  # installed and broken too (a CUDA library torch cannot load)
        return module.{func_attr}, f"the original on the CPU ({{import_failure(exc)}})"
    opts = {{k: v for k, v in RECIPE.items() if k in ("mode", "variant", "prange", "fuse", "parallel")}}
    precision = RECIPE.get("precision", "as-written")
    # a float32 primary's outputs are cast back to the original's dtypes for each call's own inputs (like_the_original)
    impl = build(module, func=FUNC, precision=precision, out_dtypes=None, device="cuda" if needs_gpu else "cpu", **opts)
    if TORCH_WORKLOAD:  # a PyTorch original's caller gets tensors back (on the CPU), as from the original
        impl.fetch = host_tensors
    if CHUNK:
        library = {{"cupy": "cupy", "torch_compile": "torch", "torch": "torch"}}.get(backend)
        impl = chunked(impl, {{int(k): v for k, v in CHUNK["axes"].items()}}, CHUNK["out_axes"], CHUNK["size"], library)
        if TORCH_WORKLOAD:  # the chunks are assembled in NumPy arrays: the caller gets tensors, as from the original
            impl.fetch = numpy_to_tensors
    fn = impl
    if IN_PLACE:  # like the original: the result is written into the caller's arrays
        fn = in_place_call(impl, IN_PLACE, IN_PLACE_RETURNS)
        fn.impl = impl
    fn = by_keyword(like_the_original(fn, impl), impl, getattr(module, FUNC))
    if precision != "as-written" and not IN_PLACE:  # written into the caller's arrays: the original cannot redo it
        fn = finite_or_original(fn, impl)
    return fn, impl.label


def import_failure(exc):
    """Why the backend's library did not import, in a few words: not installed, or installed and failing as it loads
    (an ImportError naming no module, a shared library it cannot open)."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"{{exc.name}} is not installed"
    text = (str(exc).strip().splitlines() or [""])[0][:160]
    return f"{library} failed to import: {{type(exc).__name__}}: {{text}}"


def finite_or_original(fn, impl):
    """fn, a float32 primary, whose result holding inf or NaN is the original's answer instead: float32 overflows
    past 3.4e38 (1e30 squared) where the original's float64 does not. Under atol=0 (no error allowed beside each
    element's own rtol), an input or result below float32's range (held with fewer digits, or as 0) is the original's
    too: two more passes over the data, only there. Each said once on stderr."""
    def call(*args, **kwargs):
        if ATOL == 0 and below_float32((args, kwargs)):
            return the_originals(args, kwargs, "an input below float32's range (~1.2e-38: float32 holds it with fewer "
                                 "digits, or as 0), which atol=0 does not allow")
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # the original warns where it overflows
            out = fn(*args, **kwargs)
        if not all(np.isfinite(a).all() for a in map(to_numpy, leaves(out))
                   if isinstance(a, np.ndarray | np.generic) and a.dtype.kind in "fc"):
            return the_originals(args, kwargs, "its float32 result held inf or NaN (past float32's range?)")
        if ATOL == 0 and below_float32(out):  # cast back from float32: its subnormals are float64 numbers under tiny
            return the_originals(args, kwargs, "its float32 result fell below float32's range (~1.2e-38: fewer "
                                 "digits, or 0), which atol=0 does not allow")
        return out

    return wrapping(call, fn, impl)


def the_originals(args, kwargs, why):
    """The original's answer for a call a float32 primary cannot give within the tolerance; why, once on stderr."""
    if why not in FELL_BACK:
        FELL_BACK.add(why)
        print(f"optimized {{FUNC}}: {{why}}: the original answers such calls", file=sys.stderr)
    with on_the_host():
        return pristine_original()(*args, **kwargs)


def below_float32(values):
    """Whether a float array among values holds a nonzero number under float32's smallest normal one (~1.2e-38)."""
    tiny = float(np.finfo(np.float32).tiny)
    for a in map(to_numpy, leaves(values)):
        if isinstance(a, np.ndarray | np.generic) and a.dtype.kind in "fc" and a.size:
            size = np.abs(a)
            if bool(((size < tiny) & (size != 0)).any()):
                return True
    return False


FELL_BACK = set()  # why the original answered a float32 primary's call: each said on stderr the first time


def wrapping(call, fn, impl):
    """call, a wrapper of fn, carrying what the script reads off a primary: where its work runs (the benchmark reads
    it), whose label a backend may settle at its first call, and the original's name."""
    call.device = getattr(fn, "device", "cpu")  # where its work runs (the benchmark reads it)
    call.impl = getattr(fn, "impl", impl)  # whose label a backend may settle at its first call
    call.__name__ = FUNC
    return call


def by_keyword(fn, impl, original):
    """fn (which takes its arguments by position, as gpuspeed optimize called it), callable as the original is: an
    argument given by its name goes in its place; a call giving a keyword-only argument (which the run never passed,
    and the optimized code cannot take) gets the original's answer, from the original."""
    import inspect as _inspect

    try:
        signature = _inspect.signature(original)
    except (TypeError, ValueError):  # a builtin or a callable object without one: by position only
        signature = None

    def call(*args, **kwargs):
        if not kwargs or signature is None:
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)  # a TypeError, as the original's, for an argument it does not take
        if bound.kwargs:  # the original as written (the module the primary was built from is rebound)
            with on_the_host():
                return pristine_original()(*args, **kwargs)
        return fn(*bound.args)

    return wrapping(call, fn, impl)


def like_the_original(fn, impl):
    """fn, whose results look as the original's do for the caller's own arguments (returned_like): of the dtypes it
    returns for them (a float32 primary's cast back: float64 for float64 or integer inputs where the original computes
    in float64, float32 for float32 ones), NumPy scalars and Python numbers where it returns those, the caller's own
    array where it hands that argument back. OUT_FORMS holds what the run found for its inputs' dtypes (and the other
    precision's); a call on arguments of dtypes it does not hold is answered by the original itself, once, and what
    that returned is kept for the later calls on arguments of those dtypes."""
    def call(*args):
        signature = dtype_signature(args)
        form = OUT_FORMS.get(signature, learn)
        if form is learn:
            return learn(args)
        if signature in ORIGINAL_FOR:
            with on_the_host():
                return pristine_original()(*args)
        failed = None
        try:
            if form and len(form) > 3 and form[3] and fn is impl:  # it returns views of its arguments: the caller's own
                return returned_like(keeping_views(impl, args, form[3]), form, args)
            out = returned_like(fn(*args), form, args)
        except Exception as exc:
            if signature not in LEARNED:  # dtypes the run checked: the arguments' own error, as the original's
                raise
            failed = f"{{type(exc).__name__}}: {{(str(exc).strip().splitlines() or [''])[0][:160]}}"
        if failed:  # dtypes the run never saw, which the optimized code cannot take (Numba has no float16)
            with on_the_host():  # outside the except: a wrong argument's error is the original's alone, not chained
                answer = pristine_original()(*args)
            LEARNED.discard(signature)
            ORIGINAL_FOR.add(signature)
            print(f"optimized {{FUNC}}: the optimized code fails on these argument dtypes ({{failed}}): the original "
                  "answers these calls", file=sys.stderr)
            return answer
        if signature in LEARNED:  # dtypes the run never saw: the first optimized answer is held to the original's kinds
            LEARNED.discard(signature)
            # by the kinds it holds, not its shape: a list of one entry per row may be longer on this call
            extra = sorted(set(map(str, leaves(tree_map(_leaf_kind, out)))) - set(map(str, leaves(form[0]))))
            if form and extra and not IN_PLACE:
                ORIGINAL_FOR.add(signature)
                print(f"optimized {{FUNC}}: on these argument dtypes it returns {{', '.join(extra)}}, which the "
                      "original does not (a cast would lose data): the original answers these calls", file=sys.stderr)
                with on_the_host():
                    return pristine_original()(*args)
        return out

    return wrapping(call, fn, impl)


LEARNED = set()  # argument dtypes whose output form a call learned from the original (not the run's own)
ORIGINAL_FOR = set()  # argument dtypes the optimized code answers in other kinds than the original or fails on


def learn(args):
    """The original's own answer for args, with how it looks kept in OUT_FORMS for later calls on those dtypes."""
    with on_the_host():
        out = pristine_original()(*args)
    OUT_FORMS[dtype_signature(args)] = output_form(out, args)
    LEARNED.add(dtype_signature(args))
    return out


_PRISTINE = []


def pristine_original():
    """The original as written, from a module of its own: a backend rebinds the names of the module it builds from
    (np to CuPy, NumPy's float64 to float32), so that module's original no longer runs as written."""
    if not _PRISTINE:
        _PRISTINE.append(getattr(load_workload("_original"), FUNC))
    return _PRISTINE[0]


def check_against_original(fn, seeds=(101, 202, 303)):
    """The optimized function against the original on fresh inputs: same shapes and dtypes, every element
    within atol + rtol * |ref|, no NaN the original does not have. Returns True when all pass."""
    module = load_workload("_reference")
    original = getattr(module, FUNC)
    built = hasattr(fn, "impl")  # a primary built by build_optimized() (not the original itself)
    handed = {{"optimized": [], "original": []}}  # the arguments each call returned as themselves (aliased)
    if IN_PLACE:  # what the two calls wrote into their arguments is what is compared
        fn, original = (returning_args(handing_back(f, handed[who]), IN_PLACE, IN_PLACE_RETURNS)
                        for f, who in ((fn, "optimized"), (original, "original")))
    ok = True
    for seed in seeds:
        args = make_args(module, seed)
        if built and dtype_signature(args) not in OUT_FORMS:  # how the original's output looks, so fn's own is checked
            learn(make_args(module, seed))
        with on_the_host():  # a copy: an original may return a buffer it reuses
            ref = copy.deepcopy(host_tree(original(*make_args(module, seed))))
        out, problem = keyed_like(host_tree(fn(*args)), ref)
        for j, i in handed["original"]:  # `x *= 2; return x`: the caller's own x, holding the result
            if [j, i] not in handed["optimized"]:
                print(f"seed {{seed}} output {{j}}: a new array where the original returns its argument {{i}} "
                      "(the caller's own array, which it writes into)")
                ok = False
        if problem:
            print(f"seed {{seed}}: {{problem}}")
            ok = False
            continue
        lo, lr = leaves(out), leaves(ref)
        if len(lo) != len(lr):
            print(f"seed {{seed}}: {{len(lo)}} outputs against the original's {{len(lr)}}")
            ok = False
            continue
        for j, (o_leaf, r_leaf) in enumerate(zip(lo, lr)):
            o, r = np.asarray(o_leaf), np.asarray(r_leaf)
            # as the run checks: a NumPy result's dtype must match; a Python number says no precision (any float
            # or integer of it will do), but an int or a bool (a count, a flag) must come back as an integer
            python_number = not isinstance(r_leaf, (np.ndarray, np.generic))
            wrong_type = (o.dtype.kind not in "biu" if isinstance(r_leaf, (int, bool)) else False) if python_number \
                else o.dtype != r.dtype
            if o.shape != r.shape or wrong_type:
                print(f"seed {{seed}} output {{j}}: {{o.dtype}}{{list(o.shape)}} against the original's "
                      f"{{r.dtype}}{{list(r.shape)}}")
                ok = False
                continue
            if o.dtype.kind in "fc":
                # the original's float64 (complex128) result (a Python number float32 or complex64 cannot hold), or
                # any where this returns a Python number (it says no precision of its own), sets it alone, as in the run
                rtol = RTOL if RTOL is not None else default_rtol(r_leaf) if made_in_float64(r_leaf) or type(
                    o_leaf) in (float, complex) else max(default_rtol(o_leaf), default_rtol(r_leaf))
                r64, o64 = r.astype(np.complex128 if o.dtype.kind == "c" else np.float64), o.astype(
                    np.complex128 if o.dtype.kind == "c" else np.float64)
                ref_abs = np.abs(np.where(np.isfinite(r64), r64, 0))  # NaN and Inf in the reference set no scale
                atol = ATOL if ATOL is not None else rtol * float(np.sqrt(np.mean(ref_abs ** 2)) if r64.size else 0)
                with np.errstate(invalid="ignore"):
                    diff = np.abs(o64 - r64)
                    close = diff <= atol + rtol * ref_abs
                # the same infinity, or NaN where the original has NaN, is the original's answer too
                same = (o64 == r64) | (np.isnan(o64) & np.isnan(r64))
                bad = ~(close | same)
                if ATOL is None and not bad.any():  # as gpuspeed.check: the relative L2 error within rtol too
                    num = float(np.sqrt(np.sum(np.where(same, 0.0, diff) ** 2)))
                    den = float(np.sqrt(np.sum(ref_abs ** 2)))
                    if num > rtol * den:
                        print(f"seed {{seed}} output {{j}}: relative L2 error {{num / den:.3g}} over rtol {{rtol:g}}")
                        ok = False
            else:
                bad = o != r
            n_bad = int(np.count_nonzero(bad))
            if n_bad:
                print(f"seed {{seed}} output {{j}}: {{n_bad}} of {{o.size}} elements outside the tolerance")
                ok = False
    print("correctness:", "PASS" if ok else "FAIL", f"({{len(seeds)}} seeds against {{FUNC}} in {{WORKLOAD_FILE}})")
    if not ok and NONDETERMINISTIC:
        print(f"  (gpuspeed optimize found that {{FUNC}} is not deterministic: {{NONDETERMINISTIC}}; no check against it "
              "can pass, whatever the optimized code does: seed its randomness to check it)")
    return ok


def handing_back(f, record):
    """f, recording in `record` which of its arguments its result hands back as themselves ([[leaf, argument], ...])."""
    def call(*args):
        res = f(*args)
        record[:] = aliased(res, args)
        return res

    return call


def keyed_like(out, ref):
    """(out with each dict's items in the order of the original's, a problem or None): outputs are paired by key,
    as gpuspeed.check pairs them, and a dict whose keys differ from the original's is a mismatch."""
    if isinstance(out, dict) and isinstance(ref, dict):
        if set(out) != set(ref):
            return out, (f"keys {{', '.join(sorted(map(repr, out)))}} against the original's "
                         f"{{', '.join(sorted(map(repr, ref)))}}")
        pairs = [keyed_like(out[k], ref[k]) for k in ref]
        return {{k: o for k, (o, _) in zip(ref, pairs)}}, next((p for _, p in pairs if p), None)
    if isinstance(out, (list, tuple)) and isinstance(ref, (list, tuple)) and len(out) == len(ref):
        pairs = [keyed_like(o, r) for o, r in zip(out, ref)]
        return [o for o, _ in pairs], next((p for _, p in pairs if p), None)
    return out, None


def made_in_float64(x):
    """A Python float that float32 cannot hold exactly, or a Python complex that complex64 cannot: made in float64
    (complex128; one made in float32 or complex64 always can)."""
    if type(x) is complex:
        return bool(np.isfinite(x)) and complex(np.complex64(x)) != x
    return type(x) is float and bool(np.isfinite(x)) and float(np.float32(x)) != x


def default_rtol(x):
    """gpuspeed.check's default rtol for one output: by its dtype; a Python float holds float32's, a complex
    complex64's (they do not say what precision made them), unless those cannot hold it (float64's, complex128's)."""
    if type(x) is float:  # not isinstance: NumPy's float64 is a float, and says its precision
        return TOLERANCES["float64" if made_in_float64(x) else "float32"]
    if type(x) is complex:
        return TOLERANCES["complex128" if made_in_float64(x) else "complex64"]
    return TOLERANCES.get(np.asarray(x).dtype.name, 1e-12)


def timing_device(fn):
    """Where fn's work runs, so where the benchmark times it: "cuda" (CUDA events) for an implementation built on
    the GPU (its device, as the candidate's own: CuPy, torch or JAX arrays on a CUDA device, a variant taking torch
    or CuPy inputs), "host" for a variant taking host arrays (it may still launch GPU work inside), "cpu" for the
    rest (the original, NumPy, Numba, a GPU backend that fell back or was chosen on a CPU)."""
    device = getattr(fn, "device", "cpu")
    return device if device in ("cuda", "host") else "cpu"


def benchmark(fn, args, runs=20, where="cpu"):
    """Median time of fn(*args) where timing_device() says it runs: gpuspeed.bench when installed ("host": its auto
    clock, the host clock with device synchronizes where a GPU is present), else CUDA events (torch) around each call
    after a warm-up for "cuda", else the host clock. fn takes and returns host arrays: the host clock sees it all. The C
    heap is settled first (settle_heap), as gpuspeed optimize settles it before its own timing."""
    settle_heap()
    on_gpu = where == "cuda" and gpu_available()
    try:
        from gpuspeed import bench

        m = bench(fn, *args, name=FUNC, device="cuda" if on_gpu else "auto" if where == "host" else "cpu")
        return m.median, f"gpuspeed.bench ({{m.n}} samples, {{m.mode}})"
    except ImportError:
        pass
    for _ in range(3):
        fn(*args)
    try:
        import torch  # CUDA events; a CuPy-only install times on the host clock (fn returns host arrays)
    except ImportError:
        on_gpu = False
    if on_gpu:
        times = []
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return float(np.median(times)), f"CUDA events, median of {{runs}}"
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()  # host clock: the CPU fallback runs on the host
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), f"host clock, median of {{runs}}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="store_true", help="also time the original and the optimized version")
    parser.add_argument("--cpu", action="store_true", help="use the CPU fallback even when a GPU is present")
    a = parser.parse_args(argv)
    fn, how = build_optimized(force_cpu=a.cpu)
    print(f"optimized {{FUNC}}: {{how}}")
    ok = check_against_original(fn)
    settled = getattr(getattr(fn, "impl", fn), "label", how)  # a backend may settle how it runs at its first call
    if settled != how:  # (Numba's serial fallback): the line above named what was built, this what ran
        print(f"optimized {{FUNC}} ran as: {{settled}}")
    if a.bench:
        module = load_workload("_bench")
        args = make_args(module, 0)
        original = getattr(module, FUNC)
        if how.startswith("the original"):  # one function: timing it twice would print noise as a speedup
            with on_the_host():
                t_orig, method = benchmark(original, args, where="cpu")
                t_orig, orig_note = on_fresh_inputs(original, module, args, t_orig, CACHES_RESULTS.get("original"))
            print(f"original {{t_orig * 1e3:.3f}} ms ({{method}}); the optimized version is the original itself "
                  f"({{how[len('the original on the CPU ('):-1]}}): no speedup to measure")  # its own parentheses kept
            print_notes(original=orig_note)
            print_run_times(original_only=True)
            return 0 if ok else 1
        t_opt, method = benchmark(fn, args, where=timing_device(fn))
        t_opt, opt_note = on_fresh_inputs(fn, module, args, t_opt, CACHES_RESULTS.get("optimized"))
        with on_the_host():
            t_orig, _ = benchmark(original, args, runs=5, where="cpu")
            t_orig, orig_note = on_fresh_inputs(original, module, args, t_orig, CACHES_RESULTS.get("original"))
        print(f"original {{t_orig * 1e3:.3f}} ms, optimized {{t_opt * 1e3:.3f}} ms ({{method}}): "
              f"{{speedup_text(t_orig, t_opt)}}")
        print_notes(original=orig_note, optimized=opt_note)
        print_run_times()
    return 0 if ok else 1


FRESH_SETS = 4  # fresh argument sets: one for the warm-up, three timed, each called once (as gpuspeed optimize probes)
FRESH_SLOWER = 3.0  # calls on fresh inputs this many times slower than on the same inputs again: results are cached
FRESH_MARGIN_S = 20e-6  # ... and slower by at least this (the clock's own cost)
FRESH_PROBE_S = 2.0  # not probed where its calls would take longer (a cache hit is not slow), unless the run found it
FRESH_MAX_BYTES = 2 * 2**30  # nor where the extra input sets would be larger than this


def on_fresh_inputs(fn, module, args, t_again, known=False):
    """(time, note): fn's median on inputs it has not seen, and a note saying so, when it is faster on the arguments
    it was timed on (it caches its results by input: functools.lru_cache on a key, a dict keyed by id()), which calls
    repeated on the same arguments would print as a speedup; else (t_again, None). gpuspeed optimize's probe: calls on
    FRESH_SETS argument sets from fresh seeds, each called once and alternating with calls on `args` again, each
    after a read of its inputs (as warm in the cache); caching is found when even the fastest fresh call takes
    FRESH_SLOWER times the repeated calls' median. `known`: the run found it caches."""
    size = sum(int(getattr(x, "nbytes", 0) or 0) for x in leaves(args))
    if not known and 2 * FRESH_SETS * t_again > FRESH_PROBE_S or FRESH_SETS * size > FRESH_MAX_BYTES:
        return t_again, ("not timed on fresh inputs (their sets would be too large): gpuspeed optimize found that it "
                         "caches its results by input, so the time above may be a cache hit's" if known else None)
    import random

    pick = random.SystemRandom()
    fresh, again = [], []
    for n in range(FRESH_SETS):
        new = make_args(module, pick.randrange(1000, 2**31))  # seeds that neither the check nor --bench use
        for call_args, times in ((new, fresh), (args, again)):
            touch(call_args)
            t0 = time.perf_counter()  # host clock: fn takes and returns host arrays
            fn(*call_args)
            if n:  # the first pair warms up
                times.append(time.perf_counter() - t0)
    t_again_here = float(np.median(again))
    if not (min(fresh) > FRESH_SLOWER * t_again_here and min(fresh) - t_again_here > FRESH_MARGIN_S):
        return t_again, None
    t_fresh = float(np.median(fresh))
    return t_fresh, (f"timed on fresh inputs ({{len(fresh)}} calls, host clock): {{t_fresh * 1e3:.3f}} ms a call, against "
                     f"{{t_again_here * 1e3:.4g}} ms on the same arguments again ({{t_fresh / t_again_here:.3g}}x): it "
                     "caches its results by input, which repeated timing calls would turn into a speedup")


def touch(args):
    """Read every array of the arguments once (a sum), so fresh inputs are as warm in the cache as repeated ones."""
    for x in leaves(args):
        if hasattr(x, "sum") and getattr(x, "shape", None) and getattr(getattr(x, "dtype", None), "kind", "f") != "O":
            with contextlib.suppress(Exception):
                with np.errstate(all="ignore"):
                    x.sum()


def print_notes(**notes):
    for who, note in notes.items():
        if note:
            print(f"  {{who}}: {{note}}")


def print_run_times(original_only=False):
    """What gpuspeed optimize measured on the same inputs, beside this run's numbers: the two differ by the machine
    and its load (another GPU, --cpu, other processes), not by how they were timed."""
    orig, opt = RUN_TIMES.get("original"), RUN_TIMES.get("optimized")
    if orig is None:
        return
    parts = [f"original {{orig * 1e3:.3f}} ms"] + ([f"optimized {{opt * 1e3:.3f}} ms end to end "
                                                 f"({{speedup_text(orig, opt)}})"] if opt and not original_only else [])
    how = f" ({{RUN_TIMES['how']}})" if RUN_TIMES.get("how") else ""
    print(f"  gpuspeed optimize measured {{', '.join(parts)}} on {{RUN_TIMES.get('device')}}{{how}}")


def speedup_text(t_orig, t_opt):
    """t_orig / t_opt as report.md writes a speedup: '1.72x'; under 0.1 in two significant figures (400x slower read
    '0.00x', as if the optimized code never ran)."""
    ratio = t_orig / t_opt
    return f"{{ratio:.2f}}x" if abs(ratio) >= 0.1 else f"{{ratio:.2g}}x"


if __name__ == "__main__":
    sys.exit(main())
'''


def script_text(run) -> str:
    name = run.choice.get("primary")
    row = run.results.get(name) if name else None
    rec = dict(row["recipe"]) if row else {"name": "original", "backend": "original"}
    backend = rec["backend"]
    chunk = None
    if rec.get("chunk"):
        chunk = dict(rec["chunk"]) | {"size": row.get("chunk_size") or 1}
    src = backend_source(backend) if backend != "original" else "build = None\n"
    if backend == "original":
        src = "build = None  # the original is kept: nothing faster passed\n"
    from gpuspeed.optimize.report import _fmt_t, _t

    measured = (f"{_fmt_t(_t(row))} device-resident, {_fmt_t(_t(row, 'e2e_time'))} end to end, against "
                f"{_fmt_t(_t(run.results.get('original', {})))} for the original" if row else "nothing faster passed")
    dev = "a CPU (no GPU)" if run.where != "cuda" else _dev_name(run)
    run_times = {"original": _t(run.results.get("original", {}), "e2e_time"),
                 "optimized": _t(row, "e2e_time") if row else None, "device": dev}
    replaced = _replaced_confirmation(row)
    if replaced:  # the report publishes the alternating times' ratio: the script must not print the separate ones'
        measured += ", each timed in its own process;\n" + _alternately_line(replaced)
        run_times |= {"original": replaced["original_s"], "optimized": _e2e(replaced["times"]),
                      "how": "timed alternately in one process"}
    lib = {"cupy": "CuPy", "torch_compile": "torch", "torch": "torch", "jax": "JAX", "numba": "Numba"}.get(backend, "it")
    nondeterministic = run.results.get("original", {}).get("nondeterministic")
    verdict_line = (f"Not checked: the original is not deterministic ({nondeterministic}), so nothing can be checked "
                    "against it (see report.md)." if nondeterministic else
                    # as report.md says: the reference itself, with no check of its own to report
                    "The original itself, unchanged: the reference every candidate was checked against within "
                    f"{_tolerance_text(run.wl.rtol, run.wl.atol)} (see report.md)." if backend == "original" else
                    f"Correct against the original within {_tolerance_text(run.wl.rtol, run.wl.atol)} on "
                    f"{len(run.params['seeds'])} fresh seeds (see report.md).")
    text = TEMPLATE.format(
        verdict_line=verdict_line, nondeterministic=nondeterministic,
        name=run.wl.name, date=_dt.date.today().isoformat(), workload_name=run.wl.path.name,
        script_arg=shlex.quote(f"optimized_{run.wl.name}.py"),  # as pasted into a shell: a space in the name
        label=(row or {}).get("label", "the original"), device=dev, measured=measured, rtol=run.wl.rtol,
        atol=run.wl.atol, tolerance=_tolerance_text(run.wl.rtol, run.wl.atol), tolerances=_tolerances(),
        ran_on_gpu=run.where == "cuda", torch_workload=run.wl.kind == "torch",
        n_seeds=len(run.params["seeds"]), lib=lib, library=lib if lib != "it" else "the backend's library",
        install="\n    ".join(x for x in dict.fromkeys(["pip install numpy", INSTALL.get(backend, "")]) if x),
        import_root=run.params.get("cwd") or os.getcwd(),
        fallback_line=_fallback_line(backend, rec, lib),
        range_line=_range_line(rec, run.wl.atol, bool(run.params.get("in_place"))),
        workload_file=run.wl.path.name, workload_path=str(run.wl.path), func=run.wl.func, func_attr=run.wl.func,
        recipe=repr({k: v for k, v in rec.items() if k != "chunk"}), out_forms=_out_forms(run, rec),
        scale=run.wl.scale, input_specs=list(run.wl.input_specs), arg_order=_arg_order(run.wl), chunk=repr(chunk),
        in_place=run.params.get("in_place"), in_place_returns=bool(run.params.get("in_place_returns")),
        caches_results={"original": bool(run.results.get("original", {}).get("caches_results")),
                        "optimized": bool((row or {}).get("caches_results"))},
        run_times=run_times,
        common=_module_source(common), chunking=_module_source(chunking), backend=backend,
        backend_src=textwrap.indent(src, "    "), gpu_backends=GPU_BACKENDS)
    return text


def _replaced_confirmation(row: dict | None) -> dict | None:
    """The primary's confirmation where its ratio replaced the separate timings' (report.md's "Speedup replaced")."""
    conf = (row or {}).get("confirmation") or {}
    return conf if conf.get("status") == "ok" and conf.get("replaced") and conf.get("times") else None


def _e2e(times: dict) -> float:
    """A confirmation's end-to-end median: its device-resident one where the candidate has no other way."""
    return times.get("e2e_time") or times["device_time"]


def _alternately_line(conf: dict) -> str:
    """The header's line on a replaced confirmation: its times and the ratio report.md publishes."""
    from gpuspeed.optimize.confirm import _x
    from gpuspeed.optimize.report import _fmt_t

    times = conf["times"]
    return (f"timed alternately with the original in one process, the original took {_fmt_t(conf['original_s'])} a "
            f"call and it {_fmt_t(times['device_time'])} device-resident, {_fmt_t(_e2e(times))} end to end: "
            f"{_x(conf['ratio'])}x [{_x(conf['low'])}, {_x(conf['high'])}] ({conf['timed']}), which replaced the "
            f"{_x(conf['separate'])}x of the separate times (see report.md)")


def _fallback_line(backend: str, rec: dict, lib: str) -> str:
    """What the script runs where the primary cannot: a GPU backend chosen on a GPU needs one, a CPU primary
    (Numba, or any backend chosen without a GPU) needs only its library, and the original needs nothing."""
    if backend == "original":
        return "Nothing beat the original: the script runs it unchanged (its check and benchmark still work)."
    if backend == "variant":
        return "A variant that takes GPU inputs falls back to the original without a GPU."
    if backend in GPU_BACKENDS and rec.get("device") != "cpu":
        return f"Without a GPU (or without {lib}) it falls back to the original code on the CPU."
    if backend == "numpy":  # NumPy on the CPU: nothing it needs that the script itself does not
        return "It needs only NumPy: it runs wherever the original does."
    return f"Without {lib} it falls back to the original."


def _range_line(rec: dict, atol, in_place: bool) -> str:
    """What a float32 primary does with values past float32's range (~1.2e-38 to 3.4e38), for the script's header."""
    if rec.get("precision") != "float32":
        return ""
    if in_place:
        return ("\nIt computes in float32 and writes into your arrays: values past float32's range (3.4e38) come back "
                "as inf,\nvalues below it (~1.2e-38) with fewer digits or as 0; neither is caught.\n")
    if atol == 0:
        return ("\nIt computes in float32: a result past float32's range (inf or NaN) is the original's answer, and "
                "under\nyour atol=0 so is a call whose input or result falls below float32's range (~1.2e-38). A "
                "result that\nfloat32 rounds to exactly 0 from inputs in its range (x * x of 1e-25) cannot be told "
                "from a true 0 and\ncomes back 0: if yours can, rerun gpuspeed optimize with an rtol under 1e-6 "
                "(no float32 candidate).\n")
    return ("\nIt computes in float32: a result past float32's range (inf or NaN) is the original's answer; values "
            "below\nfloat32's range (~1.2e-38) come back with fewer digits or as 0, an error under 1.2e-38 that the "
            "check's\natol allows (with TOLERANCE atol=0 the script would give the original's answer for them).\n")


def _tolerance_text(rtol, atol) -> str:
    if rtol is None and atol is None:
        return "gpuspeed.check's default tolerance for the dtype (float64 rtol 1e-12, float32 1e-5, ...)"
    if rtol is None:  # an atol alone: the rtol is still the dtype's
        return f"gpuspeed.check's default rtol for the dtype (float64 1e-12, float32 1e-5, ...), atol={atol}"
    return f"rtol={rtol}, atol={atol}" if atol is not None else f"rtol={rtol} (atol: rtol x RMS of the original)"


def _tolerances() -> dict:
    from gpuspeed.verify import TOLERANCES

    return {k: v for k, v in TOLERANCES.items() if k in ("float64", "complex128", "float32", "complex64", "float16")}


OTHER_PRECISION_MAX_S = 10.0  # the original's extra calls are skipped past this (a reference call's time in the run)
FORM_MAX_CHARS = 100_000  # an output form longer than this is not written into the script (its results as computed)


def _out_forms(run, rec) -> str:
    """OUT_FORMS, as the script's source: {dtype_signature of the arguments: output_form of the original's output}
    for the run's first seed's inputs and for those inputs in the other precision (float64 arrays and NumPy scalars as
    float32, complex128 as complex64; float32 as float64 where the run had no float64), each from a call of the
    original here. Past OTHER_PRECISION_MAX_S a call (the run's reference calls took that long), the run's own
    inputs' form is read off its references (refs.pkl) and the other precision's is None (results as computed); a
    call that fails gives None too (code that takes only float64). None for the original itself (nothing to shape)."""
    from gpuspeed.optimize.backends.common import dtype_signature, kind_of, tree_map
    from gpuspeed.optimize.worker import host_inputs

    if rec["backend"] == "original" or not run.params.get("seeds"):
        return "None"
    seed = run.params["seeds"][0]
    try:
        args = host_inputs(run.wl, seed)
    except Exception:  # noqa: BLE001 - the run made these inputs before: only a workload that changed fails here
        return "{}"  # the script's check learns the run's from the original
    double = _has_double(args)
    flip = {"float64": "float32", "complex128": "complex64"} if double else {"float32": "float64",
                                                                              "complex64": "complex128"}

    def other(x):
        name = str(getattr(x, "dtype", "")).replace("torch.", "")
        if name not in flip:
            return x
        if isinstance(x, (np.ndarray, np.generic)):
            return x.astype(flip[name])
        if kind_of(x) == "torch":
            return x.to(getattr(sys.modules["torch"], flip[name]))
        return x

    flipped = tree_map(other, args)
    forms = {}
    if (run.params.get("reference_s") or 0) > OTHER_PRECISION_MAX_S:
        forms[dtype_signature(args)] = _form_of_refs(run, seed)
        forms.setdefault(dtype_signature(flipped), None)
    else:
        for call_args in (args, flipped):
            forms.setdefault(dtype_signature(call_args), _form_of_call(run, call_args))
    return "{" + "".join(f"\n    {k!r}: {_literal(v)}," for k, v in forms.items()) + "\n}"


def _form_of_call(run, args):
    """The output_form of the original's output on args (None where it raises)."""
    from gpuspeed.optimize.backends.common import output_form

    cwd = os.getcwd()
    try:
        torch = sys.modules.get("torch")
        with torch.device("cpu") if torch is not None else contextlib.nullcontext():
            return output_form(run.wl.original(*args), args)
    except Exception:  # noqa: BLE001 - code that takes only float64: the script then returns what it computes
        return None
    finally:
        if os.getcwd() != cwd:
            os.chdir(cwd)


def _form_of_refs(run, seed):
    """The output_form of the original's output as the run's references hold it (NumPy for torch tensors, a 0-d
    tensor a NumPy scalar: the script casts a tensor by its dtype alone); None where they cannot be read."""
    from gpuspeed.optimize.backends.common import output_form
    from gpuspeed.optimize.workload import load_refs

    try:
        ref = load_refs(run.out_dir / "refs.pkl")[seed]
    except Exception:  # noqa: BLE001 - a run whose refs.pkl is gone: the script returns what it computes
        return None
    if run.params.get("in_place"):  # (its result, what it wrote) or what it wrote: the script returns the result
        ref = ref[0] if run.params.get("in_place_returns") else None
    return output_form(ref)


def _literal(form) -> str:
    """form as a Python literal for the script; None where it is not one (a dict keyed by other objects) or too long."""
    import ast

    text = repr(form)
    try:
        return text if len(text) <= FORM_MAX_CHARS and ast.literal_eval(text) == form else "None"
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return "None"


def _has_double(args) -> bool:
    from gpuspeed.optimize.backends.common import leaves

    return any(str(getattr(x, "dtype", "")).replace("torch.", "") in ("float64", "complex128") for x in leaves(args))


def _arg_order(wl) -> list:
    from gpuspeed.optimize.workload import _spec_order

    names = [spec.split("=", 1)[0] for spec in wl.input_specs]
    return _spec_order(wl.original, names) if names else []


def _dev_name(run) -> str:
    from gpuspeed import device as _device

    return _device.get_device(run.where).name


def write(run) -> Path:
    path = run.out_dir / f"optimized_{run.wl.name}.py"
    tmp = path.with_suffix(".py.tmp")
    tmp.write_text(script_text(run))
    tmp.replace(path)
    return path
