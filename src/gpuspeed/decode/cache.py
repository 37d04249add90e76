"""KV caches: a growing one (V1: concatenate each step) and a static one (V2+: preallocated, written in place).

Both expose update(layer, input_pos, k, v) -> (k_all, v_all) and mask(input_pos) -> [S, L] bool (or None
when every query sees every key). The static cache keeps positions on the device: the write is an
index_copy_ at input_pos and the mask is arange(L) <= pos, so a step needs no host value and can be
compiled once and captured into a CUDA graph.
"""

from __future__ import annotations

import torch


class DynamicCache:
    """K/V grow by one step's tokens per call (torch.cat): new shapes every step, so eager only."""

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.length = 0  # tokens held (a host integer: this cache is the host-driven rung)

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (views: the next cat copies)."""
        for i in range(len(self.k)):
            if self.k[i] is not None:
                self.k[i] = self.k[i][:, :, :length]
                self.v[i] = self.v[i][:, :, :length]
        self.length = min(self.length, length)

    def mask(self, input_pos: torch.Tensor) -> torch.Tensor | None:
        s = input_pos.shape[0]
        if s == 1:
            return None
        total = self.length + s
        return torch.ones(s, total, dtype=torch.bool, device=input_pos.device).tril(diagonal=total - s)

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        if layer == len(self.k) - 1:
            self.length += k.shape[2]
        return self.k[layer], self.v[layer]


class StaticCache:
    """Preallocated K/V [B, Hkv, max_len, D] per layer, written at input_pos (device positions)."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 device, dtype):
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.max_len = max_len
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.positions = torch.arange(max_len, device=device)
        # ticket counters of the fused step attention's split form (kernels/step_attention.py): zeros, which
        # the kernel restores after each use, so one set serves every layer and every graph replay
        self.counter = torch.zeros(batch * n_kv_heads, device=device, dtype=torch.int32)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def mask(self, input_pos: torch.Tensor) -> torch.Tensor:
        return self.positions[None, :] <= input_pos[:, None]

    def update(self, layer: int, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.k[layer].index_copy_(2, input_pos, k)
        self.v[layer].index_copy_(2, input_pos, v)
        return self.k[layer], self.v[layer]

    def reset(self) -> None:
        for t in self.k + self.v:
            t.zero_()
