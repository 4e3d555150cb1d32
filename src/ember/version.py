"""ember's version, readable without importing the compiled core."""

__version__ = "0.1.0"
