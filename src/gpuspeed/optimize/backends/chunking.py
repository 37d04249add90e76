"""Run a candidate chunk by chunk along a batch axis, so a workload larger than the memory budget fits.

On CuPy and torch the chunks are pipelined over two streams: each batch argument's chunk is staged in
a pinned host buffer and copied in asynchronously, computed on that stream, and its output copied back
asynchronously into pinned memory, so one chunk's H2D, another's compute and a third's D2H overlap.
Other backends run the chunks one after another. Self-contained (emit.py pastes it into the script).
"""

import numpy as np

from gpuspeed.optimize.backends.common import Impl, leaves, take, tree_map


def _bounds(n, chunk):
    return [(s, min(n, s + chunk)) for s in range(0, n, chunk)]


def _merge(args, batch_axes, static, batched):
    out = []
    si = iter(static)
    bi = iter(batched)
    for i in range(len(args)):
        out.append(next(bi) if i in batch_axes else next(si))
    return tuple(out)


def _length(args, batch_axes):
    i, ax = next(iter(batch_axes.items()))
    return args[i].shape[ax]


def _out_shape(leaf_shape, axis, n):
    shape = list(leaf_shape)
    shape[axis] = n
    return tuple(shape)


def chunked(impl, batch_axes, out_axes, chunk, library=None):
    """An Impl taking host arguments and returning host outputs, computed `chunk` items at a time along
    batch_axes {arg index: axis}; output leaf j is assembled along out_axes[j]. library: 'cupy' or
    'torch' for the two-stream pipeline, else chunks run one after another."""
    batch_axes = {int(k): int(v) for k, v in batch_axes.items()}
    chunk = max(1, int(chunk))

    def serial(*args):
        n = _length(args, batch_axes)
        pieces = []
        for start, stop in _bounds(n, chunk):
            sub = tuple(take(a, batch_axes[i], start, stop) if i in batch_axes else a for i, a in enumerate(args))
            pieces.append(impl(*sub))
        first = leaves(pieces[0])
        cat = [np.concatenate([np.asarray(leaves(p)[j]) for p in pieces], axis=out_axes[j]) for j in range(len(first))]
        it = iter(cat)
        return tree_map(lambda _: next(it), pieces[0])

    if library == "cupy":
        run = _pipeline_cupy(impl, batch_axes, out_axes, chunk)
    elif library == "torch":
        run = _pipeline_torch(impl, batch_axes, out_axes, chunk)
    else:
        run = serial
    return Impl(run, None, lambda out: out, device=impl.device, sync=impl.sync,
                label=f"{impl.label}, chunked by {chunk}" + (" over two streams" if library else ""), notes=impl.notes)


def _pipeline_cupy(impl, batch_axes, out_axes, chunk):
    import cupy as cp
    import cupyx

    # the same two streams on every call: CuPy caches freed blocks per stream, so new streams each call
    # would strand the old streams' blocks and cudaMalloc afresh
    kept = []

    def run(*args):
        n = _length(args, batch_axes)
        static = impl.prepare(tuple(a for i, a in enumerate(args) if i not in batch_axes))
        cp.cuda.get_current_stream().synchronize()  # static arguments are in place before the side streams read them
        if not kept:
            kept.extend(cp.cuda.Stream(non_blocking=True) for _ in range(2))
        streams = kept
        stage_in = [[cupyx.empty_pinned(take(args[i], ax, 0, chunk).shape, args[i].dtype) for i, ax in
                     batch_axes.items()] for _ in range(2)]
        stage_out = [None, None]
        pending = [None, None]  # (start, stop) whose output sits in stage_out[slot]
        final = None
        structure = None
        for k, (start, stop) in enumerate(_bounds(n, chunk)):
            slot, s = k % 2, streams[k % 2]
            s.synchronize()
            if pending[slot] is not None:
                _land(final, stage_out[slot], pending[slot], out_axes)
            batched = []
            with s:  # blocks allocated on s go back to s's pool: reused only after s's earlier work
                for j, (i, ax) in enumerate(batch_axes.items()):
                    part = take(args[i], ax, start, stop)
                    view = stage_in[slot][j][tuple(slice(0, d) for d in part.shape)]
                    np.copyto(view, part)
                    dev = cp.empty(part.shape, part.dtype)
                    dev.set(view, stream=s)
                    batched.append(dev)
                dev_args = impl.prepare(_merge(args, batch_axes, static, batched))
                out = impl.run(*dev_args)
                outs = [cp.asarray(x) for x in leaves(out)]
                if final is None:
                    structure = out
                    final = [np.empty(_out_shape(o.shape, out_axes[j], n), dtype=o.dtype) for j, o in enumerate(outs)]
                if stage_out[slot] is None:
                    stage_out[slot] = [cupyx.empty_pinned(_out_shape(o.shape, out_axes[j], chunk), o.dtype)
                                       for j, o in enumerate(outs)]
                for j, o in enumerate(outs):
                    view = take(stage_out[slot][j], out_axes[j], 0, stop - start)
                    o.get(stream=s, out=view)
            pending[slot] = (start, stop)
        for slot in range(2):
            streams[slot].synchronize()
            if pending[slot] is not None:
                _land(final, stage_out[slot], pending[slot], out_axes)
        it = iter(final)
        return impl.fetch(tree_map(lambda _: next(it), structure))  # fetch casts a demoted output back

    return run


def _pipeline_torch(impl, batch_axes, out_axes, chunk):
    import torch

    kept = []  # the same two streams on every call: torch's allocator caches freed blocks per stream

    def run(*args):
        n = _length(args, batch_axes)
        static = impl.prepare(tuple(a for i, a in enumerate(args) if i not in batch_axes))
        if not kept:
            kept.extend(torch.cuda.Stream() for _ in range(2))
        streams = kept
        stage_in = [[torch.from_numpy(np.ascontiguousarray(take(args[i], ax, 0, chunk))).pin_memory()
                     for i, ax in batch_axes.items()] for _ in range(2)]
        stage_out = [None, None]
        pending = [None, None]
        final = None
        structure = None
        torch.cuda.current_stream().synchronize()  # static arguments are in place before the side streams read them
        for k, (start, stop) in enumerate(_bounds(n, chunk)):
            slot, s = k % 2, streams[k % 2]
            s.synchronize()
            if pending[slot] is not None:
                _land(final, [t.numpy() for t in stage_out[slot]], pending[slot], out_axes)
            batched = []
            with torch.cuda.stream(s):
                for j, (i, ax) in enumerate(batch_axes.items()):
                    part = take(args[i], ax, start, stop)
                    view = stage_in[slot][j][tuple(slice(0, d) for d in part.shape)]
                    view.numpy()[...] = part
                    batched.append(view.to("cuda", non_blocking=True))
                dev_args = impl.prepare(_merge(args, batch_axes, static, batched))
                out = impl.run(*dev_args)
                outs = [torch.as_tensor(x) for x in leaves(out)]
                if final is None:
                    structure = out
                    final = [np.empty(_out_shape(o.shape, out_axes[j], n),
                                      dtype=torch.empty(0, dtype=o.dtype).numpy().dtype) for j, o in enumerate(outs)]
                if stage_out[slot] is None:
                    stage_out[slot] = [torch.empty(_out_shape(o.shape, out_axes[j], chunk), dtype=o.dtype,
                                                   pin_memory=True) for j, o in enumerate(outs)]
                for j, o in enumerate(outs):
                    take(stage_out[slot][j], out_axes[j], 0, stop - start).copy_(o, non_blocking=True)
            pending[slot] = (start, stop)
        for slot in range(2):
            streams[slot].synchronize()
            if pending[slot] is not None:
                _land(final, [t.numpy() for t in stage_out[slot]], pending[slot], out_axes)
        it = iter(final)
        return impl.fetch(tree_map(lambda _: next(it), structure))  # fetch casts a demoted output back

    return run


def _land(final, staged, span, out_axes):
    """Copy one finished chunk's outputs from the pinned staging buffers into the final host arrays."""
    start, stop = span
    for j, buf in enumerate(staged):
        take(final[j], out_axes[j], start, stop)[...] = take(buf, out_axes[j], 0, stop - start)
