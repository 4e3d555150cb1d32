"""Where the tests' data lives."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
REPO = TESTS.parent


def ember_root() -> Path:
    """The folder this process imports ember from (site-packages, or src/ with an in-place build):
    the PYTHONPATH a test's `python -m ember` subprocess needs to run the same ember."""
    import ember

    return Path(ember.__file__).resolve().parent.parent
