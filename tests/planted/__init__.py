"""Planted workloads with known profiling answers (see workloads.py)."""
