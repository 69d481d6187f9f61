"""Python client for code-executor (standard library only).

See README.md beside pyproject.toml. The public names are re-exported here.
"""

from .client import (
    Busy,
    Client,
    CodeExecutorError,
    Event,
    Result,
    RetryPolicy,
    Session,
    SessionLost,
)

__all__ = [
    "Busy",
    "Client",
    "CodeExecutorError",
    "Event",
    "Result",
    "RetryPolicy",
    "Session",
    "SessionLost",
]

__version__ = "0.1.0"
