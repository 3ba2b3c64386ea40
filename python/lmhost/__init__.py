"""lmhost for Python: generate, score and explain LLM answers with lmhost's backends.

    import lmhost
    host = lmhost.Host("configs/default.toml")
    ex = host.explain(messages, players="sentences", estimator="kernel", budget=512)

Messages are in the OpenAI chat shape: ``[{"role": "user", "content": "..."}]``, or, for an
agent's trace or a retrieval, a conversation file's ``{"messages": [...], "tools": [...],
"documents": [...]}``. Every bundled backend (candle, onnx, openai, mock) is linked in; plugin
libraries load by name as with the ``lmhost`` command. Errors are the classes of
:mod:`lmhost.errors`.
"""

from . import errors
from ._lmhost import Explanation, Host
from .errors import (
    BackendError,
    BackendUnavailableError,
    CancelledError,
    ConfigError,
    ExplainError,
    FileError,
    InvalidInputError,
    LmhostError,
    PluginNotFoundError,
    UnsupportedError,
)

__all__ = [
    "Host",
    "Explanation",
    "errors",
    "LmhostError",
    "ConfigError",
    "InvalidInputError",
    "FileError",
    "PluginNotFoundError",
    "BackendUnavailableError",
    "UnsupportedError",
    "BackendError",
    "ExplainError",
    "CancelledError",
]
