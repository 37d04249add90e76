"""Numba njit(parallel=True) on the CPU for loop-bound code: the original and the module's own helper
functions compiled; with prange=True the outermost loops become prange (checked like any candidate); with
parallel=False a serial njit."""

import ast
import inspect
import textwrap
import types
from pathlib import Path

import numba
import numpy as np

from gpuspeed.optimize.backends.common import Impl, NotApplicable, demote_dtype, demote_scalar, host_tree
from gpuspeed.optimize.backends.common import _like, tree_map

_shims = []


def _install_shims() -> None:
    """NumPy idioms nopython mode lacks, registered once as overloads beside Numba's own. Each answers only
    the argument types Numba rejects (Numba tries every implementation in turn), so code that compiled
    before compiles the same. Kept in this file: the emitted script pastes it whole."""
    if _shims:
        return
    _shims.append(True)
    from numba.core import types
    from numba.extending import overload

    @overload(np.array)
    def _array_of_array(obj, dtype=None):
        # np.array(an_array, dtype=...), the usual "working copy" line: Numba takes only sequences there
        if not isinstance(obj, types.Array):
            return None
        if dtype is None or isinstance(dtype, (types.NoneType, types.Omitted)):
            return lambda obj, dtype=None: obj.copy()
        return lambda obj, dtype=None: obj.astype(dtype)


class NumbaUnsupported(NotApplicable):
    """The code uses a construct Numba's nopython mode cannot compile: the candidate does not apply."""


def _what_failed(exc) -> str:
    """The line of a Numba typing error that names the construct, and where it is in the user's code."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    what = next((ln for ln in lines if ln.startswith((">>>", "Unknown attribute", "Use of unsupported",
                                                      "Cannot determine", "Untyped global", "Invalid use",
                                                      "No implementation", "Cannot unify", "NameError",
                                                      "Unsupported context manager"))), None)
    what = (what or (lines[1] if len(lines) > 1 else lines[0] if lines else type(exc).__name__)).lstrip("> ")
    if what.startswith("No implementation") and what.endswith("signature:"):
        # "No implementation of function Function(<function argsort at 0x..>) found for signature:": the call it
        # could not type is on the next line (">>> argsort(array(float64, 2d, C), axis=...)"), and why after it
        call = next((ln.lstrip("> ") for ln in lines[lines.index(what) + 1:] if ln.startswith(">>>")), None)
        why = next((ln for ln in lines if ln.startswith("Unsupported keywords")), None)
        if call:
            what = f"no implementation for {call}" + (f" ({why})" if why else "")
    where = [ln.rstrip(":") for ln in lines if ln.startswith("File ") and "site-packages" not in ln]
    return what + (f" ({where[-1]})" if where else "")


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_typed = []  # numba.typed's Dict and List, looked up once


def _plain(out):
    """Numba's typed containers as Python's: a dict the compiled code builds comes back as a numba.typed.Dict (a
    list built as numba.typed.List as one), which no check or caller reads as the original's dict. The two classes
    are looked up once: numba.typed resolves each access through importlib.import_module (~2 us), which on every
    leaf of every call made a 1 us function take 17 us."""
    if not _typed:
        from numba.typed import Dict, List

        _typed.extend((Dict, List))
    typed_dict, typed_list = _typed
    if isinstance(out, (typed_dict, dict)):
        return {k: _plain(v) for k, v in out.items()}
    if isinstance(out, typed_list):
        return [_plain(v) for v in out]
    if isinstance(out, (list, tuple)):
        return _like(out, [_plain(v) for v in out])  # a namedtuple takes its fields
    return out


_MULTIARRAY = getattr(np, "_core", None) or np.core  # NumPy 2's home of its C functions, or 1.x's
_NUMPY_EMPTY, _NUMPY_EMPTY_LIKE = _MULTIARRAY.multiarray.empty, _MULTIARRAY.multiarray.empty_like  # NumPy's own


class _numpy_allocators:
    """NumPy's own np.empty and np.empty_like in place while Numba compiles: parallel=True's array expressions allocate
    through numpy.empty, which a wrapper of them (a checker that fills fresh arrays with NaN) leaves untyped for Numba
    once a numba.vectorize ufunc compiled in the call has refreshed its typing ("Cannot determine Numba type of
    <class 'function'>"). Compiled code never calls the Python functions: what was there comes back after."""

    def __enter__(self):
        self.held = np.empty, np.empty_like
        np.empty, np.empty_like = _NUMPY_EMPTY, _NUMPY_EMPTY_LIKE

    def __exit__(self, *exc):
        np.empty, np.empty_like = self.held
        return False


class _Compiled:
    """The jitted function, called as the original: Numba's compile errors (raised at the first call) become
    NumbaUnsupported with the construct named; parallel=True's array analysis, which rejects broadcasting a
    length-1 axis ("Sizes of ... do not match"), falls back once to a serial njit of the same code."""

    def __init__(self, fn, name, parallel=True):
        from numba.core import errors

        self.fn, self.name = fn, name
        self.jitted = numba.njit(parallel=parallel)(fn)
        self.serial = not parallel
        self.impl = None  # the Impl it runs in: its label and notes say when it fell back
        self.compile_errors = tuple(getattr(errors, n) for n in ("TypingError", "UnsupportedError", "LoweringError",
                                                                 "NumbaNotImplementedError", "UnsupportedRewriteError",
                                                                 "CompilerError", "UnsupportedBytecodeError")
                                    if hasattr(errors, n))

    def __call__(self, *args):
        if not self.jitted.signatures:  # the first call compiles; later argument types do not compile unasked
            try:
                return self._call(*args)
            finally:
                if self.jitted.signatures:
                    self.jitted.disable_compile()
        try:
            if np.empty is _NUMPY_EMPTY:
                return self.jitted(*args)
            with _numpy_allocators():  # a numba.vectorize ufunc compiles on new argument types, in this call
                return self.jitted(*args)
        except TypeError as exc:
            if not str(exc).startswith("No matching definition"):
                raise
        # other argument types (float32 after float64, a strided view): compiled as the first was, under the same
        # warning filter (parallel=True's "no transformation ... was possible" printed a dozen lines on each)
        import warnings

        from numba.core.errors import NumbaPerformanceWarning

        self.jitted.disable_compile(False)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NumbaPerformanceWarning)
                return self._call(*args)
        finally:
            self.jitted.disable_compile()

    def _call(self, *args):
        with _numpy_allocators():
            return self._compile_and_call(*args)

    def _compile_and_call(self, *args):
        first = not self.jitted.signatures
        try:
            if first:  # the compile: parallel=True on a loop it cannot parallelize (a sequential recurrence) warns
                # "no transformation for parallel execution was possible", a dozen lines on stderr of every run
                import warnings

                from numba.core.errors import NumbaPerformanceWarning

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", NumbaPerformanceWarning)
                    return self.jitted(*args)
            return self.jitted(*args)
        except self.compile_errors as exc:
            if not first:  # compiled before: an error of the code itself on these inputs
                raise
            raise NumbaUnsupported(f"Numba nopython mode cannot compile {self.name}: {_what_failed(exc)}") from exc
        except NotImplementedError as exc:
            # Numba's lowering raises the builtin one for what it cannot lower (np.sin(x, out=out): "unsupported
            # keyword arguments when calling Function(<ufunc 'sin'>)"); no signature compiled: not the code's own
            if not first or self.jitted.signatures:
                raise
            if str(exc).strip() == "float16":  # raised bare while typing the arguments: its CPU target has no float16
                raise NumbaUnsupported(f"Numba cannot compile {self.name} for float16 arrays: its CPU target has no "
                                       "float16 type (a variant that casts to float32 can try it)") from exc
            raise NumbaUnsupported(f"Numba nopython mode cannot compile {self.name}: {_what_failed(exc)}") from exc
        except TypeError as exc:
            # the code compiled, but its result has no Python form: a dict whose values differ in type (Numba types it
            # as a literal-keyed struct) "cannot convert native LiteralStrKey[Dict](...) to Python object"
            if not first or not str(exc).startswith("cannot convert native"):
                raise
            what = "a dict whose values differ in type" if "LiteralStrKey" in str(exc) else "a value of a Numba type"
            raise NumbaUnsupported(f"Numba nopython mode cannot return {self.name}'s result to Python ({what}): "
                                   f"{_first_line(exc)}") from exc
        except AssertionError as exc:
            if self.serial or "do not match" not in str(exc):
                raise
            self.serial = True
            if self.impl is not None:
                self.impl.notes.append(f"Numba parallel=True rejected a broadcast ({_what_failed(exc)}): compiled "
                                       "without parallel=True (serial njit)")
                self.impl.label = self.impl.label.replace("parallel=True", "serial, parallel=True rejected")
            self.jitted = numba.njit(self.fn)
            return self._call(*args)


def _with_prange(fn, module):
    """fn recompiled from its source with each outermost `for ... in range(...)` as numba.prange; a range with a step
    other than 1 (`range(1, n, 2)`) stays a range: prange takes none ("Only constant step size of 1")."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    fdef = tree.body[0]
    fdef.decorator_list = []
    for node in fdef.body:
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and \
                isinstance(node.iter.func, ast.Name) and node.iter.func.id == "range" and _unit_step(node.iter):
            node.iter.func = ast.Attribute(value=ast.Name(id="__numba", ctx=ast.Load()), attr="prange",
                                           ctx=ast.Load())
    ns = fn.__globals__  # the workload's namespace, or the copy build() made of the original's own module's
    ns["__numba"] = numba
    exec(compile(ast.fix_missing_locations(tree), inspect.getsourcefile(fn) or "<prange>", "exec"), ns)
    return ns[fn.__name__]


def _unit_step(call) -> bool:
    """A range(...) call whose step is 1: none given, or a literal 1."""
    step = call.args[2] if len(call.args) > 2 else None
    return step is None or isinstance(step, ast.Constant) and step.value == 1


def _users_own(fn, module) -> bool:
    """A function of the workload file, or of a file beside it (`from helpers import step`), not of a library."""
    if fn.__module__ == module.__name__:
        return True
    try:
        src, home = Path(inspect.getsourcefile(fn)).resolve(), Path(module.__file__).resolve().parent
    except (TypeError, OSError, AttributeError):  # no source file, or a module made in memory (no __file__)
        return False
    return src.is_relative_to(home) and "site-packages" not in src.parts


def _numpy_scalars(out, out_dtypes):
    """Numba boxes a float32 (int32, complex64) number it returns as a Python one: as the NumPy scalar the original
    returned there (out_dtypes: its leaves' dtype names), the same value; a leaf of another kind is left as it is."""
    wanted = iter(out_dtypes)

    def cast(x):
        want = next(wanted, None)
        if want is None or type(x) not in (int, float, complex):
            return x
        want = np.dtype(want)
        if want.kind not in "iufc" or want == np.asarray(x).dtype:
            return x
        try:
            return want.type(x)
        except (OverflowError, TypeError, ValueError):  # not a value of that dtype: the check says so
            return x

    return tree_map(cast, out)


def _decorated(fn, func):
    """(the function a functools.wraps decorator wraps, rewrap(compiled) -> the decorator's wrapper calling compiled in
    its place): Numba compiles the user's code, not the wrapper's `*args, **kwargs` (DICT_MERGE, which it rejects),
    and the wrapper still runs around it in Python, as in the original."""
    inner = fn.__wrapped__
    cells = fn.__closure__ or ()
    held = [k for k, c in enumerate(cells) if _cell_value(c) is inner]
    if not isinstance(inner, types.FunctionType) or not held:
        raise NumbaUnsupported(f"Numba compiles Python functions: {func} is wrapped by a decorator that does not hold "
                               "it as a plain function, so the code it runs cannot be compiled in its place")
    inner, rewrap_inner = _decorated(inner, func) if getattr(inner, "__wrapped__", None) is not None else (inner, None)

    def rewrap(compiled):
        if rewrap_inner is not None:
            compiled = rewrap_inner(compiled)
        closure = tuple(types.CellType(compiled) if k in held else c for k, c in enumerate(cells))
        wrapper = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
        wrapper.__kwdefaults__ = fn.__kwdefaults__
        return wrapper

    return inner, rewrap


def _plain_function(fn):
    """A helper under a functools.wraps decorator as the function it wraps: compiled code calls it, and cannot call
    the decorator's Python wrapper (a logger's, a timer's); what the wrapper added is left out, the checks judge it."""
    inner = inspect.unwrap(fn)
    return inner if isinstance(inner, types.FunctionType) else fn


def _plain_vectorize(val, module) -> bool:
    """An np.vectorize of a user's own Python function with no signature nor excluded arguments: numba.vectorize
    compiles the same function into a ufunc that compiled code calls (an np.vectorize object it cannot type). Its
    result's dtype is what Numba infers, not the first element's as np.vectorize picks it: the checks compare them."""
    return isinstance(val, np.vectorize) and isinstance(val.pyfunc, types.FunctionType) and \
        _users_own(val.pyfunc, module) and val.signature is None and not val.excluded


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def build(module, func="original", precision="as-written", out_dtypes=None, prange=False, parallel=True,
          scalar_dtypes=None, **_):
    """scalar_dtypes: the original's output dtypes, for the numbers Numba returns as Python ones (_numpy_scalars)."""
    demote = precision == "float32"
    _install_shims()
    for key, val in list(vars(module).items()):  # helpers the original calls must be compiled too
        if isinstance(val, types.FunctionType) and key != func and not key.startswith("inputs") and \
                key != "variants" and _users_own(val, module):
            setattr(module, key, numba.njit(_plain_function(val)))  # in the workload only: the neighbour's untouched
        elif _plain_vectorize(val, module):  # `vf = np.vectorize(f)`, `@np.vectorize`: a ufunc compiled from f
            setattr(module, key, numba.vectorize(_plain_function(val.pyfunc)))
    fn = getattr(module, func)
    if not isinstance(fn, types.FunctionType):  # numba.njit takes Python functions only ("not a function" TypeError)
        raise NumbaUnsupported(f"Numba compiles Python functions: {func} is a {type(fn).__name__} "
                               "(a NumPy ufunc, a functools.partial, a callable object)")
    rewrap = None
    if getattr(fn, "__wrapped__", None) is not None:  # `@my_timer` over original, made with functools.wraps
        fn, rewrap = _decorated(fn, func)
    kw_only = [n for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY] \
        if isinstance(fn, types.FunctionType) else []
    if kw_only:  # Numba takes them for required positional ones: "not enough arguments: expected at least 3, got 1"
        raise NumbaUnsupported(f"Numba cannot compile {func}: it has keyword-only parameters ({', '.join(kw_only)})")
    if fn.__code__.co_flags & inspect.CO_VARKEYWORDS:  # Numba counts **kwargs as one more required argument
        raise NumbaUnsupported(f"Numba cannot compile {func}: it takes **kwargs (a decorator's wrapper? one made with "
                               "functools.wraps lets Numba compile the function it wraps)")
    if isinstance(fn, types.FunctionType) and fn.__globals__ is not vars(module) and _users_own(fn, module):
        # the original itself comes from a file beside the workload (`from mycode import original`): its helpers are
        # looked up there, so they are compiled in a copy of that module's namespace (the module itself untouched)
        ns = dict(fn.__globals__)
        for key, val in list(ns.items()):
            if isinstance(val, types.FunctionType) and val is not fn and _users_own(val, module):
                ns[key] = numba.njit(_plain_function(val))
            elif _plain_vectorize(val, module):
                ns[key] = numba.vectorize(_plain_function(val.pyfunc))
        fn = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
    if prange:
        fn = _with_prange(fn, module)
    # parallel=False: a serial njit, for loops whose small array expressions parallel=True would fork threads for at
    # every iteration (a step loop over 3-vectors: 0.55 ms against 23 us serial, the original 365 us)
    jitted = _Compiled(fn, func, parallel)

    def prepare(args):
        def move(x):
            if isinstance(x, np.ndarray) and demote:
                return x.astype(demote_dtype(x.dtype))
            return demote_scalar(x) if demote else x
        return tree_map(move, args)

    # as written, the host arrays go in as they are and come out as Numba returns them (NumPy already): each call's
    # own cost is the compiled code's, as the run's end-to-end time (its device time) says
    fetch = (lambda out: host_tree(_plain(out), out_dtypes)) if demote or out_dtypes else _plain
    if scalar_dtypes:
        fetch = (lambda out, plain=fetch: _numpy_scalars(plain(out), scalar_dtypes))
    jitted.impl = Impl(jitted if rewrap is None else rewrap(jitted), prepare if demote else None, fetch, device="cpu",
                       label=f"Numba njit({'parallel=True' if parallel else 'serial'}{', prange' if prange else ''}) "
                             f"on the CPU ({precision})")
    return jitted.impl
