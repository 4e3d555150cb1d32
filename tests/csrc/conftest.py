"""The `isa` fixture: a test runs once on each kernel table this CPU runs (scalar, avx2, ...)."""

import pytest

from ember import _core


@pytest.fixture(params=_core.available_isas())
def isa(request):
    previous = _core.isa()
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa(previous)
