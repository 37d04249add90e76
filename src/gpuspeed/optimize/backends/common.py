"""What every backend shares: nested outputs, host copies, float64 -> float32 demotion, name rebinding.

Self-contained on purpose (standard library + NumPy only): the emitted optimized_<name>.py pastes this
file in verbatim, so the script gpuspeed writes runs without gpuspeed installed.
"""

import importlib
import os
import sys
import types

import numpy as np

_DEMOTE = {np.dtype("float64"): np.dtype("float32"), np.dtype("complex128"): np.dtype("complex64")}
# array constructors whose float64 default (or explicit float64) becomes float32 when demoting
_CREATORS = {"zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like", "arange",
             "linspace", "logspace", "eye", "identity", "array", "asarray", "ascontiguousarray", "asanyarray",
             "fromiter", "frombuffer", "meshgrid", "tri"}


def kind_of(x) -> str:
    """The library an object comes from: 'numpy', 'torch', 'cupy', 'jax', 'numba', 'builtins', ..."""
    return type(x).__module__.split(".")[0]


def tree_map(fn, obj):
    """fn applied to every leaf of nested tuples, lists and dicts (the structure is kept)."""
    if isinstance(obj, tuple):
        return tuple(tree_map(fn, o) for o in obj)
    if isinstance(obj, list):
        return [tree_map(fn, o) for o in obj]
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return fn(obj)


def leaves(obj) -> list:
    out: list = []
    tree_map(out.append, obj)
    return out


def to_numpy(x):
    """A host NumPy copy of any array (torch, CuPy, JAX, Numba device array); other leaves unchanged."""
    mod = kind_of(x)
    if mod == "torch":
        t = x.detach()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.cpu().numpy() if t.dim() else t.cpu().numpy()[()]
    if mod == "cupy":
        return x.get()
    if mod in ("jax", "jaxlib"):
        return np.asarray(x)
    if mod == "numba" and hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    return x


def host_tree(out, out_dtypes=None):
    """Every leaf of `out` on the host as NumPy; with out_dtypes (one dtype name or None per leaf) a
    demoted float32 leaf is cast back to the dtype the original returned."""
    host = tree_map(to_numpy, out)
    if not out_dtypes:
        return host
    it = iter(out_dtypes)

    def cast(x):
        want = next(it, None)
        if want is None or not hasattr(x, "dtype"):
            return x
        want = _cast_to(x.dtype, want)
        if x.dtype != want:
            return x.astype(want) if isinstance(x, np.ndarray) else want.type(x)
        return x

    return tree_map(cast, host)


def _cast_to(have, want):
    """The dtype a demoted float leaf of dtype `have` is cast back to, given the original's `want` (have itself where
    none applies: integers, booleans); a complex leaf stays complex (no imaginary part dropped), of want's precision."""
    have, want = np.dtype(have), np.dtype(want)
    if have.kind not in "fc" or want.kind not in "fc":
        return have
    if have.kind == "c" and want.kind == "f":
        return np.result_type(want, np.complex64)
    return want


def host_tensors(out, out_dtypes=None):
    """host_tree for PyTorch code's callers: every torch tensor of `out` detached and on the CPU, still a tensor (a
    PyTorch original returns tensors, and its caller goes on with torch ops on them), cast back as host_tree casts a
    demoted float leaf (bfloat16 left as it is); other leaves as host_tree leaves them."""
    def move(x):
        if kind_of(x) == "torch" and hasattr(x, "detach"):  # one on the CPU already is kept (it may be the caller's)
            return x if x.device.type == "cpu" and not x.requires_grad else x.detach().cpu()
        return to_numpy(x)

    host = tree_map(move, out)
    if not out_dtypes:
        return host
    it = iter(out_dtypes)

    def cast(x):
        want = next(it, None)
        if want is None or kind_of(x) != "torch":
            return host_tree(x, [want]) if want is not None else x
        name = str(x.dtype).replace("torch.", "")
        try:
            target = _cast_to(name, want)
        except TypeError:  # bfloat16, float8: no NumPy dtype of that name, and never a demoted result
            return x
        return x if target.name == name else x.to(getattr(sys.modules["torch"], target.name))

    return tree_map(cast, host)


def numpy_to_tensors(out):
    """Every NumPy array or scalar of `out` as a CPU torch tensor (sharing the array's memory), other leaves as they
    are: what a PyTorch original's caller gets from a pipeline that assembles its output in NumPy arrays (chunks)."""
    torch = sys.modules["torch"]  # imported: the original is PyTorch code

    def move(x):
        if isinstance(x, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(x) if any(st < 0 for st in x.strides) else x)
        return torch.as_tensor(x) if isinstance(x, np.generic) else x

    return tree_map(move, out)


def demote_dtype(dtype):
    """float64 -> float32, complex128 -> complex64; anything else unchanged."""
    return _DEMOTE.get(np.dtype(dtype), np.dtype(dtype))


def demote_scalar(x):
    """A NumPy float64 scalar becomes a Python float (a weak scalar: it does not promote float32 arrays)."""
    if isinstance(x, (np.floating, np.complexfloating)):
        return x.item()
    return x


class Demoted:
    """An array module (NumPy, CuPy) whose float64 is float32: its dtype names, and the arrays its
    constructors make, are single precision. User code keeps writing `np.zeros(n)` or `np.float64`."""

    def __init__(self, xp):
        self._xp = xp
        self.__name__ = getattr(xp, "__name__", "xp")

    def __getattr__(self, name):
        xp = self._xp
        if name in ("float64", "double", "float_"):
            return xp.float32
        if name in ("complex128", "cdouble", "complex_"):
            return xp.complex64
        attr = getattr(xp, name)
        if name in _CREATORS and callable(attr):
            return _demoting(attr)
        return attr


# NumPy's host-side settings (floating-point warnings, printing), which CuPy and jax.numpy lack: a GPU
# library raises no floating-point warnings, so under one of them `with np.errstate(...)` changes nothing
_HOST_SETTINGS = ("errstate", "seterr", "geterr", "seterrcall", "geterrcall", "printoptions",
                  "set_printoptions", "get_printoptions")


class WithHostSettings:
    """An array module (CuPy, jax.numpy) that also answers NumPy's host-only settings (`np.errstate`,
    `np.seterr`, ...) with NumPy's own, so user code that sets them runs on it unchanged."""

    def __init__(self, xp):
        self._xp = xp
        self.__name__ = getattr(xp, "__name__", "xp")

    def __getattr__(self, name):
        try:
            attr = getattr(self._xp, name)
        except AttributeError:
            if name not in _HOST_SETTINGS:
                raise
            attr = getattr(np, name)
        setattr(self, name, attr)  # later look-ups of the name skip __getattr__
        return attr


def _demoting(fn):
    def make(*args, **kwargs):
        dt = kwargs.get("dtype")
        if dt is not None:
            try:
                kwargs["dtype"] = demote_dtype(dt)
            except TypeError:
                pass
            return fn(*args, **kwargs)
        out = fn(*args, **kwargs)
        if isinstance(out, (list, tuple)):
            return _like(out, [_demote_array(o) for o in out])
        return _demote_array(out)

    make.__name__ = getattr(fn, "__name__", "make")
    return make


def _demote_array(a):
    dt = getattr(a, "dtype", None)
    try:
        if dt is not None and np.dtype(dt) in _DEMOTE:
            return a.astype(demote_dtype(dt))
    except TypeError:
        pass
    return a


def _import(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def rebind(module, xp, scipy_prefix=None, demote=False) -> list:
    """Point a loaded module's NumPy names (`np`, `from numpy import exp`, `numpy.linalg`) at another
    array library `xp`, and its SciPy names at `scipy_prefix` ('cupyx.scipy', 'jax.scipy') where a
    counterpart exists. Functions read globals at call time, so the module's code now runs on xp.
    Returns notes on names left pointing at NumPy/SciPy (no counterpart)."""
    target = xp if all(hasattr(xp, n) for n in _HOST_SETTINGS) else WithHostSettings(xp)
    target = Demoted(target) if demote else target
    notes = []
    for key, val in list(vars(module).items()):
        if isinstance(val, types.ModuleType):
            name = val.__name__
            if name == "numpy":
                setattr(module, key, target)
            elif name.startswith("numpy."):
                sub = _import(xp.__name__ + name[len("numpy"):])
                if sub is not None:
                    setattr(module, key, sub)
                else:
                    notes.append(f"{name} has no counterpart in {xp.__name__}: left on NumPy")
            elif name == "scipy" or name.startswith("scipy."):
                sub = _import(scipy_prefix + name[len("scipy"):]) if scipy_prefix else None
                if sub is not None:
                    setattr(module, key, sub)
                else:
                    notes.append(f"{name} has no counterpart{' in ' + scipy_prefix if scipy_prefix else ''}: "
                                 "left on SciPy")
            continue
        origin = getattr(val, "__module__", None)
        if not isinstance(origin, str) and isinstance(val, np.ufunc) and scipy_prefix:
            origin = "scipy.special"  # a SciPy ufunc (erf, expit, ...) may not say where it comes from
        if not isinstance(origin, str) or not callable(val) or isinstance(val, types.FunctionType) and \
                origin == module.__name__:
            continue
        short = getattr(val, "__name__", key)
        if origin == "numpy" or origin.startswith("numpy."):
            repl = getattr(target, short, None)
        elif scipy_prefix and (origin == "scipy" or origin.startswith("scipy.")):
            sub = _import(scipy_prefix + ".".join([""] + origin.split(".")[1:2]))
            repl = getattr(sub, short, None) if sub is not None else None
        else:
            continue
        if repl is not None:
            setattr(module, key, repl)
        else:
            notes.append(f"{origin}.{short} has no counterpart: left as is")
    return notes


def importable(module):
    """Make `module` importable by its name (and its folder by path) for the life of the process:
    torch.compile (dynamo) imports a traced function's module by name to read its globals, so a module
    built with types.ModuleType or loaded under a synthetic name would fail there. A name already taken
    by another module gets a unique suffix."""
    name = module.__name__
    if sys.modules.get(name) is not module:
        if name in sys.modules:
            name = f"{name}_{id(module):x}"
            module.__name__ = name
        sys.modules[name] = module
    path = getattr(module, "__file__", None)
    folder = os.path.dirname(os.path.abspath(path)) if path else None
    if folder and folder not in sys.path:
        sys.path.insert(0, folder)  # the module's sibling imports resolve wherever dynamo re-imports them
    return module


HEAP_SETTLE_BYTES = 31 * 2**20  # under glibc's 32 MiB ceiling for its dynamic mmap threshold (64-bit)


def settle_heap() -> None:
    """Put the C heap in the state a long-running process has, before timing host code: glibc's malloc starts with
    a 128 KiB mmap threshold and raises it (and its trim threshold, to twice that) each time a larger mmapped block
    is freed, up to 32 MiB. Until then a function's few-MB temporaries come from fresh pages and go back at each
    free: heat_stencil's original took 43,000 page faults a call in a fresh process (116-204 ms) and none in the
    optimize worker that had freed larger arrays first (54 ms). Two blocks made and freed at once (never touched:
    no memory is used) raise both thresholds to their ceiling, whatever the process did before, so the run and the
    emitted script time from the same state. Elsewhere than glibc it costs nothing and changes nothing."""
    try:
        held = [np.empty(HEAP_SETTLE_BYTES, dtype=np.uint8) for _ in range(2)]  # one at least is mmapped
    except MemoryError:
        return
    del held


def static_positions(args) -> tuple:
    """Positions of the arguments a tracing compiler should treat as constants: Python and NumPy integers,
    booleans and strings (loop counts like `steps`, sizes, flags). Traced, `range(steps)` cannot unroll."""
    return tuple(i for i, a in enumerate(args) if isinstance(a, (bool, int, str, np.integer, np.bool_)))


def take(x, axis, start, stop):
    """x[start:stop] along `axis` (any array library)."""
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def returning_args(fn, positions, returns=False):
    """fn for code that writes its result into its arguments: the call, then those arguments (a tuple, in
    `positions` order), so the written result is checked like a returned one; with `returns` (code that also
    returns a result) (the result, that tuple)."""
    def call(*args):
        res = fn(*args)
        call.returned = res is not None  # a result where none is expected: it may be what belonged in the arguments
        written = tuple(args[i] for i in positions)
        return (res, written) if returns else written

    call.returned = False

    call.__name__ = getattr(fn, "__name__", "call")
    return call


def write_back(dest, src) -> None:
    """Copy every array of `src` (a device or float32 copy) into the matching array of `dest` (the
    caller's own), in place and cast to its dtype; arrays that are one object already are left alone. A
    Python list or dict in `dest` gets the numbers (and length) `src` holds: pure-Python code writes into those."""
    if dest is src:
        return
    if isinstance(dest, list) and isinstance(src, list) and len(dest) != len(src):  # appended to, or popped from
        dest[:] = [tree_map(_host_scalar, s) for s in src]
        return
    if isinstance(dest, dict) and isinstance(src, dict):
        for k, s in src.items():
            if k in dest and (isinstance(dest[k], (list, tuple, dict)) or hasattr(dest[k], "shape")):
                write_back(dest[k], s)
            else:
                dest[k] = tree_map(_host_scalar, s)
        return
    if isinstance(dest, (list, tuple)):
        for j, (d, s) in enumerate(zip(dest, src, strict=True)):
            if isinstance(d, (list, tuple, dict)) or hasattr(d, "shape"):
                write_back(d, s)
            elif isinstance(dest, list):  # a number in a Python list the code wrote into (pure-Python `out[i] = v`)
                dest[j] = _host_scalar(s)
        return
    d, s = dest, src
    if hasattr(d, "shape"):
        if kind_of(d) == "torch":
            d.copy_(s if kind_of(s) == "torch" else d.new_tensor(to_numpy(s)))
        else:
            np.copyto(d, to_numpy(s), casting="unsafe")


def _host_scalar(x):
    """A leaf written back into a Python list: on the host, a NumPy scalar as a Python number."""
    x = to_numpy(x)
    return x.item() if isinstance(x, np.generic) else x


def _address(x):
    """(where its data starts, shape, strides, dtype, device) of a NumPy, torch or CuPy array; None for anything else."""
    kind = kind_of(x)
    if isinstance(x, np.ndarray):
        return "numpy", x.__array_interface__["data"][0], x.shape, x.strides, x.dtype.str
    if kind == "torch" and hasattr(x, "data_ptr"):
        return "torch", x.data_ptr(), tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device)
    if kind == "cupy" and hasattr(x, "data"):
        return "cupy", x.data.ptr, x.shape, x.strides, x.dtype.str, x.device.id
    return None


def same_array(a, b) -> bool:
    """a is b, or a view of exactly b's elements (torch.compile hands back a returned argument as such a view)."""
    if a is b:
        return True
    where = _address(a)
    return where is not None and 0 not in tuple(a.shape) and where == _address(b)  # empty ones share no data


def _like(obj, items):
    """A tuple or list of obj's type holding items: a namedtuple takes them as its fields (type(obj)(items) was a
    TypeError, and the run a traceback, for an original returning one)."""
    return type(obj)(*items) if isinstance(obj, tuple) and hasattr(obj, "_fields") else type(obj)(items)


def _keyed_map(fn, obj):
    """tree_map, with each dict's items visited in the order of their keys (by repr), whatever order the dict holds
    them in: leaf j is the same output of two results whose dicts differ only in their order."""
    if isinstance(obj, (tuple, list)):
        return _like(obj, [_keyed_map(fn, o) for o in obj])
    if isinstance(obj, dict):
        done = {k: _keyed_map(fn, obj[k]) for k in sorted(obj, key=repr)}
        return {k: done[k] for k in obj}
    return fn(obj)


def aliased(out, args, same=None) -> list:
    """[[j, i], ...]: the leaves j of `out` (dicts by key) that are argument i itself (a NumPy, torch or CuPy array:
    code that writes into an argument and returns it); `same` says what counts as the same array (default: the same
    object)."""
    same = same or (lambda a, b: a is b)
    found: list = []

    def look(j, leaf):
        if hasattr(leaf, "shape") and not isinstance(leaf, np.generic):  # a scalar has no identity to keep
            i = next((i for i, a in enumerate(args) if same(leaf, a)), None)
            if i is not None:
                found.append([j, i])

    _each_leaf(look, out)
    return found


def _each_leaf(visit, out) -> None:
    """visit(j, leaf) for every leaf of `out`, j counting them in _keyed_map's order (dicts by key): the numbering
    aliased() and sharing() give (with_arguments() counts alike)."""
    count = iter(range(sys.maxsize))

    def look(leaf):
        visit(next(count), leaf)
        return leaf

    _keyed_map(look, out)


def _host_memory(x):
    """x as a NumPy array over its own memory (a torch CPU tensor's too), None for anything else (a scalar, a device
    array: another device's memory is no caller's host data)."""
    if isinstance(x, np.ndarray):
        return x if x.size else None
    if kind_of(x) == "torch" and hasattr(x, "numel") and str(getattr(x, "device", "")) == "cpu" and x.numel() \
            and str(x.dtype) != "torch.bfloat16":
        try:
            return x.detach().numpy()
        except Exception:  # a tensor without NumPy's form (sparse, a subclass): no memory to look at
            return None
    return None


def _bounds(a: np.ndarray) -> tuple[int, int]:
    """[first byte, past the last byte) of the memory a NumPy array spans (what np.may_share_memory compares)."""
    lo = hi = a.__array_interface__["data"][0]
    for n, stride in zip(a.shape, a.strides, strict=True):
        lo, hi = (lo + (n - 1) * stride, hi) if stride < 0 else (lo, hi + (n - 1) * stride)
    return lo, hi + a.itemsize


def sharing(out, args) -> list:
    """[[j, i], ...]: the leaves j of `out` (as aliased() counts them) that lie in the host memory of argument i: the
    argument itself or a view of it (a slice, a transpose, the NumPy view of a torch CPU tensor). Spans are compared
    sorted, so a list of thousands of arrays in and out costs thousands of steps, not millions."""
    import bisect

    spans = sorted((*_bounds(h), i) for i, a in enumerate(args) for h in map(_host_memory, leaves(a)) if h is not None)
    starts = [lo for lo, _, _ in spans]
    reach = []  # reach[k]: the furthest end among spans[:k + 1]
    for _, hi, _ in spans:
        reach.append(max(hi, reach[-1]) if reach else hi)
    found: list = []

    def look(j, leaf):
        h = _host_memory(leaf)
        if h is not None and spans:
            lo, hi = _bounds(h)
            k = bisect.bisect_left(starts, hi)  # the spans that start before this one ends
            if k and reach[k - 1] > lo:
                found.append([j, next(i for s_lo, s_hi, i in reversed(spans[:k]) if s_hi > lo)])

    _each_leaf(look, out)
    return found


def overlapping_outputs(out) -> list:
    """[[j, k], ...] (j > k): the leaves j and k of `out` (as aliased() counts them) that share host memory (one array
    returned twice, or a view of another output): a caller that writes into one changes the other. Interleaved views
    of one buffer (x[::2], x[1::2]) hold no element in common and are not listed."""
    items: list = []

    def look(j, leaf):
        h = _host_memory(leaf)
        if h is not None:
            items.append((*_bounds(h), j, h))

    _each_leaf(look, out)
    items.sort(key=lambda item: item[0])
    found, active = [], []  # active: the spans that reach past the start of the current one
    for lo, hi, j, h in items:
        active = [a for a in active if a[1] > lo]
        found += [[max(j, k), min(j, k)] for _, _, k, g in active if _share_elements(h, g)]
        active.append((lo, hi, j, h))
    return sorted(found)


def _share_elements(a, b) -> bool:
    """Whether two arrays whose byte spans overlap hold an element in common (a bounded search: past it, they do)."""
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except Exception:  # numpy's TooHardError: strides too tangled to settle cheaply; overlapping spans count
        return True


def with_arguments(out, args, pairs):
    """out with leaf j (as aliased() counts them) replaced by args[i] for each [j, i] of `pairs` (the caller's own
    array where the code returned its copy of that argument)."""
    if not pairs:
        return out
    where = dict(pairs)

    def pick(leaf):
        j = pick.count
        pick.count += 1
        return args[where[j]] if j in where else leaf

    pick.count = 0
    return _keyed_map(pick, out)


def dtype_signature(args) -> tuple:
    """What a function's output types follow in its arguments: each leaf's type and dtype, and whether it is 0-d (NumPy
    and torch promote by dtype; torch by dimension too), not its shape or values; runs of equal leaves counted once
    ((key, count), ...: a list of 10,000 floats is one entry)."""
    sig: list = []
    for x in args if type(args) is tuple and all(type(a) in _FLAT for a in args) else leaves(args):
        dtype = getattr(x, "dtype", None)
        if dtype is None or not hasattr(x, "shape"):
            key = type(x).__name__
        else:
            key = (type(x), dtype, not len(x.shape))
            key = _SIGNATURE_KEYS.get(key) or _SIGNATURE_KEYS.setdefault(
                key, f"{type(x).__name__}:{str(dtype).replace('torch.', '')}" + (":0d" if key[2] else ""))
        if sig and sig[-1][0] == key:
            sig[-1][1] += 1
        else:
            sig.append([key, 1])
    return tuple([(k, n) for k, n in sig])


_FLAT = (np.ndarray, float, int, bool)  # arguments that are leaves themselves (no walk through leaves() needed)
_SIGNATURE_KEYS: dict = {}  # (type, dtype, 0-d) -> its dtype_signature key, made once


_PYTHON_NUMBERS = (bool, int, float, complex)  # in this order: each holds the ones before it without loss


def _leaf_kind(x):
    """'array:<dtype>' (a NumPy array or a torch tensor), 'scalar:<dtype>' (a NumPy scalar), 'python:<type>' (a
    Python number), None (anything else)."""
    if isinstance(x, np.generic):
        return f"scalar:{x.dtype.name}"
    if isinstance(x, np.ndarray):
        return f"array:{x.dtype.name}"
    if kind_of(x) == "torch" and hasattr(x, "dtype"):
        return f"array:{str(x.dtype).replace('torch.', '')}"
    if isinstance(x, _PYTHON_NUMBERS):
        return f"python:{type(x).__name__}"
    return None


def output_form(out, args=()) -> list:
    """[kinds, handed, twins, views]: how a call's output looks, for another's to be made to look the same
    (returned_like): `kinds` is out's structure with each leaf's kind (_leaf_kind), `handed` the leaves that are
    arguments themselves ([[path, argument], ...]), `twins` the leaves that are an earlier leaf's array again ([[path,
    earlier path], ...]: `return y, y`), `views` the leaves that are views of an argument's memory ([[path, argument],
    ...]: `return x[1:]`); a path is the keys and indices from out to the leaf, so a list of another length elsewhere
    in the output moves none of them."""
    seen: dict = {}
    handed: list = []
    twins: list = []
    views: list = []

    def look(leaf, path):
        if hasattr(leaf, "shape") and not isinstance(leaf, np.generic):  # an array (a scalar has no identity to keep)
            i = next((i for i, a in enumerate(args) if a is leaf), None)
            if i is not None:
                handed.append([path, i])
            elif id(leaf) in seen:
                twins.append([path, seen[id(leaf)]])
            else:
                seen[id(leaf)] = path
                i = next((i for i, a in enumerate(args) if _shares_memory(leaf, a)), None)
                if i is not None:
                    views.append([path, i])
        return leaf

    _path_map(look, out)
    return [tree_map(_leaf_kind, out), handed, twins, views]


def _shares_memory(leaf, arg) -> bool:
    """leaf lies in arg's memory (a view of it: a slice, a transpose, a diagonal), for NumPy arrays and torch tensors."""
    if isinstance(leaf, np.ndarray) and isinstance(arg, np.ndarray):
        return leaf.size > 0 and bool(np.may_share_memory(leaf, arg))
    if kind_of(leaf) == "torch" and kind_of(arg) == "torch" and hasattr(leaf, "untyped_storage"):
        try:
            return leaf.numel() > 0 and leaf.device == arg.device and \
                leaf.untyped_storage().data_ptr() == arg.untyped_storage().data_ptr()
        except Exception:  # a tensor without storage (a fake or sparse one): no view to keep
            return False
    return False


def _geometry(x):
    """(address of its first element, itemsize, shape, strides in elements) of a NumPy, CuPy or torch array; None
    for anything else, or strides that are not whole elements."""
    kind = kind_of(x)
    try:
        if isinstance(x, np.ndarray):
            ptr, size, strides = x.__array_interface__["data"][0], x.itemsize, x.strides
        elif kind == "cupy":
            ptr, size, strides = x.data.ptr, x.itemsize, x.strides
        elif kind == "torch" and hasattr(x, "data_ptr") and x.layout == sys.modules["torch"].strided:
            return x.data_ptr(), x.element_size(), tuple(x.shape), tuple(x.stride())
        else:
            return None
    except Exception:  # no address to read (a fake tensor, an array without data)
        return None
    if any(st % size for st in strides):
        return None
    return ptr, size, tuple(x.shape), tuple(st // size for st in strides)


def _index_of(offset, shape, strides):
    """The multi-index (one entry per dimension of an array of this shape and element strides) whose element lies
    `offset` elements from the first, each try (floor, then balanced digits) checked to land exactly; None if none."""
    order = sorted(range(len(shape)), key=lambda d: -abs(strides[d]))
    for balanced in (False, True):
        rest, index = offset, [0] * len(shape)
        for d in order:
            if strides[d] == 0 or shape[d] == 1:
                continue
            q = round(rest / strides[d]) if balanced else rest // strides[d]
            index[d], rest = q, rest - q * strides[d]
        if rest == 0:
            yield index


def view_onto(leaf, made_from, caller):
    """`caller`'s own array viewed as `leaf` views `made_from` (caller as a backend cast or moved it: its shape, its
    elements in another dtype or on another device): the same elements of the caller's array, so the slice, transpose
    or diagonal of an argument that the optimized code returns is the caller's memory again, with its exact values, as
    the original's is. None where leaf is no such view (a copy, another dtype's reinterpretation, out of bounds)."""
    g_leaf, g_made, g_caller = _geometry(leaf), _geometry(made_from), _geometry(caller)
    if None in (g_leaf, g_made, g_caller) or kind_of(leaf) != kind_of(made_from) or leaf.dtype != made_from.dtype:
        return None
    (p_leaf, size, v_shape, v_strides), (p_made, _, shape, strides) = g_leaf, g_made
    if g_caller[2] != shape or (p_leaf - p_made) % size or 0 in v_shape or 0 in shape:
        return None
    start = next((i for i in _index_of((p_leaf - p_made) // size, shape, strides)
                  if all(0 <= q < n for q, n in zip(i, shape, strict=True))), None)
    # the shortest step of those found (a reversed axis is -1 along it, not -1 along the one above and n-1 along it)
    steps = [min(_index_of(st, shape, strides), key=lambda i: sum(map(abs, i)), default=None) for st in v_strides]
    if start is None or None in steps:
        return None
    for d in range(len(shape)):  # every element of the view inside the array: its multi-index is then the one
        lo = start[d] + sum(min(0, (n - 1) * step[d]) for n, step in zip(v_shape, steps, strict=True))
        hi = start[d] + sum(max(0, (n - 1) * step[d]) for n, step in zip(v_shape, steps, strict=True))
        if lo < 0 or hi >= shape[d]:
            return None
    mine = g_caller[3]
    new_strides = [sum(step[d] * mine[d] for d in range(len(shape))) for step in steps]
    if isinstance(caller, np.ndarray):
        first = caller[tuple(slice(i, i + 1) for i in start)]
        writeable = bool(caller.flags.writeable and getattr(getattr(leaf, "flags", None), "writeable", True))
        return np.lib.stride_tricks.as_strided(first, v_shape, [st * caller.itemsize for st in new_strides],
                                               writeable=writeable)
    if kind_of(caller) == "torch":
        offset = caller.storage_offset() + sum(i * st for i, st in zip(start, mine, strict=True))
        return caller.as_strided(v_shape, new_strides, offset)
    return None


def _leaf_at(obj, path):
    for key in path:
        obj = obj[key]
    return obj


def keeping_views(impl, args, views):
    """impl(*args) (an Impl: host arguments in, host results out), with each leaf that `views` ([[path, argument], ...]
    of output_form) names the caller's own argument viewed as the optimized code viewed its copy of it (view_onto):
    the original returns a view of its argument there, and a cast-back copy of a float32 slice is neither the caller's
    memory nor its exact values. A leaf that is not such a view in this call is left as computed."""
    dev = impl.prepare(args)
    res = impl.run(*dev)
    mapped = {}
    for path, i in views:
        if i >= len(args) or i >= len(dev):
            continue
        try:
            view = view_onto(_leaf_at(res, path), dev[i], args[i])
        except (KeyError, IndexError, TypeError):  # the optimized output has another structure: left as it is
            view = None
        if view is not None:
            mapped[tuple(path)] = view
    host = impl.fetch(res)
    if not mapped:
        return host
    return _path_map(lambda leaf, path: mapped.get(path, leaf), host)


def _path_map(fn, obj, path=()):
    """tree_map with fn(leaf, path), each dict's items visited in the order of their keys (by repr)."""
    if isinstance(obj, (tuple, list)):
        return _like(obj, [_path_map(fn, o, (*path, j)) for j, o in enumerate(obj)])
    if isinstance(obj, dict):
        done = {k: _path_map(fn, obj[k], (*path, k)) for k in sorted(obj, key=repr)}
        return {k: done[k] for k in obj}
    return fn(obj, path)


def returned_like(out, form, args):
    """out (an optimized call's result on `args`) made to look as the original's does by its output_form(): the
    caller's own array where the original hands back that argument, each dict's items in the original's order, each
    container a tuple or a list as the original's, each leaf of the original's kind and dtype (a float32 result cast
    back to float64, a 0-d array or a Python float made the NumPy scalar the original returns, a NumPy scalar made
    the Python number it returns), one array where the original returns one array twice. A cast that would lose a
    kind of data (complex to float, float to integer) is not made: such a result is wrong, and is left to show it."""
    if form is None:
        return out
    kinds, handed, twins = form[:3]
    if handed:
        where = {tuple(path): i for path, i in handed}

        def mine(leaf, path):
            i = where.get(path)
            return args[i] if i is not None and i < len(args) and _same_form(leaf, args[i]) else leaf

        out = _path_map(mine, out)
    out = _shaped_like(out, kinds)
    if twins:
        held: dict = {}
        _path_map(lambda leaf, path: held.setdefault(path, leaf), out)
        first = {tuple(path): tuple(earlier) for path, earlier in twins}

        def once(leaf, path):
            k = first.get(path)
            return held[k] if k in held and _same_form(leaf, held[k]) else leaf

        out = _path_map(once, out)
    return out


def _same_form(a, b) -> bool:
    """Two arrays of one shape (the one standing for the other in an output)."""
    return hasattr(a, "shape") and hasattr(b, "shape") and tuple(a.shape) == tuple(b.shape)


def _shaped_like(out, kinds):
    if isinstance(kinds, dict):
        if isinstance(out, dict) and set(out) == set(kinds):
            return {k: _shaped_like(out[k], kinds[k]) for k in kinds}
        return out
    if isinstance(kinds, (tuple, list)):
        if isinstance(out, (tuple, list)) and len(out) == len(kinds):
            return type(kinds)(_shaped_like(o, k) for o, k in zip(out, kinds, strict=True))
        if isinstance(out, (tuple, list)) and kinds and all(k == kinds[0] for k in kinds):
            return type(kinds)(_shaped_like(o, kinds[0]) for o in out)  # one per row, say: as many as the call has
        return out
    return _leaf_like(out, kinds) if isinstance(kinds, str) else out


def _parsed_kind(kind):
    """(what, name, NumPy dtype or None) of a _leaf_kind, parsed once."""
    parsed = _KINDS.get(kind)
    if parsed is None:
        what, _, name = kind.partition(":")
        try:
            dtype = np.dtype(name) if what != "python" else None
        except TypeError:  # bfloat16, float8: torch's own, never a demoted result
            dtype = None
        parsed = _KINDS[kind] = (what, name, dtype)
    return parsed


_KINDS: dict = {}


def _leaf_like(x, kind):
    what, name, want = _parsed_kind(kind)
    if what == "array" and type(x) is np.ndarray and x.dtype == want:  # the usual case, first
        return x
    if what == "python":
        if type(x).__name__ == name:
            return x
        if getattr(x, "ndim", None) == 0 and hasattr(x, "item"):  # a NumPy scalar, a 0-d array or tensor
            x = x.item()
        want = next((t for t in _PYTHON_NUMBERS if t.__name__ == name), None)
        if want is not None and type(x) in _PYTHON_NUMBERS and \
                _PYTHON_NUMBERS.index(type(x)) <= _PYTHON_NUMBERS.index(want):
            return want(x)
        return x
    if want is None:
        return x
    if kind_of(x) == "torch":
        try:
            have = np.dtype(str(x.dtype).replace("torch.", ""))
        except TypeError:
            return x
        if have != want and np.can_cast(have, want, "same_kind"):
            return x.to(getattr(sys.modules["torch"], want.name))
        return x
    if isinstance(x, np.ndarray) and (what == "array" or x.ndim):
        return x.astype(want) if x.dtype != want and np.can_cast(x.dtype, want, "same_kind") else x
    if isinstance(x, (np.ndarray, np.generic, *_PYTHON_NUMBERS)):  # a number, or a 0-d array
        have = np.asarray(x).dtype
        if have != want and not np.can_cast(have, want, "same_kind"):
            return x
        if what == "array":
            return np.asarray(x, dtype=want)
        return x if type(x) is want.type else want.type(x[()] if isinstance(x, np.ndarray) else x)
    return x


def in_place_call(impl, positions, returns=False):
    """The original's contract for code that writes into its arguments: host arrays in, the call made on
    the implementation's own copies (moved, cast), the written ones copied back into the caller's, None out
    (with `returns`, the call's result on the host, where the caller's own array stands for each argument the
    call returned, as the original returns it: `x *= 2; return x` gives back the caller's x, holding the result)."""
    def call(*args):
        dev = impl.prepare(args)
        res = impl.run(*dev)
        impl.sync()
        for i in positions:
            write_back(args[i], dev[i])
        if not returns:
            return None
        returned = aliased(res, dev, same_array) if len(dev) == len(args) else []
        host = impl.fetch(res)
        return with_arguments(host, args, returned) if len(leaves(host)) == len(leaves(res)) else host

    call.device = impl.device  # where the work runs, as on the Impl (the emitted script's benchmark reads it)
    return call


def torch_settings(run, device=None, tf32=False, dynamo_config=None):
    """run(*args) with torch's default device (tensors the code makes land there), TF32 matmuls and dynamo's config
    set for the call alone: set for good they were the process's, and the emitted script runs in the user's own
    (their torch.zeros() went to the GPU after it, and every float32 matmul of theirs ran in TF32)."""
    import contextlib

    import torch

    if device is None and not tf32 and not dynamo_config:
        return run

    def call(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            if device is not None:
                stack.enter_context(torch.device(device))
            if dynamo_config:
                stack.enter_context(torch._dynamo.config.patch(**dynamo_config))
            if tf32:
                saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
                stack.callback(_set_tf32, torch, *saved)
                _set_tf32(torch, True, True)
            return run(*args, **kwargs)

    call.__name__ = getattr(run, "__name__", "run")
    return call


def _set_tf32(torch, matmul: bool, cudnn: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


class NotApplicable(ImportError):
    """A backend cannot take this code (a construct its compiler or tracer rejects): the candidate is
    recorded as unavailable with the reason, like a library that is not installed, not as a failure."""


class Impl:
    """A candidate, built: prepare(host args) -> device args (moved and cast once), run(*device args)
    -> device output, fetch(output) -> host NumPy output, sync() waits for the device."""

    def __init__(self, run, prepare=None, fetch=None, device="cpu", sync=None, label="", notes=None):
        self.run = run
        self.prepare = prepare or (lambda args: args)
        self.fetch = fetch or (lambda out: host_tree(out))
        self.device = device
        self.sync = sync or (lambda: None)
        self.label = label
        self.notes = list(notes or [])

    def __call__(self, *host_args):
        """Host arrays in, host arrays out: the end-to-end call, transfers included."""
        return self.fetch(self.run(*self.prepare(host_args)))

    def returning(self, positions, returns=False) -> "Impl":
        """This candidate for code that writes into its arguments: run() returns those arguments (with
        `returns`, after its result)."""
        return Impl(returning_args(self.run, positions, returns), self.prepare, self.fetch, self.device, self.sync,
                    self.label, self.notes)
