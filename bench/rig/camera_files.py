"""Camera files of any size (``framerelay ingest --config``), as YAML, TOML or JSON: the
same ``n`` cameras in each format, for ``bench/config_load.py`` and the camera file tests.

Every camera is an RTSP stream with its own id (``cam-0000`` ...), URL, fps (1-10) and
transport, a read timeout and one FFmpeg option; ``defaults`` give the username, the
password (from the environment variable :data:`PASSWORD_ENV`) and ``max_retries``.
"""

from __future__ import annotations

import json

FORMATS = ("yaml", "toml", "json")
PASSWORD_ENV = "CAM_PASS"  # noqa: S105 - a variable's name
DEFAULTS: dict[str, object] = {
    "username": "viewer",
    "password_env": PASSWORD_ENV,
    "max_retries": 100,
}


def cameras(n: int) -> list[dict[str, object]]:
    """``n`` camera definitions as ``POST /v1/streams`` takes them."""
    return [
        {
            "id": f"cam-{i:04d}",
            "url": f"rtsp://10.0.{i // 250}.{i % 250 + 1}:554/stream1",
            "fps": 1 + i % 10,
            "rtsp_transport": "udp" if i % 3 else "tcp",
            "read_timeout_s": 5,
            "options": {"buffer_size": "1048576"},
        }
        for i in range(n)
    ]


_TEXT = {
    "toml": (
        '[defaults]\nusername = "viewer"\npassword_env = "CAM_PASS"\nmax_retries = 100\n',
        '[[streams]]\nid = "{id}"\nurl = "{url}"\nfps = {fps}\nrtsp_transport = "{rtsp_transport}"'
        '\nread_timeout_s = 5\noptions = {{ buffer_size = "1048576" }}\n',
    ),
    "yaml": (
        "defaults:\n  username: viewer\n  password_env: CAM_PASS\n  max_retries: 100\nstreams:\n",
        "  - id: {id}\n    url: {url}\n    fps: {fps}\n    rtsp_transport: {rtsp_transport}\n"
        "    read_timeout_s: 5\n    options:\n      buffer_size: '1048576'\n",
    ),
}
"""Per format written out: the defaults (and what opens the list), then one camera."""


def camera_file(fmt: str, n: int) -> str:
    """The text of a camera file of ``n`` cameras in ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "json":
        return json.dumps({"defaults": DEFAULTS, "streams": cameras(n)}, indent=2)
    head, camera = _TEXT[fmt]
    return head + "".join(camera.format(**cam) for cam in cameras(n))
