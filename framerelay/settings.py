"""Settings helpers shared by the services.

Each service has one ``pydantic-settings`` model (env prefix ``FRAMERELAY_``,
``extra="forbid"``) built in ``main()``, never at import time. Secrets are
``SecretStr`` so they never print.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from framerelay.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLES = REPO_ROOT / "samples"
DEFAULT_MODEL = SAMPLES / "models" / "yolox_nano_416.onnx"
DEFAULT_CLIP = SAMPLES / "mot15" / "TUD-Stadtmitte" / "TUD-Stadtmitte.mp4"


def split_secrets(value: SecretStr | None, env_name: str = "FRAMERELAY_TOKEN_SECRETS") -> list[str]:
    """Comma-separated secrets -> list; a clear error when none are set."""
    secrets = [
        s.strip() for s in (value.get_secret_value() if value else "").split(",") if s.strip()
    ]
    if not secrets:
        raise ConfigError(
            f"{env_name} is not set: give one or more comma-separated token secrets "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return secrets
