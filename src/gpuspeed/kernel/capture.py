"""Intercept the Triton and Numba CUDA kernel launches a Python launcher makes, with what each one ran with.

While a `Capture` is open it wraps, at class level, the methods every launch goes through:
- Triton: `JITFunction.run` (compiled; it returns the CompiledKernel, with registers, spills and shared
  memory) and, under TRITON_INTERPRET=1, `InterpretedFunction.run`; the grid callable is wrapped so the grid
  it returns is the grid recorded. `Autotuner.run` marks which autotuner a launch came through, and
  `Autotuner._bench` marks its benchmarking launches so they are not counted as the launcher's.
- Numba: `_Kernel.launch` (the compiled kernel: registers, static shared memory, local memory per
  thread) and, under NUMBA_ENABLE_CUDASIM=1, the simulator's `FakeCUDAKernel.__call__` (which hands the kernel
  NumPy views of host torch tensors, as a GPU launch takes CUDA tensors through __cuda_array_interface__, and
  refuses a launch of no blocks or threads, as a GPU does, where the simulator would run nothing).
An interpreted kernel's autotuner has no device to time its configs on (none here, or --device cpu), so its
benchmark runs each config once (a correctness run) and calls them all equal: the first config is chosen.
Backends are patched once imported: at entry, and again at `refresh()` (kernel_report calls it after the
warm-up call, which may have imported the kernels lazily).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from gpuspeed.kernel.chunks import layout, loop_steps
from gpuspeed.kernel.numba_signature import mismatch
from gpuspeed.kernel.shared_memory import over_limit, shaped_by_arguments

_INHERITED = object()  # marks a patched method that the class inherited rather than defined
TRITON_DEFAULT_WARPS, TRITON_DEFAULT_STAGES = 4, 3  # the NVIDIA backend's defaults when a launch names none
_open_captures = 0  # Captures open now (all threads)


def watching_launches() -> bool:
    """Whether a Capture is open: a launcher that replays its launches from a CUDA graph launches them eagerly
    then, so the kernels it runs are seen (a graph replay goes through no Python launch path)."""
    return _open_captures > 0


@dataclass
class Launch:
    """One kernel launch as captured; `compiled` is the backend's kernel object (None when interpreted)."""

    kernel: str
    backend: str  # "triton" or "numba"
    grid: list
    block: list | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    shared_dynamic: int = 0
    interpreted: bool = False
    compiled: Any = None
    autotuner: Any = None
    meta: dict = field(default_factory=dict)  # constexpr / config kwargs of a Triton launch (BLOCK sizes...)
    arg_bytes: int = 0  # bytes of the memory its array arguments cover (views of one buffer once: arg_bytes)
    # an autotuned launch: {"chosen": the Config it ran with, "timings": {Config: time} of its own tuning key, or
    # None where unknown}, taken when it ran (the autotuner itself keeps only its last choice and timings)
    tuned: dict | None = None
    # its arrays' memory, scalar arguments and largest array's elements (kernel.chunks: a chunked launcher's bytes)
    layout: dict | None = None
    # the constexprs a Triton kernel's loops step by (BLOCK_K): no part of what a program covers (kernel.chunks)
    loop_steps: frozenset = frozenset()


_NO_KEY = object()  # an autotuner run that looked up no key (a single config)
_PLAIN_CACHE = object()  # marks an autotuner cache to turn back into a plain dict on exit


class _KeyedCache(dict):
    """An Autotuner's cache that remembers the last key looked up: the tuning key of the launch under way."""

    last = _NO_KEY

    def __contains__(self, key):
        self.last = key
        return super().__contains__(key)

    def __getitem__(self, key):
        self.last = key
        return super().__getitem__(key)


def _dims(d) -> list[int]:
    """A grid or block given as an int or a 1-3 tuple -> [x, y, z]."""
    if isinstance(d, int):
        return [int(d), 1, 1]
    t = [int(v) for v in tuple(d)]
    return (t + [1, 1, 1])[:3]


def _plain(v) -> bool:
    return isinstance(v, (bool, int, float, str)) or v is None


def arg_bytes(values) -> int:
    """Bytes of the array arguments (torch, NumPy, CuPy, Numba device arrays) of one launch, each memory range once:
    arguments sharing memory (the same tensor passed as input and output, x and x.view(-1), x and x[::2]) count the
    union of their byte ranges, as roofline.place.min_bytes counts a function's inputs; arrays whose memory cannot be
    located (the CUDA simulator's device arrays) count their own bytes, once each; scalars count nothing.

    A launch's arguments are taken as moved once each: which of them a kernel reads and which it writes cannot be
    seen from its arguments, so a buffer that an in-place kernel reads and writes counts once (its real traffic is
    twice that; pass bytes= to say so), the same whether it was passed once or as two views. A lower bound, as the
    launcher's floor (inputs read once + outputs written once) is: the GB/s and % of roof it gives are never raised
    by a buffer handed over twice."""
    from gpuspeed import trees
    from gpuspeed.roofline.place import _distinct_bytes, _extent

    located, seen, total = [], set(), 0
    for v in trees.leaves(list(values)):
        if _extent(v) is not None:
            located.append(v)
            continue
        if id(v) in seen:
            continue
        if hasattr(v, "element_size") and hasattr(v, "numel"):  # torch (an empty one counts nothing)
            n = v.element_size() * v.numel()
        elif getattr(v, "ndim", 0) > 0 and hasattr(v, "nbytes"):  # device arrays with no address here (not scalars)
            n = v.nbytes
        else:
            continue
        seen.add(id(v))
        total += int(n)
    return total + _distinct_bytes(located)


class Capture:
    """Context manager: `with Capture() as cap: fn(*args)`; then `cap.launches`. `cap.recording = False`
    lets calls run through the patches (autotuning, compiling) without recording them."""

    def __init__(self):
        self.launches: list[Launch] = []
        self.recording = True
        self._open = False
        self._undo: list = []
        self._timings: dict = {}  # (id(autotuner), tuning key) -> {Config: time} of that key's tuning
        # id(kernel) -> (kernel, the names of its tl.constexpr parameters, those its loops step by)
        self._constexprs: dict = {}
        self._local = threading.local()

    # --- state kept per thread while a launch is under way
    def _get(self, key, default=None):
        return getattr(self._local, key, default)

    def _set(self, key, value):
        setattr(self._local, key, value)

    def _patch(self, owner, name, make):
        own = name in owner.__dict__  # else inherited: wrap what is inherited, and remove the wrapper after
        original = owner.__dict__[name] if own else getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append((owner, name, original if own else _INHERITED))

    def __enter__(self) -> "Capture":
        global _open_captures
        self._triton_done = self._numba_done = False
        _open_captures += 1
        self._open = True
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and "triton" not in sys.modules:
            try:  # an interpreted autotuner needs its stand-in benchmark even when the launcher imports triton late
                import triton  # noqa: F401
            except ImportError:
                pass
        self.refresh()
        return self

    def refresh(self) -> None:
        """Patch the backends imported since the last look (a launcher may import its kernels on first call)."""
        try:
            if not self._triton_done and "triton" in sys.modules:
                self._triton_done = True
                self._patch_triton()
            if not self._numba_done and ("numba.cuda" in sys.modules or "numba_cuda" in sys.modules):
                self._numba_done = True
                self._patch_numba()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        global _open_captures
        if self._open:
            self._open = False
            _open_captures -= 1
        while self._undo:
            owner, name, original = self._undo.pop()
            if original is _INHERITED:
                delattr(owner, name)
            elif original is _PLAIN_CACHE:
                setattr(owner, name, dict(getattr(owner, name)))
            else:
                setattr(owner, name, original)

    # --- Triton
    def _keyed_cache(self, tuner):
        """The autotuner's cache, made a _KeyedCache (which remembers the key of the launch under way) while the
        Capture is open; None where the autotuner keeps no dict cache."""
        cache = getattr(tuner, "cache", None)
        if type(cache) is dict:
            tuner.cache = cache = _KeyedCache(cache)
            self._undo.append((tuner, "cache", _PLAIN_CACHE))
        return cache if isinstance(cache, _KeyedCache) else None

    def _note_tuning(self, tuner, cache, timings_before, keys_before, first: int) -> None:
        """After an Autotuner.run: the config its launch ran with and the timings of that launch's own key (an
        autotuner keeps only the last chosen config and the last key's timings: a launcher that runs one autotuned
        kernel on two sizes would read the second's choice and timings on both), on the launches it made."""
        key = getattr(cache, "last", _NO_KEY)
        timings = getattr(tuner, "configs_timings", None)
        if key is not _NO_KEY:
            if timings is not timings_before and timings:  # this run timed the configs of this key
                self._timings[(id(tuner), key)] = dict(timings)
            elif key not in keys_before and key in cache:  # chosen untimed: pruned to one config
                self._timings[(id(tuner), key)] = {cache[key]: None}
        tuned = {"chosen": getattr(tuner, "best_config", None),
                 "timings": self._timings.get((id(tuner), key)) if key is not _NO_KEY else None}
        if tuned["timings"] is None and (cache is None or len(cache) <= 1):
            tuned["timings"] = dict(timings) if timings else None  # one key tuned before the Capture: its timings
        for la in self.launches[first:]:
            if la.autotuner is tuner and la.tuned is None:
                la.tuned = tuned

    def _patch_triton(self) -> None:
        from triton.runtime import autotuner, jit

        cap = self
        self._patch(jit.JITFunction, "run", lambda orig: cap._triton_run(orig, interpreted=False))
        try:
            from triton.runtime.interpreter import InterpretedFunction

            from gpuspeed.compat import triton_interpreter_index

            triton_interpreter_index()  # triton 3.6's interpreter with NumPy >= 2.4: loops over runtime bounds
            self._patch(InterpretedFunction, "run", lambda orig: cap._triton_run(orig, interpreted=True))
            self._patch_interpreter_bounds()
            self._patch_interpreter_dot()
        except (ImportError, KeyError):  # no interpreter in this triton
            pass
        at = autotuner.Autotuner

        def wrap_run(orig):
            def run(tuner, *args, **kwargs):
                outer = cap._get("autotuner")
                cap._set("autotuner", tuner)
                first, cache = len(cap.launches), cap._keyed_cache(tuner)
                timings_before, keys_before = getattr(tuner, "configs_timings", None), set(cache or ())
                try:
                    ret = orig(tuner, *args, **kwargs)
                finally:
                    cap._set("autotuner", outer)
                cap._note_tuning(tuner, cache, timings_before, keys_before, first)
                return ret
            return run

        def wrap_bench(orig):
            def _bench(tuner, *args, **kwargs):
                cap._set("benchmarking", cap._get("benchmarking", 0) + 1)
                try:
                    return orig(tuner, *args, **kwargs)
                finally:
                    cap._set("benchmarking", cap._get("benchmarking") - 1)
            return _bench

        self._patch(at, "run", wrap_run)
        if hasattr(at, "_bench"):
            self._patch(at, "_bench", wrap_bench)
        if "do_bench" in at.__dict__:
            # an interpreted kernel's configs are not timed, GPU here or not (--device cpu on a GPU machine: triton's
            # do_bench would time the interpreter's host work with CUDA events and pick by that): run each once (a
            # correctness run), call them equal, so the first config is chosen, as the report says
            def wrap_do_bench(orig):
                def do_bench(tuner):
                    if _interpreted(tuner):
                        return _run_once
                    return orig.__get__(tuner, type(tuner)) if hasattr(orig, "__get__") else orig
                return property(do_bench)
            self._patch(at, "do_bench", wrap_do_bench)

    def _patch_interpreter_bounds(self) -> None:
        """The Triton interpreter loads and stores through raw host pointers, unchecked: an unmasked tl.store past
        the end of a tensor writes over the heap (glibc then aborts the process, 'double free or corruption', or
        the damage passes unseen), where a GPU would fault or corrupt a neighbour. While a Capture is open each
        interpreted launch's memory operations are held to the storage of its tensor arguments: a lane that is
        not masked off and reaches outside all of them raises OutOfBounds before it touches memory; and its programs
        are held to a GPU's, which run at once: two touching one element, one writing, raise ProgramRace at its end."""
        from triton.runtime import interpreter as it

        if not all(hasattr(it, n) for n in ("GridExecutor", "InterpreterBuilder", "_get_np_dtype")):
            return  # another interpreter layout: left unchecked
        cap = self

        from gpuspeed.kernel.program_races import ProgramAccesses, tensor_names

        def wrap_init(orig):
            def _init_args_hst(executor, *args, **kwargs):
                hst = orig(executor, *args, **kwargs)
                name = getattr(getattr(executor, "fn", None), "__name__", "kernel")
                cap._set("bounds", (name, _storage_ranges(hst)))
                try:
                    named = tensor_names(executor.fn, *hst) if isinstance(hst, tuple) and len(hst) == 2 else []
                except Exception:  # another interpreter layout: the race names no argument
                    named = []
                cap._set("races", ProgramAccesses(name, named))
                return hst
            return _init_args_hst

        def wrap_call(orig):
            def __call__(executor, *args, **kwargs):
                outer, outer_races = cap._get("bounds"), cap._get("races")
                try:
                    got = orig(executor, *args, **kwargs)
                    races = cap._get("races")
                    said = races.race(getattr(it.interpreter_builder, "grid_dim", None) or (1, 1, 1)) if races else None
                    if said:
                        raise ProgramRace(said)
                    return got
                finally:
                    cap._set("bounds", outer)
                    cap._set("races", outer_races)
            return __call__

        def checked(op, ptr_at, mask_at, value_at=None):  # positions (and names) of the pointer, mask, value arguments
            def wrap(orig):
                def method(builder, *args, **kwargs):
                    bounds = cap._get("bounds")
                    if bounds is not None:
                        ptrs = args[ptr_at[0]] if len(args) > ptr_at[0] else kwargs.get(ptr_at[1])
                        mask = (None if mask_at is None else args[mask_at[0]] if len(args) > mask_at[0]
                                else kwargs.get(mask_at[1]))
                        _check_bounds(bounds, op, builder, ptrs, mask, it._get_np_dtype)
                        races = cap._get("races")
                        if races is not None and op in ("load", "store"):
                            value = (None if value_at is None else args[value_at[0]] if len(args) > value_at[0]
                                     else kwargs.get(value_at[1]))
                            races.note(op, builder, ptrs, mask, value)
                        elif races is not None:  # an atomic: the launch orders its programs itself
                            races.atomic = True
                    return orig(builder, *args, **kwargs)
                return method
            return wrap

        def atomic(orig):  # tl.atomic_load / atomic_store: through the masked load and store, noted as atomics
            def method(builder, *args, **kwargs):
                races = cap._get("races")
                if races is not None:
                    races.atomic = True
                return orig(builder, *args, **kwargs)
            return method

        self._patch(it.GridExecutor, "_init_args_hst", wrap_init)
        self._patch(it.GridExecutor, "__call__", wrap_call)
        builder = it.InterpreterBuilder
        self._patch(builder, "create_masked_load", checked("load", (0, "ptrs"), (1, "mask")))
        self._patch(builder, "create_masked_store", checked("store", (0, "ptrs"), (2, "mask"), (1, "value")))
        for name in ("create_atomic_load", "create_atomic_store"):
            if hasattr(builder, name):
                self._patch(builder, name, atomic)
        if hasattr(builder, "create_atomic_rmw"):  # (rmwOp, ptr, val, mask, sem, scope)
            self._patch(builder, "create_atomic_rmw", checked("atomic", (1, "ptr"), (3, "mask")))
        if hasattr(builder, "create_atomic_cas"):  # (ptr, cmp, val, sem, scope): every lane
            self._patch(builder, "create_atomic_cas", checked("atomic_cas", (0, "ptr"), None))

    def _patch_interpreter_dot(self) -> None:
        """The interpreter takes a tl.dot of any shape (its minimum is 1 x 1 x 1), where a GPU's compiler refuses
        operands under its minimum (this Triton's NVIDIA rule: K at least 8 for float32, 16 for 16-bit types, 32 for
        8-bit ones): while a Capture is open the interpreter's dots are held to it, and DotTooSmall says which."""
        from triton.runtime import interpreter as it

        try:
            from triton.backends.nvidia.compiler import min_dot_size
        except Exception:  # no NVIDIA backend in this triton: left as the interpreter has it
            return
        builder = getattr(it, "interpreter_builder", None)
        if not isinstance(getattr(builder, "codegen_fns", None), dict) or "min_dot_size" not in builder.codegen_fns:
            return
        gpu_minimum, cap = min_dot_size(None), self

        def held_to_the_gpu(lhs_type, rhs_type):
            m, n, k = gpu_minimum(lhs_type, rhs_type)
            (rows, inner), cols = (int(getattr(d, "value", d)) for d in lhs_type.shape[-2:]), int(
                getattr(rhs_type.shape[-1], "value", rhs_type.shape[-1]))
            if rows < m or inner < k or cols < n:
                name = (cap._get("bounds") or ("kernel",))[0]
                raise DotTooSmall(f"{name}: a tl.dot of {lhs_type.scalar} [{rows}, {inner}] x [{inner}, {cols}]: a "
                                  f"GPU's Triton compiler refuses it (M >= {m}, N >= {n} and K >= {k} for "
                                  f"{lhs_type.scalar}), where the interpreter runs it; make the K block at least {k}")
            return 1, 1, 1

        self._patch(builder, "codegen_fns", lambda orig: {**orig, "min_dot_size": held_to_the_gpu})

    def _triton_run(self, orig, interpreted: bool):
        cap = self

        def run(jitfn, *args, grid, warmup, **kwargs):
            if interpreted:
                _refuse_host_arrays(jitfn, args, kwargs)
                name = getattr(getattr(jitfn, "fn", None), "__name__", None) or "kernel"
                grid = _tuple_grid(grid, name)
                if not cap._get("benchmarking", 0):  # an autotuner's benchmark on a GPU may skip a config that fails
                    _refuse_warps(name, kwargs.get("num_warps"))
            record = cap.recording and not warmup and not cap._get("benchmarking", 0)
            if not record:
                return orig(jitfn, *args, grid=grid, warmup=warmup, **kwargs)
            seen = {}
            if callable(grid):
                user_grid = grid

                def grid(meta):  # noqa: F811 - the same grid, remembered as it is resolved
                    seen["grid"] = user_grid(meta)
                    return seen["grid"]
            else:
                seen["grid"] = grid
            kernel = orig(jitfn, *args, grid=grid, warmup=warmup, **kwargs)
            compiled = None if interpreted else kernel
            md = getattr(compiled, "metadata", None)
            name = getattr(getattr(jitfn, "fn", None), "__name__", None) or getattr(jitfn, "__name__", "kernel")
            cap.launches.append(Launch(
                kernel=name, backend="triton", grid=_dims(seen.get("grid", (1,))),
                num_warps=getattr(md, "num_warps", None) or kwargs.get("num_warps", TRITON_DEFAULT_WARPS),
                num_stages=getattr(md, "num_stages", None) or kwargs.get("num_stages", TRITON_DEFAULT_STAGES),
                shared_dynamic=int(getattr(md, "shared", 0) or 0), interpreted=interpreted, compiled=compiled,
                autotuner=cap._get("autotuner"),
                meta=cap._meta(jitfn, args, kwargs),
                arg_bytes=arg_bytes([*args, *kwargs.values()]),
                layout=layout([*zip(getattr(jitfn, "arg_names", None) or [None] * len(args), args, strict=False),
                               *kwargs.items()], cap._constexprs[id(jitfn)][1]),
                loop_steps=cap._constexprs[id(jitfn)][2]))
            return kernel
        return run

    def _meta(self, jitfn, args, kwargs) -> dict:
        """A Triton launch's constexpr arguments (BLOCK sizes...), by position or by keyword, and its launch options
        (num_warps, the autotuner's config...): not its runtime arguments (an offset passed by keyword would tell
        apart launches that are alike, and keep a loop's launches from merging into one row)."""
        names = list(getattr(jitfn, "arg_names", None) or [])
        if id(jitfn) not in self._constexprs:  # the kernel kept beside its names: its id is not reused meanwhile
            const = _constexpr_names(jitfn)
            self._constexprs[id(jitfn)] = (jitfn, const, loop_steps(jitfn) & const)
        const = self._constexprs[id(jitfn)][1]
        meta = {n: v for n, v in zip(names, args, strict=False) if n in const and _plain(v)}
        meta.update({k: v for k, v in kwargs.items() if _plain(v) and k != "debug" and (k in const or k not in names)})
        return meta

    # --- Numba
    def _patch_numba(self) -> None:
        cap = self
        try:
            from numba.cuda import dispatcher

            kernel_cls = getattr(dispatcher, "_Kernel", None)
        except Exception:  # the simulator has no dispatcher module
            kernel_cls = None
        if kernel_cls is not None and hasattr(kernel_cls, "launch"):
            def wrap_launch(orig):
                def launch(kern, args, griddim, blockdim, stream=0, sharedmem=0):
                    py_func = getattr(kern, "py_func", None)
                    if py_func is not None and (said := mismatch(py_func, tuple(args), simulated=False)) is not None:
                        raise SignatureMismatch(said)  # a kernel of one signature would read the bytes as its types
                    if cap.recording:
                        name = getattr(py_func, "__name__", None) or getattr(kern, "entry_name", "kernel")
                        cap.launches.append(Launch(kernel=name, backend="numba", grid=_dims(griddim),
                                                   block=_dims(blockdim), shared_dynamic=int(sharedmem or 0),
                                                   compiled=kern, arg_bytes=arg_bytes(args),
                                                   layout=layout((None, a) for a in args)))
                    return orig(kern, args, griddim, blockdim, stream, sharedmem)
                return launch
            self._patch(kernel_cls, "launch", wrap_launch)
        disp_cls = getattr(dispatcher, "CUDADispatcher", None) if kernel_cls is not None else None
        if disp_cls is not None and hasattr(disp_cls, "compile"):
            def wrap_compile(orig):
                def compile(disp, sig):
                    # before compiling: a kernel whose static shared arrays no block holds fails in ptxas, many
                    # lines of it; said here in one line naming the arrays (device functions: counted in the kernel)
                    py_func = getattr(disp, "py_func", None)
                    if py_func is not None and not getattr(disp, "targetoptions", {}).get("device"):
                        name = getattr(py_func, "__name__", "kernel")
                        if (said := over_limit(name, py_func, 0, simulated=False)) is not None:
                            raise EmptyLaunch(said)
                    return orig(disp, sig)
                return compile
            self._patch(disp_cls, "compile", wrap_compile)
        sim = sys.modules.get("numba.cuda.simulator.kernel")
        if sim is not None and hasattr(sim, "FakeCUDAKernel"):
            def wrap_call(orig):
                def __call__(kern, *args):
                    top = not kern._device and not getattr(sim, "_kernel_context", None)
                    if top:
                        _refuse_empty_launch(getattr(kern.fn, "__name__", "kernel"), kern.grid_dim, kern.block_dim)
                        if (said := shaped_by_arguments(kern.fn) or over_limit(
                                getattr(kern.fn, "__name__", "kernel"), kern.fn, int(kern.dynshared_size or 0))):
                            raise EmptyLaunch(said)
                    if top and cap.recording:
                        cap.launches.append(Launch(kernel=getattr(kern.fn, "__name__", "kernel"), backend="numba",
                                                   grid=_dims(kern.grid_dim), block=_dims(kern.block_dim),
                                                   shared_dynamic=int(kern.dynshared_size or 0), interpreted=True,
                                                   arg_bytes=arg_bytes(args), layout=layout((None, a) for a in args)))
                    if top:  # torch tensors, which a GPU launch takes through __cuda_array_interface__
                        _refuse_bfloat16(kern.fn, args)
                        args = tuple(_numpy_view(a) for a in args)
                        if (said := mismatch(kern.fn, args)) is not None:
                            raise SignatureMismatch(said)
                    return orig(kern, *args)
                return __call__
            self._patch(sim.FakeCUDAKernel, "__call__", wrap_call)
            from gpuspeed.kernel import simulated_block

            simulated_block.patch(self._patch)  # barriers every thread reaches, shared memory free of races

            def wrap_forall(orig):
                def forall(kern, ntasks, tpb=0, stream=0, sharedmem=0):
                    # the simulator runs ntasks blocks of 1 thread; a GPU runs blocks of tpb, the last one padded
                    if isinstance(ntasks, int) and ntasks == 0:  # numba's ForAll launches nothing for no tasks
                        return lambda *args: None
                    if isinstance(tpb, int) and tpb > 0 and isinstance(ntasks, int) and ntasks > 0:
                        return kern[-(-ntasks // tpb), tpb, stream, sharedmem]
                    return orig(kern, ntasks, tpb, stream, sharedmem)
                return forall
            if hasattr(sim.FakeCUDAKernel, "forall"):
                self._patch(sim.FakeCUDAKernel, "forall", wrap_forall)


def _constexpr_names(jitfn) -> set[str]:
    """The tl.constexpr parameters of a Triton kernel: a JITFunction's own record of them, else (the interpreter's
    InterpretedFunction keeps none) its function's annotations (`tl.constexpr`, or the string under postponed
    annotations)."""
    params = getattr(jitfn, "params", None)
    if params:
        return {p.name for p in params if getattr(p, "is_constexpr", False)}
    import inspect

    try:
        signature = inspect.signature(getattr(jitfn, "fn", jitfn))
    except (TypeError, ValueError):
        return set()
    out = set()
    for p in signature.parameters.values():
        ann = p.annotation
        text = ann if isinstance(ann, str) else getattr(ann, "__name__", "")
        if ann is not p.empty and "constexpr" in text:
            out.add(p.name)
    return out


def _numpy_view(a):
    """A host torch tensor as a NumPy view of its memory (what the kernel writes lands in the tensor), for the Numba
    simulator, which takes NumPy arrays where a GPU launch takes any array with __cuda_array_interface__ (a torch
    tensor in the kernel would be indexed as a tensor: x.size a method, x[i] a tensor); anything else as it is."""
    if type(a).__module__.split(".")[0] != "torch" or not hasattr(a, "numpy") or getattr(a, "ndim", 0) == 0:
        return a
    try:
        return a.detach().numpy() if a.device.type == "cpu" else a
    except (TypeError, RuntimeError):  # a dtype NumPy lacks (bfloat16): left as it is
        return a


def _refuse_bfloat16(fn, args) -> None:
    """SignatureMismatch for a torch bfloat16 tensor handed to a simulated Numba kernel: NumPy has no bfloat16 to view
    it as, so the simulator would index the tensor itself and fail far from the cause. (Numba on a GPU is another
    matter: at db263c5 an H100's numba-cuda launched a kernel on one without an error.)"""
    import inspect

    for i, a in enumerate(args):
        if type(a).__module__.split(".")[0] == "torch" and str(getattr(a, "dtype", "")) == "torch.bfloat16":
            try:
                name = list(inspect.signature(fn).parameters)[i]
            except (TypeError, ValueError, IndexError):
                name = f"#{i}"
            raise SignatureMismatch(f"{getattr(fn, '__name__', 'kernel')}: argument {name} is a torch.bfloat16 tensor: a "
                                    "Numba CUDA kernel cannot be run on a bfloat16 array under the CUDA simulator (NumPy has no "
                                    "bfloat16 to hold it); pass it as float32 or float16 (x.float(), x.half()) to "
                                    "check the kernel here, or run it on a GPU")


class InterpretedLaunchError(Exception):
    """An interpreted Triton launch that would go wrong: kernel_report says it in one line (report.py)."""


class OutOfBounds(InterpretedLaunchError):
    """An interpreted Triton kernel's unmasked load or store reaches outside every tensor argument."""


class ProgramRace(InterpretedLaunchError):
    """Two programs of one interpreted Triton launch touch one element, one writing, with nothing ordering them."""


class DotTooSmall(InterpretedLaunchError):
    """An interpreted tl.dot on operands smaller than a GPU's Triton compiler takes."""


class NotATensor(InterpretedLaunchError):
    """A NumPy array handed to an interpreted Triton kernel (the interpreter fails on it with an AttributeError)."""


class SignatureMismatch(InterpretedLaunchError):
    """A Numba launch whose arguments fit none of its kernel's declared signatures (numba_signature): the simulator runs
    it, a GPU runs a kernel of one signature on the arguments' bytes read as the declared types."""


class EmptyLaunch(InterpretedLaunchError):
    """A Numba launch of no blocks or no threads under the CUDA simulator (which runs nothing), or of more threads a
    block, blocks in y / z or shared memory a block than any NVIDIA GPU takes (which it runs), which a GPU refuses;
    on a GPU, a kernel whose static shared arrays no block holds, refused before ptxas fails on it."""


MAX_BLOCK_THREADS, MAX_BLOCK_Z, MAX_GRID_YZ = 1024, 64, 65535  # every compute capability's launch limits


def _refuse_empty_launch(kernel: str, grid, block) -> None:
    """EmptyLaunch when a simulated Numba launch has a grid or block dimension below 1 (the simulator runs no thread
    and returns), or a block or grid past the launch limits (the simulator runs it): a GPU fails the launch
    (cuLaunchKernel: CUDA_ERROR_INVALID_VALUE). Triton launches a grid of no programs as nothing, on a GPU as in its
    interpreter: not refused."""
    try:
        g, b = _dims(grid), _dims(block)
    except (TypeError, ValueError):  # a configuration the simulator itself will refuse
        return
    if min(g) < 1 or min(b) < 1:
        raise EmptyLaunch(f"{kernel}: launched with grid {tuple(g)} and block {tuple(b)}: a GPU refuses a launch of no "
                          "blocks or no threads (CUDA_ERROR_INVALID_VALUE), where the CUDA simulator runs nothing; an "
                          "empty input makes such a grid: return before launching when there is nothing to do")
    threads = b[0] * b[1] * b[2]
    if threads > MAX_BLOCK_THREADS or b[2] > MAX_BLOCK_Z or max(g[1], g[2]) > MAX_GRID_YZ:
        what = (f"a block of {threads} threads (at most {MAX_BLOCK_THREADS}, z at most {MAX_BLOCK_Z})"
                if threads > MAX_BLOCK_THREADS or b[2] > MAX_BLOCK_Z else f"a grid's y or z over {MAX_GRID_YZ} blocks")
        raise EmptyLaunch(f"{kernel}: launched with grid {tuple(g)} and block {tuple(b)}: a GPU refuses {what} "
                          "(CUDA_ERROR_INVALID_VALUE), where the CUDA simulator runs it")


def _tuple_grid(grid, kernel: str = "kernel"):
    """A grid given as a list (or a grid function returning one) as a tuple: a GPU launch indexes the grid, the
    interpreter adds a tuple to it and fails on a list. A grid past 65535 in y or z, which a GPU refuses and the
    interpreter runs, raises EmptyLaunch."""
    if callable(grid):
        user_grid = grid
        return lambda meta: _tuple_grid(user_grid(meta), kernel)
    grid = tuple(grid) if isinstance(grid, list) else grid
    if isinstance(grid, tuple) and any(isinstance(d, int) and d > MAX_GRID_YZ for d in grid[1:3]):
        raise EmptyLaunch(f"{kernel}: launched with grid {tuple(grid) + (1,) * (3 - len(grid))}: a GPU refuses a grid's "
                          f"y or z over {MAX_GRID_YZ} programs (CUDA_ERROR_INVALID_VALUE), where the interpreter runs "
                          "it; put the long dimension on grid x (tl.program_id(0))")
    return grid


def _refuse_warps(kernel: str, num_warps) -> None:
    """EmptyLaunch for an interpreted Triton launch whose num_warps a GPU refuses and the interpreter ignores: not a
    power of 2 (Triton's compiler asserts it), or more than 1024 threads a block (32 warps)."""
    if not isinstance(num_warps, int) or isinstance(num_warps, bool):
        return
    if num_warps < 1 or num_warps & (num_warps - 1):
        raise EmptyLaunch(f"{kernel}: launched with num_warps={num_warps}: a GPU refuses it (Triton's compiler: "
                          "'num_warps must be a power of 2'), where the interpreter ignores it; use 1, 2, 4, 8, 16 or 32")
    if num_warps * 32 > MAX_BLOCK_THREADS:
        raise EmptyLaunch(f"{kernel}: launched with num_warps={num_warps}, a block of {num_warps * 32} threads: a GPU "
                          f"refuses more than {MAX_BLOCK_THREADS} threads a block (num_warps=32), where the interpreter "
                          "runs it")


def _refuse_host_arrays(jitfn, args, kwargs) -> None:
    """NotATensor, naming the kernel and the argument, when a NumPy array is among an interpreted launch's arguments."""
    import numpy as np

    names = list(getattr(jitfn, "arg_names", None) or [])
    given = [(names[i] if i < len(names) else f"#{i}", v) for i, v in enumerate(args)] + list(kwargs.items())
    for arg, v in given:
        if isinstance(v, np.ndarray) and v.ndim > 0:  # a 0-d array passes as a scalar
            kernel = getattr(getattr(jitfn, "fn", None), "__name__", None) or getattr(jitfn, "__name__", "kernel")
            raise NotATensor(f"{kernel}: argument {arg} is a NumPy array: Triton kernels take torch tensors for "
                             "pointer arguments (torch.from_numpy(a), moved with .cuda() on a GPU)")


def _storage_ranges(host_args) -> tuple:
    """(starts, ends) of the storages of the torch tensors among an interpreted launch's host arguments (tuples
    and tensor descriptors looked into), sorted by start."""
    import numpy as np

    ranges: dict[int, int] = {}

    def visit(a, depth=0):
        if depth > 4:
            return
        if isinstance(a, (tuple, list)):
            for v in a:
                visit(v, depth + 1)
        elif isinstance(a, dict):
            for v in a.values():
                visit(v, depth + 1)
        elif hasattr(a, "untyped_storage"):
            st = a.untyped_storage()
            ranges[int(st.data_ptr())] = int(st.data_ptr()) + int(st.nbytes())
        elif hasattr(a, "base") and hasattr(a, "block_shape"):  # a TensorDescriptor
            visit(a.base, depth + 1)

    visit(host_args)
    starts = np.array(sorted(ranges), dtype=np.uint64)
    return starts, np.array([ranges[int(s)] for s in starts], dtype=np.uint64)


def _check_bounds(bounds, op: str, builder, ptrs, mask, np_dtype) -> None:
    """Raise OutOfBounds when a live lane of `ptrs` (a TensorHandle of addresses; `mask` a TensorHandle or None)
    reaches past the storages in `bounds` (the launch's kernel name, _storage_ranges)."""
    import numpy as np

    name, (starts, ends) = bounds
    data = getattr(ptrs, "data", None)
    if not isinstance(data, np.ndarray) or data.dtype.kind not in "iu":
        return
    try:
        size = np.dtype(np_dtype(ptrs.get_element_ty())).itemsize
    except Exception:  # a pointer type the interpreter's table lacks: its addresses alone are checked
        size = 1
    addrs = data.astype(np.uint64)
    if mask is not None and getattr(mask, "data", None) is not None:
        live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
        addrs = addrs[live]
    addrs = addrs.reshape(-1)
    if addrs.size == 0:
        return
    at = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    ok = at >= 0
    ok[ok] = addrs[ok] + np.uint64(size) <= ends[at[ok]]
    bad = int((~ok).sum())
    if bad:
        pid = tuple(getattr(builder, "grid_idx", None) or ())
        where = "read past its arrays" if op == "load" else "write past its arrays"
        raise OutOfBounds(f"{name}: a tl.{op} at program_id {pid} reaches {bad} element(s) outside every tensor "
                          f"argument (a missing or wrong mask, e.g. mask=offs < n): on a GPU it would {where} or "
                          "fault")


def _run_once(fn, quantiles=None, **_):
    """The interpreter's stand-in for the autotuner's benchmark: one correctness run, no time."""
    fn()
    return [0.0] * len(quantiles) if quantiles else 0.0


def _interpreted(tuner) -> bool:
    """Whether an autotuner's kernel (under any heuristics wrappers) is an interpreted one."""
    fn, depth = getattr(tuner, "fn", None), 0
    while fn is not None and depth < 8:
        if type(fn).__name__ == "InterpretedFunction":
            return True
        fn, depth = getattr(fn, "fn", None), depth + 1
    return False


def interpreting_triton() -> bool:
    """Whether @triton.jit makes interpreted kernels now (TRITON_INTERPRET=1)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # an older triton without knobs reads the environment
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def simulating_numba() -> bool:
    """Whether numba.cuda is the CUDA simulator in this process."""
    mod = sys.modules.get("numba.cuda")
    if mod is not None:
        return bool(getattr(mod, "simulator", None)) and "simulator" in getattr(mod.jit, "__module__", "")
    import os

    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
