"""A block of the Numba CUDA simulator held to what a GPU's block guarantees, while a Capture is open.

The simulator runs a block's threads as Python threads: a thread that calls cuda.syncthreads() waits until every
thread still alive waits too, so a barrier only some threads reach (inside `if tid < k:`, after an early return)
lets the others through, where a GPU hangs or computes a wrong answer; and its threads take turns in an order that
hides most data races on shared memory. Here:
- barriers: a block's threads are scheduled by events (no polling), and a barrier is released only when every
  thread of the block waits at the same cuda.syncthreads(); otherwise BarrierDivergence names the line.
- shared memory holds garbage when a block starts, as on a GPU (the simulator's arrays start as np.empty, often
  zeros, then keep the last block's values, or zeros for the dynamic buffer): each block's start fills them with
  0xFF bytes (NaN for floats, -1 for integers), so a kernel that reads what it never wrote gives a wrong answer here
  too; so does each cuda.local.array. cuda.shared.array hands out arrays that note, per element and per barrier
  interval, which thread read, wrote or updated it atomically; two threads touching one element between two
  barriers, one of them writing (atomics among themselves excepted; stores of one value too), raise
  SharedMemoryRace naming the array and the lines.
- array arguments (global memory): the same record a launch, where threads of two blocks are never ordered (unless
  the launch orders its blocks itself, through global atomics or cuda.threadfence()): `out[0] += x[i]` from many
  threads, which the simulator sums right one thread at a time, raises GlobalMemoryRace.
"""

from __future__ import annotations

import itertools
import linecache
import os
import re
import sys
import threading

import numpy as np

from gpuspeed.kernel.capture import InterpretedLaunchError

_INTERVALS = itertools.count()  # barrier intervals, numbered across blocks and launches: a launch's shared arrays
# outlive its blocks, so an interval numbered per block would meet the last block's same-numbered one
MANY = -1  # more than one thread read (or updated atomically) an element in this interval
_ATOMICS = ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax", "nanmin",
            "compare_and_swap", "cas")


class BarrierDivergence(InterpretedLaunchError):
    """A simulated cuda.syncthreads() that not every thread of the block reaches."""


class SharedMemoryRace(InterpretedLaunchError):
    """Two threads of a simulated block touching one shared element between two barriers, at least one writing."""


class GlobalMemoryRace(InterpretedLaunchError):
    """Two threads of a simulated launch touching one element of an array argument with nothing ordering them (one
    block, no barrier between; or two blocks), at least one writing."""


def _thread_name(block_dim, tid: int) -> str:
    bx, by, bz = (list(block_dim) + [1, 1])[:3]
    if by * bz == 1:
        return f"thread {tid}"
    return f"thread ({tid % bx}, {tid // bx % by}, {tid // (bx * by)})"


class _Block:
    """One simulated block under way: its barrier, its interval count, what stopped it."""

    def __init__(self, kernel: str, block_dim, size: int):
        self.kernel, self.block_dim, self.size = kernel, block_dim, size
        self.lock = threading.Lock()
        self.waiting: dict = {}  # thread -> (file, line, function) of the barrier it waits at
        self.live = size
        self.exited: list = []
        self.interval = next(_INTERVALS)  # the interval under way
        self.threads: list = []
        self.refusal: BaseException | None = None  # our one-line refusal, or the first thread's own failure
        self.failed = None
        self.serial = next(_INTERVALS)  # tells this block's threads from other blocks' in the launch's record
        self.launch: dict = {}  # the launch's record of its array arguments' elements (_note_global)

    def stop(self) -> None:
        """Wake every thread with its abort flag set (the simulator's own way out of a failing block)."""
        for t in self.threads:
            t.abort = True
            t.syncthreads_event.set()

    def release_if_all_wait(self) -> None:
        """Called under the lock: when every live thread waits, let them through, or refuse a barrier that is not
        every thread's."""
        if not self.waiting or len(self.waiting) < self.live or self.refusal is not None:
            return
        sites = {}
        for t, site in self.waiting.items():
            sites.setdefault(site, []).append(t.thread_id)
        if len(sites) > 1 or self.exited:
            self.refusal = BarrierDivergence(self._divergence(sites))
            self.stop()
            return
        self.interval = next(_INTERVALS)
        for t in self.waiting:
            t.syncthreads_event.set()
        self.waiting = {}

    def _divergence(self, sites: dict) -> str:
        (file, line, function), waiters = max(sites.items(), key=lambda kv: len(kv[1]))
        where = f"line {line}" + (f" (in {function})" if function != self.kernel else "")
        others = []
        for (_, other_line, other_function), ids in sites.items():
            if other_line != line or other_function != function:
                others.append(f"{_some(self.block_dim, ids)} wait at line {other_line}"
                              + (f" (in {other_function})" if other_function != self.kernel else ""))
        if self.exited:
            others.append(f"{_some(self.block_dim, sorted(t.thread_id for t in self.exited))} returned without "
                          "reaching it")
        return (f"{self.kernel}: cuda.syncthreads() at {where} is reached by only some threads of a block "
                f"({_some(self.block_dim, sorted(waiters))} wait there; {'; '.join(others)}): on a GPU that is "
                "undefined (a hang or a wrong answer), where the CUDA simulator lets the waiting threads through; "
                "make every thread of the block reach every barrier (take it out of the `if`, and do not return "
                "before it)")


def _some(block_dim, ids) -> str:
    ids = sorted(ids)
    named = ", ".join(_thread_name(block_dim, i).removeprefix("thread ") for i in ids[:3])
    return f"thread{'s' if len(ids) > 1 else ''} {named}" + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


_SIMULATOR_DIR = ""  # the simulator package's folder, set by patch()


def _user_frame(frame):
    """The first frame outside the simulator's own modules (the kernel's line that called into it)."""
    while frame is not None and frame.f_code.co_filename.startswith(_SIMULATOR_DIR):
        frame = frame.f_back
    return frame


def _syncthreads(orig):
    def syncthreads(thread):
        block = getattr(thread, "_gs_block", None)
        if block is None:  # a block run outside our scheduler
            return orig(thread)
        if thread.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        frame = _user_frame(sys._getframe(1))
        site = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name) if frame else ("?", 0, "?")
        with block.lock:
            block.waiting[thread] = site
            block.release_if_all_wait()
        thread.syncthreads_event.wait()
        thread.syncthreads_event.clear()
        if thread.abort:
            raise RuntimeError("abort flag set on syncthreads clear")
    return syncthreads


def _garbage(array) -> None:
    """Fill a shared allocation as a GPU's block finds it: bytes it never wrote (0xFF: NaN, -1)."""
    np.asarray(array).reshape(-1).view(np.uint8).fill(0xFF)


def _run(sim):
    def run(manager, grid_point, *args):
        """BlockManager.run: the block's shared memory made garbage, its threads started, waited for, and their first
        failure raised."""
        shared = getattr(getattr(sim, "_kernel_context", None), "_shared", None)
        if shared is not None:
            for allocation in getattr(shared, "_allocations", {}).values():
                _garbage(allocation)
            if getattr(shared, "_dynshared", None) is not None:
                _garbage(shared._dynshared)
        f = manager._f
        block = _Block(getattr(f, "__name__", "kernel"), tuple(manager._block_dim), 0)
        context = getattr(sim, "_kernel_context", None)
        if context is not None:  # one record a launch, kept on the simulator's per-launch module
            if not hasattr(context, "_gs_launch"):
                context._gs_launch = {"elements": {}, "ordered": False, "names": _argument_names(f, args)}
            block.launch = context._gs_launch

        def target():
            me = threading.current_thread()
            try:
                f(*args)
            except BaseException as e:
                with block.lock:
                    if block.failed is None and block.refusal is None:
                        block.failed = me
                        if isinstance(e, InterpretedLaunchError):
                            block.refusal = e
                    block.stop()
                raise
            with block.lock:
                block.live -= 1
                block.exited.append(me)
                block.release_if_all_wait()

        for block_point in np.ndindex(*manager._block_dim):
            t = sim.BlockThread(target, manager, grid_point, block_point, manager._debug)
            t._gs_block = block
            block.threads.append(t)
        block.size = block.live = len(block.threads)
        for t in block.threads:
            t.start()
        for t in block.threads:
            t.join()
        if block.refusal is not None:
            raise block.refusal
        first = block.failed or next((t for t in block.threads if t.exception), None)
        if first is not None and first.exception:
            raise first.exception[0].with_traceback(first.exception[1])
    return run


# --- shared memory


class _Tracker:
    """The accesses to one shared allocation, by byte offset: [interval, writer, its line, reader, its line,
    atomic updater, its line] for the interval each element was last touched in."""

    def __init__(self, base: int):
        self.base = base
        self.state: dict = {}


_SLOT = {"write": 1, "read": 3, "atomic": 5}  # where an access of each kind is noted in a _Tracker state


class TrackedShared(np.ndarray):
    """A simulated shared array that notes each element read and written through an index of integers (a slice
    gives a tracked view; fancy indexing is left unchecked)."""

    _gs = None  # (tracker, the array's name, its byte offset in the allocation)

    def __array_finalize__(self, obj):
        gs = getattr(obj, "_gs", None)
        if gs is not None:
            tracker, name, _ = gs
            self._gs = (tracker, name, self.__array_interface__["data"][0] - tracker.base)

    def __getitem__(self, index):
        value = super().__getitem__(index)
        if self._gs is not None:
            _note(self, index, "read")
        return value

    def __setitem__(self, index, value):
        if self._gs is not None:
            _note(self, index, "write", value)
        super().__setitem__(index, value)


def _offset(array, index):
    """The byte offset of the element an all-integer index names, else None."""
    shape, strides = array.shape, array.strides
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) != len(shape):
        return None
    offset = 0
    for i, n, s in zip(index, shape, strides, strict=False):
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            return None
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            return None  # NumPy raises its IndexError
        offset += i * s
    return offset


def _same_value(array, index, value) -> bool:
    """Whether storing value at index leaves the element as it is (threads storing one flag value: no race)."""
    try:
        return bool(np.ndarray.__getitem__(array, index) == np.asarray(value, dtype=array.dtype))
    except Exception:  # a value that does not cast to the element's type: compared as different
        return False


def _access_site(thread, kind: str) -> tuple[str, int]:
    """The access's kind and the user's source line: inside a simulated atomic, the atomic's own line and kind."""
    atomic_line = getattr(thread, "_gs_atomic", 0)
    if atomic_line:
        return "atomic", atomic_line
    frame = _user_frame(sys._getframe(3))  # past this helper and the _note* function that called it
    return kind, (frame.f_lineno if frame is not None else 0)


def _note(array, index, kind: str, value=None) -> None:
    thread = threading.current_thread()
    block = getattr(thread, "_gs_block", None)
    if block is None:
        return
    offset = _offset(array, index)
    if offset is None:
        return
    tracker, name, base = array._gs
    kind, line = _access_site(thread, kind)
    key, me = base + offset, thread.thread_id
    state = tracker.state.get(key)
    if state is None or state[0] != block.interval:
        state = tracker.state[key] = [block.interval, None, 0, None, 0, None, 0]
    if kind == "write":
        clash = next(((w, what) for w, what in ((1, "writes"), (3, "reads"), (5, "updates atomically"))
                      if state[w] is not None and state[w] != me
                      and not (w == 1 and _same_value(array, index, value))), None)
    elif kind == "read":
        clash = next(((w, what) for w, what in ((1, "writes"), (5, "updates atomically"))
                      if state[w] is not None and state[w] != me), None)
    else:
        clash = next(((w, what) for w, what in ((1, "writes"), (3, "reads"))
                      if state[w] is not None and state[w] != me), None)
    if clash is not None:
        slot, what = clash
        element = _element(name, index, base, offset, array.itemsize)
        raise SharedMemoryRace(_race(block, name, element, me, kind, line, state[slot], what, state[slot + 1]))
    slot = _SLOT[kind]
    if kind == "write" and state[slot] not in (None, me):
        return  # the same value stored again by another thread: the first writer stays the one noted
    if kind == "write" or state[slot] is None:
        state[slot], state[slot + 1] = me, line
    elif state[slot] != me:
        state[slot] = MANY


def _element(name: str, index, base: int, offset: int, itemsize: int) -> str:
    """The element as the kernel indexed it, or (through a view: a slice, a row) as a flat index of the allocation."""
    if base:
        return f"{name}[{(base + offset) // itemsize}]"
    return f"{name}[{', '.join(str(int(i)) for i in (index if isinstance(index, tuple) else (index,)))}]"


def _race(block, name, element, me, kind, line, other, other_what, other_line) -> str:
    doing = {"read": "reads", "write": "writes", "atomic": "updates atomically"}[kind]
    who = "another thread" if other == MANY else _thread_name(block.block_dim, other)
    return (f"{block.kernel}: a data race on shared array {name}: {_thread_name(block.block_dim, me)} {doing} "
            f"{element} at line {line} and {who} {other_what} it at line {other_line}, with no cuda.syncthreads() "
            "between them: on a GPU the result depends on the order the threads run in (the CUDA simulator runs "
            "them in one order that hides it); put a cuda.syncthreads() between the write and the other access")


_ALLOCATING = threading.Lock()  # held while a shared allocation is made (linecache may read a file: threads switch)
_NAMED = re.compile(r"(\w+)\s*=\s*[\w.]*shared\.array\(")


def _array_name(frame) -> str:
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno) if frame is not None else ""
    found = _NAMED.search(line)
    return found.group(1) if found else "?"


def _shared_array(orig):
    def array(shared, shape, dtype):
        """FakeCUDAShared.array: the same allocations (one per line, the dynamic buffer shared by all), tracked."""
        from numba.core import types
        from numba.np import numpy_support

        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        if shape == 0:  # the dynamic shared memory, one byte buffer seen through any dtype
            with _ALLOCATING:
                if not hasattr(shared, "_gs_dynamic"):
                    shared._gs_dynamic = _Tracker(shared._dynshared.__array_interface__["data"][0])
            count = shared._dynshared_size // np.dtype(dtype).itemsize
            plain = np.frombuffer(shared._dynshared.data, dtype=dtype, count=count)
            tracked = plain.view(TrackedShared)
            tracked._gs = (shared._gs_dynamic, _array_name(frame), 0)
            return tracked
        caller = (frame.f_code.co_filename, frame.f_lineno)
        tracked = shared._allocations.get(caller)
        if tracked is None:
            with _ALLOCATING:  # the block's threads arrive together: one allocation for all of them
                tracked = shared._allocations.get(caller)
                if tracked is None:
                    plain = np.empty(shape, dtype)
                    _garbage(plain)
                    tracked = plain.view(TrackedShared)
                    tracked._gs = (_Tracker(plain.__array_interface__["data"][0]), _array_name(frame), 0)
                    shared._allocations[caller] = tracked
        return tracked
    return array


def _argument_names(f, args) -> list:
    """[(start, end, name)] of the byte ranges of a launch's array arguments, named as the kernel names them."""
    import inspect

    try:
        names = list(inspect.signature(f).parameters)
    except (TypeError, ValueError):
        names = []
    ranges = []
    for i, a in enumerate(args):
        ary = getattr(getattr(a, "__dict__", {}).get("_item"), "_ary", None)
        if isinstance(ary, np.ndarray) and ary.size:
            start = ary.__array_interface__["data"][0]
            lo = start + sum(min(0, (n - 1) * st) for n, st in zip(ary.shape, ary.strides, strict=False))
            hi = start + sum(max(0, (n - 1) * st) for n, st in zip(ary.shape, ary.strides, strict=False))
            ranges.append((lo, hi + ary.itemsize, names[i] if i < len(names) else f"argument {i}"))
    return ranges


def _global_name(launch: dict, key: int) -> str:
    return next((name for lo, hi, name in launch["names"] if lo <= key < hi), "an array argument")


_GLOBAL_SLOT = {"write": 0, "read": 1, "atomic": 2}
_AGAINST = {"write": (0, 1, 2), "read": (0, 2), "atomic": (0, 1)}  # the slots an access of each kind may race with


def _note_global(fake, index, kind: str, value=None) -> None:
    """Note one access to an element of a launch's array argument; GlobalMemoryRace where another thread touched it
    with nothing ordering the two (same block and barrier interval; or another block, unless the launch orders its
    blocks itself through atomics on global memory or cuda.threadfence()), at least one of them writing."""
    thread = threading.current_thread()
    block = getattr(thread, "_gs_block", None)
    if block is None or not block.launch:
        return
    item = fake.__dict__.get("_item")
    ary = getattr(item, "_ary", None)
    if not isinstance(ary, np.ndarray) or ary.dtype.fields is not None:
        return
    offset = _offset(ary, index)
    if offset is None:
        return
    kind, line = _access_site(thread, kind)
    launch = block.launch
    start = item.__dict__.get("_gs_start")
    if start is None:  # kept on the simulator's array: reading __array_interface__ each access costs a dict
        start = item.__dict__["_gs_start"] = ary.__array_interface__["data"][0]
    key = start + offset
    me = (block.serial, thread.thread_id, block.interval, line)
    state = launch["elements"].get(key)
    if state is None:  # the last writer, reader, atomic updater
        state = launch["elements"][key] = [None, None, None]
        state[_GLOBAL_SLOT[kind]] = me
        return
    for slot in _AGAINST[kind]:
        other = state[slot]
        if other is None or other[:2] == me[:2]:
            continue
        unordered = other[2] == me[2] if other[0] == me[0] else not launch["ordered"]
        if not unordered or (slot == 0 and kind == "write" and _same_value(ary, index, value)):
            continue
        raise GlobalMemoryRace(_global_race(block, launch, key, index, me, kind, other, slot))
    state[_GLOBAL_SLOT[kind]] = me


def _global_race(block, launch, key, index, me, kind, other, slot) -> str:
    name = _global_name(launch, key)
    element = f"{name}[{', '.join(str(int(i)) for i in (index if isinstance(index, tuple) else (index,)))}]"
    doing = {"read": "reads", "write": "writes", "atomic": "updates atomically"}
    what = ("writes", "reads", "updates atomically")[slot]
    mine = _thread_name(block.block_dim, me[1])
    theirs = _thread_name(block.block_dim, other[1]) + ("" if other[0] == me[0] else " of another block")
    fix = ("use a cuda.atomic op (cuda.atomic.add) where many threads update one element, or write the result into "
           "an array the kernel does not read" if "reads" in (doing[kind], what) else
           "give each thread its own element, or use a cuda.atomic op")
    return (f"{block.kernel}: a data race on {name}: {mine} {doing[kind]} {element} at line {me[3]} and {theirs} "
            f"{what} it at line {other[3]}, with nothing ordering them: on a GPU the result depends on the order the "
            f"threads run in (the CUDA simulator runs them in one order that hides it); {fix}")


def _fence(orig):
    def threadfence(module):
        block = getattr(threading.current_thread(), "_gs_block", None)
        if block is not None and block.launch:
            block.launch["ordered"] = True  # the blocks order their global memory themselves (the last-block idiom)
        return orig(module)
    return threadfence


def _global_get(orig):
    def __getitem__(fake, index):
        value = orig(fake, index)
        _note_global(fake, index, "read")
        return value
    return __getitem__


def _global_set(orig):
    def __setitem__(fake, index, value):
        _note_global(fake, index, "write", value)
        return orig(fake, index, value)
    return __setitem__


def _local_array(orig):
    def array(local, shape, dtype):
        """FakeCUDALocal.array: a fresh array holding garbage, as a GPU thread's local memory does (np.empty held
        whatever NumPy's allocator gave back: often zeros, so a sum never zeroed could pass)."""
        fresh = orig(local, shape, dtype)
        _garbage(fresh)
        return fresh
    return array


def _atomic(orig):
    def atomic(self, array, *args):
        thread = threading.current_thread()
        frame = _user_frame(sys._getframe(1))
        outer = getattr(thread, "_gs_atomic", 0)
        thread._gs_atomic = frame.f_lineno if frame is not None else -1
        if not isinstance(array, TrackedShared) and getattr(thread, "_gs_block", None) is not None:
            thread._gs_block.launch["ordered"] = True  # blocks may hand work over through atomics (a ticket)
        try:
            return orig(self, array, *args)
        finally:
            thread._gs_atomic = outer
    return atomic


def patch(patch_method) -> None:
    """Hold the simulator's blocks to a GPU's rules; `patch_method(owner, name, make)` is Capture._patch (undone
    when the Capture closes)."""
    from numba.cuda.simulator import kernel as sim
    from numba.cuda.simulator import kernelapi as api

    if not all(hasattr(sim, n) for n in ("BlockManager", "BlockThread")) or not hasattr(api, "FakeCUDAShared"):
        return  # another simulator layout: left as it is
    global _SIMULATOR_DIR
    _SIMULATOR_DIR = os.path.join(os.path.dirname(os.path.abspath(sim.__file__)), "")
    patch_method(sim.BlockThread, "syncthreads", _syncthreads)
    patch_method(sim.BlockManager, "run", lambda orig: _run(sim))
    patch_method(api.FakeCUDAShared, "array", _shared_array)
    from numba.cuda.simulator.cudadrv import devicearray

    within = getattr(devicearray, "FakeWithinKernelCUDAArray", None)
    if within is not None:
        patch_method(within, "__getitem__", _global_get)
        patch_method(within, "__setitem__", _global_set)
    if hasattr(api.FakeCUDAModule, "threadfence"):
        patch_method(api.FakeCUDAModule, "threadfence", _fence)
    if hasattr(api, "FakeCUDALocal"):
        patch_method(api.FakeCUDALocal, "array", _local_array)
    for name in _ATOMICS:
        if hasattr(api.FakeCUDAAtomic, name):
            patch_method(api.FakeCUDAAtomic, name, _atomic)
