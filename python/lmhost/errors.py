"""The exceptions lmhost raises, one per kind of error, all under :class:`LmhostError`.

Where a standard exception means the same thing it is a base too, so ``except ValueError``
catches bad settings and ``except OSError`` unreadable files.
"""


class LmhostError(Exception):
    """Every error lmhost raises."""


class ConfigError(LmhostError, ValueError):
    """A config file, setting or backend option is wrong."""


class InvalidInputError(LmhostError, ValueError):
    """The request is wrong: messages, audio, a keyword argument, a prompt too long."""


class FileError(LmhostError, OSError):
    """A file cannot be read or written (a config, a run directory)."""


class PluginNotFoundError(LmhostError, LookupError):
    """No backend of that name, a library that is not a compatible lmhost plugin, or one whose
    shared libraries (a CUDA build's cuBLAS, say) cannot be found."""


class BackendUnavailableError(LmhostError):
    """The model cannot be loaded, or the server cannot be reached."""


class UnsupportedError(LmhostError):
    """The backend cannot do this at all."""


class BackendError(LmhostError):
    """A bug or a panic inside a backend."""


class ExplainError(LmhostError):
    """An explanation that cannot run with these settings, or whose model calls failed."""


class CancelledError(LmhostError):
    """An explanation stopped before it finished."""
