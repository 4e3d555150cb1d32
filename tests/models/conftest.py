"""Runs each TransformersParity test (parity.py, importable from this folder) once per
configuration of its class, on a tiny model built once per configuration."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_generate_tests(metafunc):
    if "config_name" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("config_name", sorted(metafunc.cls.configs), scope="class")


@pytest.fixture(scope="class")
def tiny(request, config_name, tmp_path_factory):
    from parity import build_tiny

    model, *rest = build_tiny(request.cls, config_name, tmp_path_factory)
    yield (model, *rest)
    model.close()
