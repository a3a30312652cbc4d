"""The error tree. Every message says what went wrong and what to do about it."""

from __future__ import annotations


class FramerelayError(Exception):
    """Base of every error framerelay raises on purpose."""


class ConfigError(FramerelayError):
    """A setting or argument is wrong; the message names it and the fix."""


class SourceError(FramerelayError):
    """A camera or file source could not be opened or read."""


class ProtocolError(FramerelayError):
    """A wire message is malformed, oversized, or violates the protocol.

    ``close_code`` is the WebSocket close code a server should use when the
    error comes from a peer (1002 protocol error, 1009 too big, 1008 policy).
    """

    def __init__(self, message: str, *, close_code: int = 1002) -> None:
        super().__init__(message)
        self.close_code = close_code


class AuthError(FramerelayError):
    """A token is missing, malformed, badly signed, expired or out of scope."""


class CapacityError(FramerelayError):
    """A bounded resource is full and the caller must back off or drop."""


class ModelError(FramerelayError):
    """A model file cannot be loaded or its outputs have an unknown layout."""
