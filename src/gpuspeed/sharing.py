"""Other processes on the GPU while we measure: who holds a CUDA context there, who computed, whose memory moved.

A timing taken while another process runs kernels on the same GPU includes its share of the SMs and of the
memory bandwidth, and NVML's used-memory reading (which peak_memory() samples) counts every process. Neither
shows in the samples themselves, so bench() and peak_memory() bracket their measurement with a ShareWatch
and say so in a note. NVML is read through gpuspeed.device; where it cannot list processes (no NVML, or a
container that hides them) nothing is claimed.

Inside a container NVML reports host process ids, which need not include os.getpid(): the measuring process
holds a context of its own on the GPU, so then one of the listed processes (and one of the busy ones) is
taken to be ours.
"""

from __future__ import annotations

import os
import time

from gpuspeed import device as _device

BUSY_SM_PCT = 1  # a process NVML sampled at this SM utilisation or more computed while we measured


def others(pids, own_pid: int) -> tuple[list[int], bool]:
    """The listed pids that are not this process, and whether this process could be told apart.

    Not found among them (a container's PID namespace): one of them is ours, so one fewer counts as other
    (which one is unknown: all are returned, the count is len - 1)."""
    pids = sorted(set(int(p) for p in pids))
    if own_pid in pids:
        return [p for p in pids if p != own_pid], True
    return pids, False


def summarize_sharing(before: list[dict] | None, after: list[dict] | None, busy: dict[int, int] | None,
                      own_pid: int) -> dict:
    """The record of what other processes did on the GPU between two process lists, given NVML's SM samples
    since the first (pid -> highest SM %; None: not readable). Empty when NVML could not list processes."""
    if before is None and after is None:
        return {}
    listed = [p["pid"] for p in (before or []) + (after or [])]
    other, identified = others(listed, own_pid)
    n_other = len(other) if identified else max(len(other) - 1, 0)
    record: dict = {"other_processes": n_other}
    if busy is not None and not busy and n_other:
        busy = None  # no samples at all, ours included though we were measuring: NVML does not sample them here
    if busy is not None:
        active = {pid: pct for pid, pct in busy.items() if pct >= BUSY_SM_PCT}
        busy_other, busy_identified = others(active, own_pid)
        if identified or busy_identified or own_pid in busy:  # our pid is NVML's (listed), sampled or not
            record["other_busy"] = {str(p): active[p] for p in busy_other}
        else:  # ours is among them, unnamed: the least busy is taken for ours
            ranked = sorted(busy_other, key=lambda p: active[p], reverse=True)
            record["other_busy"] = {str(p): active[p] for p in ranked[:max(len(ranked) - 1, 0)]}
    if identified:  # memory held by the others, before and after (NVML's per-process figure, where it has one)
        def held(procs):
            got = [p.get("used_bytes") for p in procs or [] if p["pid"] != own_pid]
            return None if procs is None or any(v is None for v in got) else sum(got)

        b, a = held(before), held(after)
        if b is not None and a is not None:
            record["other_used_bytes_before"], record["other_used_bytes_after"] = b, a
    return record


def shared(record: dict, notes: list[str]) -> bool:
    """Whether other processes computed on the GPU during the measurement (a note says who); a note too where
    others hold a context and whether they computed could not be read."""
    busy = record.get("other_busy")
    if busy:
        who = ", ".join(f"pid {pid} at up to {pct} % SM" for pid, pct in busy.items())
        notes.append(f"{len(busy)} other process(es) computed on this GPU while this was measured (NVML: {who}): "
                     "the result includes their share of the GPU; measure again with the GPU to yourself")
        return True
    n = record.get("other_processes") or 0
    if n and busy is None:
        notes.append(f"{n} other process(es) hold a CUDA context on this GPU (NVML); whether they computed while "
                     "this was measured could not be read")
    return False


def memory_note(record: dict) -> str | None:
    """A note for peak_memory(): NVML's device-wide reading moved with other processes' memory."""
    from gpuspeed.memory import format_bytes  # memory imports this module

    b, a = record.get("other_used_bytes_before"), record.get("other_used_bytes_after")
    if b is not None and a is not None and a != b:
        sign = "+" if a > b else ""
        left_out = "; that growth is left out of the peak" if a > b else ""
        return (f"other processes' memory on this GPU changed by {sign}{format_bytes(a - b)} during the call (NVML's "
                f"per-process figures){left_out}: its device-wide samples in between, and the part of the peak "
                "taken from them, may include theirs")
    if record.get("other_busy") or (record.get("other_processes") and b is None):
        return (f"{record['other_processes']} other process(es) hold memory on this GPU (NVML): NVML's "
                "device-wide reading, and the part of the peak taken from it, may include theirs")
    return None


def others_growth(record: dict) -> int:
    """Bytes other processes' memory grew by between the two process lists (0 when it did not, or is unknown)."""
    b, a = record.get("other_used_bytes_before"), record.get("other_used_bytes_after")
    return max(a - b, 0) if b is not None and a is not None else 0


class ShareWatch:
    """The GPU's processes before and after a measurement, and NVML's SM samples of each in between."""

    def __init__(self, index: int | None = None):
        self._index = _device.current_index() if index is None else index
        self._before = _device.gpu_processes(self._index)
        self._since_us = int(time.time() * 1e6)  # NVML stamps its samples with the host clock, in us

    def stop(self) -> dict:
        if self._before is None:
            return {}
        busy = _device.process_sm_busy(self._index, self._since_us)
        return summarize_sharing(self._before, _device.gpu_processes(self._index), busy, os.getpid())
