"""The `ember` command: main.py builds the parser; one module per subcommand handles it."""

from ember.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
