"""The shared memory a simulated Numba CUDA launch asks for, held to what a GPU gives a block: static shared arrays
(`cuda.shared.array(shape, dtype)`) over 48 KiB a block fail to compile (ptxas: 'uses too much shared data'), and
static plus dynamic shared memory over 48 KiB fail to launch (Numba makes no opt-in past it), where the CUDA
simulator allocates NumPy arrays of any size and runs the kernel. The static arrays are read from the kernel's
source and the device functions it calls (their shapes and dtypes are compile-time constants: globals, closure
variables, literals), as the simulator keeps no record of them before a thread reaches them. A shared or local
array sized by one of the kernel's arguments, which no GPU compiles, is refused the same way."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass

MAX_SHARED_PER_BLOCK = 48 * 1024  # static shared memory a block may hold (every compute capability), and what a
# launch may use without cudaFuncAttributeMaxDynamicSharedMemorySize


@dataclass(frozen=True)
class SharedArray:
    name: str  # the variable it is assigned to ('?' when none)
    function: str  # the kernel or device function declaring it
    line: int  # in that function's file
    shape: tuple
    dtype: str
    nbytes: int

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}] = {self.nbytes} B at {self.function} line {self.line}"


def _is_shared_array(func: ast.expr, space: str = "shared") -> bool:
    """`cuda.shared.array` / `shared.array` (or `cuda.local.array`, space "local") as written in a kernel."""
    if not (isinstance(func, ast.Attribute) and func.attr == "array"):
        return False
    owner = func.value
    return (isinstance(owner, ast.Attribute) and owner.attr == space) or (
        isinstance(owner, ast.Name) and owner.id == space)


def _shape_node(call: ast.Call) -> ast.expr | None:
    given = {k.arg: k.value for k in call.keywords}
    return call.args[0] if call.args else given.get("shape")


@functools.lru_cache(maxsize=256)
def _source_tree(fn):
    """(the parsed source of fn, its first line in its file), or None where the source cannot be read or parsed."""
    try:
        lines, first = inspect.getsourcelines(fn)
        return ast.parse(textwrap.dedent("".join(lines))), first
    except (OSError, TypeError, SyntaxError):
        return None


def shaped_by_arguments(fn) -> str | None:
    """One line when a kernel sizes a shared or local array by one of its own arguments (`cuda.shared.array(n, ...)`
    with n a kernel argument): Numba needs a compile-time constant there and a GPU fails to compile it, where the
    simulator allocates whatever it is given. None otherwise (or where the source cannot be read)."""
    parsed = _source_tree(fn)
    if parsed is None:
        return None
    tree, first = parsed
    kernel = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if kernel is None:
        return None
    params = {a.arg for a in kernel.args.posonlyargs + kernel.args.args + kernel.args.kwonlyargs}
    for node in ast.walk(kernel):
        if not isinstance(node, ast.Call):
            continue
        space = "shared" if _is_shared_array(node.func) else "local" if _is_shared_array(node.func, "local") else None
        shape = _shape_node(node) if space else None
        used = sorted({n.id for n in ast.walk(shape) if isinstance(n, ast.Name) and n.id in params}) if shape else []
        if used:
            return (f"{getattr(fn, '__name__', 'kernel')}: cuda.{space}.array({ast.unparse(shape)}, ...) at line "
                    f"{first + node.lineno - 1} is sized by its argument {used[0]}: Numba needs a compile-time "
                    "constant (a literal or a global) there, so a GPU fails to compile it, where the CUDA simulator "
                    "allocates it; size it by a global constant" + (
                        ", or take dynamic shared memory (cuda.shared.array(0, dtype), its bytes given at launch)"
                        if space == "shared" else ""))
    return None


def _namespace(fn) -> dict:
    """The names a kernel's constant expressions may use: its globals, then its closure's values."""
    names = dict(getattr(fn, "__globals__", {}))
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    for var, cell in zip(getattr(code, "co_freevars", ()), cells, strict=False):
        try:
            names[var] = cell.cell_contents
        except ValueError:  # a closure variable not yet assigned
            continue
    return names


def _value(node: ast.expr, names: dict):
    """The value of a constant expression of the kernel (a literal, a global, a closure variable, arithmetic or a
    tuple of them); raises where it is anything else (a call is not evaluated: it would run the user's code)."""
    if any(isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr)) for n in ast.walk(node)):
        raise ValueError("not a constant expression")
    return eval(compile(ast.Expression(node), "<shared shape>", "eval"), {"__builtins__": {}}, names)  # noqa: S307


def _dtype(value):
    import numpy as np

    try:
        from numba.core import types
        from numba.np import numpy_support

        if isinstance(value, types.Type):
            return numpy_support.as_dtype(value)
    except Exception:  # a Numba type NumPy has no dtype for: left to np.dtype, which refuses it
        pass
    return np.dtype(value)


def _device_function(node: ast.expr, names: dict):
    """The Python function of a @cuda.jit(device=True) function a call names (the simulator's, or a GPU dispatcher's),
    else None."""
    try:
        target = _value(node, names)
    except Exception:  # a call of a local or a computed callable: not a device function named at compile time
        return None
    if getattr(target, "_device", False) and callable(getattr(target, "fn", None)):  # the simulator's FakeCUDAKernel
        return target.fn
    options = getattr(target, "targetoptions", None)
    if isinstance(options, dict) and options.get("device") and callable(getattr(target, "py_func", None)):
        return target.py_func  # numba.cuda's CUDADispatcher of a device function
    return None


@functools.lru_cache(maxsize=256)  # a launcher may launch one kernel thousands of times
def static_shared_arrays(fn) -> tuple[SharedArray, ...]:
    """The static shared arrays of a simulated kernel's function and of the device functions it calls (each function
    once, as Numba makes one array a declaration); () where the source cannot be read. An array whose shape or
    dtype is no constant here is left out (Numba refuses it at compile time)."""
    found: list[SharedArray] = []
    seen: set = set()

    def visit(f, depth: int) -> None:
        if id(f) in seen or depth > 8:
            return
        seen.add(id(f))
        parsed = _source_tree(f)
        if parsed is None:
            return
        tree, first = parsed
        names, fname = _namespace(f), getattr(f, "__name__", "kernel")
        targets = {}  # id(call) -> the name it is assigned to
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                targets[id(node.value)] = node.targets[0].id
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if _is_shared_array(node.func):
                given = dict(zip(("shape", "dtype"), node.args, strict=False))
                given.update({k.arg: k.value for k in node.keywords if k.arg in ("shape", "dtype")})
                try:
                    shape = _value(given["shape"], names)
                    dtype = _dtype(_value(given["dtype"], names))
                except Exception:  # not a constant here: nothing said of it
                    continue
                shape = tuple(int(d) for d in shape) if isinstance(shape, (tuple, list)) else (int(shape),)
                count = 1
                for d in shape:
                    count *= d
                if count > 0:  # shape 0 is the dynamic shared memory, sized at launch
                    found.append(SharedArray(targets.get(id(node), "?"), fname, first + node.lineno - 1, shape,
                                             str(dtype), count * dtype.itemsize))
            elif (inner := _device_function(node.func, names)) is not None:
                visit(inner, depth + 1)

    visit(fn, 0)
    return tuple(found)


def over_limit(kernel: str, fn, dynamic: int, simulated: bool = True) -> str | None:
    """One line when a simulated launch of `fn` with `dynamic` bytes of dynamic shared memory asks a block for more
    shared memory than a GPU gives it; None when it fits, or when nothing can be said. `simulated=False`: a kernel
    about to be compiled for a GPU, whose compiler would refuse it in many lines of its own."""
    arrays = static_shared_arrays(fn)
    static = sum(a.nbytes for a in arrays)
    biggest = sorted(arrays, key=lambda a: -a.nbytes)
    listed = "; ".join(str(a) for a in biggest[:3]) + ("; ..." if len(biggest) > 3 else "")
    limit = f"{MAX_SHARED_PER_BLOCK // 1024} KiB ({MAX_SHARED_PER_BLOCK} B)"
    if static > MAX_SHARED_PER_BLOCK:
        where = ("on a GPU it fails to compile (ptxas: 'uses too much shared data'), where the CUDA simulator runs it"
                 if simulated else "ptxas refuses to compile it ('uses too much shared data')")
        return (f"{kernel}: its static shared arrays take {static} B a block ({listed}), over the {limit} of static "
                f"shared memory a block may hold: {where}; use smaller tiles or a narrower dtype")
    if dynamic > 0 and static + dynamic > MAX_SHARED_PER_BLOCK:
        return (f"{kernel}: launched with {dynamic} B of dynamic shared memory beside {static} B of static shared "
                f"arrays, {static + dynamic} B a block, over the {limit} a launch may use: a GPU refuses the launch "
                "(CUDA_ERROR_INVALID_VALUE; Numba makes no opt-in past 48 KiB), where the CUDA simulator runs it; "
                "launch with less dynamic shared memory")
    return None
