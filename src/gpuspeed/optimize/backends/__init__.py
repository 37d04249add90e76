"""Candidate backends. Each module defines build(module, func, precision, out_dtypes, ...) -> Impl and
imports only its own library, NumPy and common.py, so emit.py can paste it into a standalone script."""

BACKENDS = ("numpy", "cupy", "torch_compile", "torch", "numba", "jax", "variant")
