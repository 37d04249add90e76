"""Source lines for trace findings: which line of the user's code made each call.

torch.profiler's Python events name each frame by its function's first line, not by the line that
made the call. So one extra run of the function under `sys.setprofile` records, for every call made
from user code, (caller function, callee) -> {caller line: count}. A trace event is then placed by
walking up to its innermost user frame F and the call C directly under it, and looking (F, C) up here.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")
_PYFRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_PKG_DIR = str(Path(__file__).resolve().parents[1])  # src/gpuspeed
_USER_INSIDE_PKG = (os.path.join(_PKG_DIR, "examples"),)


def _library_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(p)
    return tuple(os.path.realpath(r) for r in roots if r)


_ROOTS = _library_roots()


def is_user_file(path: str) -> bool:
    """True for the user's own source: not the stdlib, not installed packages, not gpuspeed itself."""
    if not path or path.startswith("<"):
        return False
    real = os.path.realpath(path)
    if real.startswith(_USER_INSIDE_PKG):
        return True
    if real.startswith(_PKG_DIR + os.sep) or "site-packages" in real or "dist-packages" in real:
        return False
    return not any(real.startswith(r + os.sep) for r in _ROOTS)


@functools.lru_cache(maxsize=1)
def _module_call_key() -> str:
    """The key of nn.Module.__call__ (its _wrapped_call_impl), the frame sys.setprofile sees for `self.l(x)`."""
    import torch

    return code_key(torch.nn.Module.__call__.__code__)


def callee_key(name: str) -> str:
    """A trace python_function name, made comparable across runs (object addresses dropped).

    The trace names a submodule's call `nn.Module: Linear_0` where sys.setprofile saw nn.Module.__call__: both get
    that call's key, so `self.l(x)` is placed at its line (it was placed at forward's `def` line)."""
    if name.startswith("nn.Module: "):
        return _module_call_key()
    m = _PYFRAME.match(name)
    if m:  # a module's code: torch and Python disagree on its first line, so drop it
        line = 0 if m.group(3) == "<module>" else m.group(2)
        return f"{os.path.basename(m.group(1))}({line}): {m.group(3)}"
    return _ADDR.sub("", name)


def code_key(code) -> str:
    """The same key for a code object, as torch names a called Python function."""
    line = 0 if code.co_name == "<module>" else code.co_firstlineno
    return f"{os.path.basename(code.co_filename)}({line}): {code.co_name}"


@dataclass
class Sites:
    """What one instrumented run saw: user functions, and call sites per (caller, callee)."""

    user_funcs: dict = field(default_factory=dict)  # code_key -> (path, firstlineno, name)
    calls: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))  # (F, C) -> {line: n}
    _note: object = None
    sources: dict = field(default_factory=dict)  # path -> list of lines (for the report)
    # (F, C) -> {tuple of lines in call order within one call of F: how many calls of F had it}
    orders: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    # (F, line) -> {"__bool__", "__int__", ...}: the conversions of a tensor to a Python value on that line
    conversions: dict = field(default_factory=lambda: defaultdict(set))

    def lines_for(self, func_key: str, callee: str) -> dict[int, int]:
        return dict(self.calls.get((func_key, callee), {}))

    def where(self, func_key: str, callee: str | None, ordinal: tuple[int, int] | None = None
              ) -> tuple[str | None, int | None, dict]:
        """(path, line, {line: count}) for a call C made from user function F.

        ordinal (k, n): C is the k-th of n calls of C in this call of F; when every call of F made its n
        calls of C from the same lines in the same order, that order places it exactly. Else the busiest line.
        """
        info = self.user_funcs.get(func_key)
        if info is None:
            return None, None, {}
        lines = self.lines_for(func_key, callee) if callee else {}
        line = max(lines, key=lines.get) if lines else info[1]
        if callee and ordinal and len(lines) > 1:
            orders = self.orders.get((func_key, callee), {})
            if len(orders) == 1:
                (seq,) = orders
                if len(seq) == ordinal[1]:
                    line = seq[ordinal[0]]
        return info[0], line, lines

    def conversion_kind(self, func_key: str, line: int | None) -> str | None:
        """'int(tensor)', 'float(tensor)', ... for the tensor-to-Python conversions made on that line."""
        kinds = sorted({CONVERSIONS[c][1] for c in self.conversions.get((func_key, line), ())})
        return " or ".join(kinds) or None

    def source_line(self, path: str | None, line: int | None) -> str:
        if not path or not line:
            return ""
        if path not in self.sources:
            try:
                self.sources[path] = Path(path).read_text().splitlines()
            except OSError:
                self.sources[path] = []
        src = self.sources[path]
        return src[line - 1].strip() if 0 < line <= len(src) else ""


def record_sites(fn, args=(), kwargs=None) -> Sites:
    """Run fn once under sys.setprofile and record every call site in user code."""
    kwargs = kwargs or {}
    sites = Sites()
    user_cache: dict = {}

    def user(code) -> bool:
        # keyed by file name, not by the code object: hashing a code object hashes its constants, and the code
        # torch.compile (dynamo) runs holds slices, which do not hash (TypeError: unhashable type: 'slice')
        u = user_cache.get(code.co_filename)
        if u is None:
            u = user_cache[code.co_filename] = is_user_file(code.co_filename)
        return u

    live: dict = {}  # id(frame) of a running user frame -> {callee: [lines in call order]}
    in_c_call: set = set()  # id(frame) of user frames inside a built-in call (recorded under its own key)

    def note(frame, callee: str) -> None:
        fk = code_key(frame.f_code)
        sites.calls[(fk, callee)][frame.f_lineno] += 1
        live.setdefault(id(frame), {}).setdefault(callee, []).append(frame.f_lineno)

    def hook(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if user(code):
                sites.user_funcs.setdefault(code_key(code), (os.path.realpath(code.co_filename),
                                                            code.co_firstlineno, code.co_name))
            caller = frame.f_back
            if caller is not None and user(caller.f_code):
                note(caller, code_key(code))
        elif event == "c_call":
            if user(frame.f_code):
                note(frame, callee_key(repr(arg)))
                in_c_call.add(id(frame))
        elif event in ("c_return", "c_exception"):
            in_c_call.discard(id(frame))
        elif event == "return":
            calls = live.pop(id(frame), None)
            if calls:
                fk = code_key(frame.f_code)
                for callee, seq in calls.items():
                    sites.orders[(fk, callee)][tuple(seq)] += 1

    sites._note = note  # the operator mode records through the same path

    mode = _op_mode(sites, lambda code, frame: user(code) and id(frame) not in in_c_call)
    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        if mode is None:
            fn(*args, **kwargs)
        else:
            with mode:
                fn(*args, **kwargs)
    finally:
        sys.setprofile(old)
    return sites


_SLOT_OPS = {"getitem": ("select", "slice", "index", "alias", "as_strided"), "setitem": ("copy_", "index_put_",
             "fill_", "slice", "select"), "truediv": ("div",), "floordiv": ("floor_divide", "div"),
             "invert": ("bitwise_not",), "and": ("bitwise_and",), "or": ("bitwise_or",), "xor": ("bitwise_xor",),
             "lshift": ("bitwise_left_shift",), "rshift": ("bitwise_right_shift",), "matmul": ("matmul", "mm")}


# tensor properties whose ATen op has another name (`x.T` runs aten::numpy_T); the mode sees them as `__get__`
_PROPERTY_OPS = {"T": ("numpy_T",), "H": ("matrix_H",)}


# tensor -> Python value conversions (`if t:`, `int(t)`, `float(t)`): the ATen op each makes and its kind.
# Each copies a value to the host, so on a GPU tensor each one waits for the GPU.
CONVERSIONS = {"__bool__": ("is_nonzero", "bool(tensor)"), "__int__": ("item", "int(tensor)"),
               "__float__": ("item", "float(tensor)"), "__index__": ("item", "int(tensor)"),
               "__complex__": ("item", "complex(tensor)")}


def op_keys(torch_name: str) -> tuple[str, ...]:
    """Callee keys for a torch function that Python sees as no call (an operator: `a @ b`, `x[i]`)."""
    if torch_name in CONVERSIONS:
        return (f"op:{CONVERSIONS[torch_name][0]}",)
    if not torch_name.startswith("_") and torch_name.endswith("_") and not torch_name.endswith("__"):
        # `acc += y` reaches the mode as Tensor.add_ (`x //= 2` as floor_divide_): the op is aten::add_
        return (f"op:{torch_name}",)
    n = torch_name.strip("_")
    inplace = torch_name.startswith("__i") and n[1:] in ("add", "sub", "mul", "truediv", "matmul", "and", "or")
    if torch_name.startswith("__") and (inplace or (n.startswith("r") and n[1:] in _SLOT_OPS.keys() | {
            "add", "sub", "mul", "pow", "mod"})):
        n = n[1:]
    names = _SLOT_OPS.get(n) or _PROPERTY_OPS.get(n, (n,))
    return tuple(f"op:{x}_" if inplace else f"op:{x}" for x in names)


def op_key_of(aten_name: str) -> str:
    """The callee key of an ATen op event, to match op_keys()."""
    return "op:" + aten_name.split("::", 1)[-1].split(".", 1)[0]


def _op_mode(sites: Sites, user):
    """A TorchFunctionMode that records the lines of torch operators called straight from user code.

    user(code, frame) is False inside a built-in call made from user code (`torch.add(a, b)`,
    `x.item()`): the trace shows that call itself under the user frame, keyed by its own name."""
    try:
        from torch.overrides import TorchFunctionMode
    except ImportError:
        return None

    seen = _dispatch_recorder()

    class _Lines(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            frame = sys._getframe(1)
            if user(frame.f_code, frame):
                name = getattr(func, "__name__", "")
                if name == "__get__":  # a property (x.T, x.mT): its descriptor names it, as the ATen op does
                    name = getattr(getattr(func, "__self__", None), "__name__", name)
                if name in _INDEXING and seen is not None:
                    # x[i], x[a:b], x[mask], x[idx] = v: which ATen ops run depends on the index, and noting every
                    # candidate put x[mask]'s aten::index at the line of the busiest x[i] (its select)
                    with seen() as ops:
                        out = func(*args, **(kwargs or {}))
                    for op in ops:
                        sites._note(frame, op_key_of(op))
                    return out
                for k in op_keys(name):
                    sites._note(frame, k)
                if name in CONVERSIONS:
                    sites.conversions[(code_key(frame.f_code), frame.f_lineno)].add(name)
            return func(*args, **(kwargs or {}))

    return _Lines()


_INDEXING = ("__getitem__", "__setitem__")


def _dispatch_recorder():
    """A context manager giving the list of ATen ops (`aten::select`, ...) that one call dispatches at its top
    level, in order, or None where this torch has no TorchDispatchMode."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None
    import contextlib

    class _Seen(TorchDispatchMode):
        def __init__(self, ops):
            super().__init__()
            self.ops = ops

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.name())  # 'aten::index.Tensor': the op the profiler shows, overload aside
            return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def seen():
        ops: list = []
        with _Seen(ops):
            yield ops

    return seen
