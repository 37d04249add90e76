"""Bundled example workloads: a user's slow NumPy function, its inputs, and a faster version."""
