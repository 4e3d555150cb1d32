"""User-facing errors: each one is printed by the CLI as a single line."""


class EmberError(Exception):
    """An expected failure (bad file, bad flag, full context) with a message for people.

    `exit_code` is what the CLI exits with: 2 for bad input, 1 for failures of the
    environment (network, disk).
    """

    exit_code = 2


class GGUFError(EmberError):
    """A GGUF file that is malformed, truncated or uses something ember does not support."""


class ModelNotFound(EmberError):
    """A model name that is neither a registry name nor an existing file."""


class DownloadError(EmberError):
    exit_code = 1


class ContextFullError(EmberError):
    """The prompt (plus what was generated) does not fit in the context window."""


class Unsupported(EmberError, NotImplementedError):
    """An option or argument ember knows of but does not implement (named in the message)."""


class EmberWarning(UserWarning):
    """Something worth saying that does not stop the work (a setting beyond what the model or the
    machine has); the CLI prints it as one line, `ember: warning: ...`."""
