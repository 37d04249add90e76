"""A PyTorch model's forward pass as written for the CPU: a two-layer MLP with GELU and a residual.

The PyTorch original: gpuspeed moves the tensors to the GPU, makes new tensors there, and compiles it.
"""

import torch

TOLERANCE = dict(rtol=1e-3, atol=1e-3)  # float32 matmuls may use TF32 on the GPU


def original(x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(x @ w1 + b1)
    y = h @ w2 + b2
    return torch.nn.functional.layer_norm(x + y, (x.shape[-1],))


def inputs(rng, scale=1.0):
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    batch = max(16, int(8192 * scale))
    d, hidden = 1024, 4096
    x = torch.randn(batch, d, generator=gen)
    w1 = torch.randn(d, hidden, generator=gen) / d ** 0.5
    w2 = torch.randn(hidden, d, generator=gen) / hidden ** 0.5
    return x, w1, torch.zeros(hidden), w2, torch.zeros(d)
