"""Shared test setup: the `gpu` marker skips without CUDA; the gpubench plugin loads from source."""

import importlib.metadata

import pytest

try:  # installed (make test): the pytest11 entry point already loads the plugin
    importlib.metadata.distribution("gpuspeed")
    pytest_plugins: list[str] = []
except importlib.metadata.PackageNotFoundError:  # PYTHONPATH=src (make gpu-test on the device)
    pytest_plugins = ["gpuspeed.pytest_plugin"]


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `make gpu-test` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
