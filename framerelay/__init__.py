"""framerelay: cross-cloud, real-time video inference.

This package holds the contracts every service shares: the ``Detections``
currency, wire messages and their sans-I/O codec, the timeline (PTS unwrap and
epochs), auth tokens, settings helpers and the ``framerelay`` CLI.
"""

from framerelay.detections import Detections
from framerelay.errors import (
    AuthError,
    CapacityError,
    ConfigError,
    FramerelayError,
    ModelError,
    ProtocolError,
    SourceError,
)

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "CapacityError",
    "ConfigError",
    "Detections",
    "FramerelayError",
    "ModelError",
    "ProtocolError",
    "SourceError",
    "__version__",
]
