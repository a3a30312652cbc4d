"""A real RTSP server for tests: GStreamer's gst-rtsp-server playing an MP4 file.

Runs under the *system* Python (``/usr/bin/python3``), which has PyGObject and
the Debian GStreamer packages (see ``scripts/services.sh``); the project venv
does not. Tests drive it through :class:`tests.support.servers.RtspServer`.

    /usr/bin/python3 tests/support/rtsp_server.py --port 8554 --clip clip.mp4 \
        [--mount /cam] [--codec h264|mpeg4] [--user U --password P]

The clip is an MP4 holding H.264 (``--codec h264``, the default) or MPEG-4
Part 2 (``--codec mpeg4``, like the sample clips). Frames are sent at their real rate (the RTP
sink is synchronised to the clock), like a camera. Prints ``READY <port>``
once it listens.
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

PAYLOADERS = {
    "h264": "h264parse ! rtph264pay name=pay0 pt=96 config-interval=1",
    "mpeg4": "mpeg4videoparse ! rtpmp4vpay name=pay0 pt=96 config-interval=1",
}


def build_server(args: argparse.Namespace) -> GstRtspServer.RTSPServer:
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    payloader = PAYLOADERS[args.codec]
    factory.set_launch(f'( filesrc location="{args.clip}" ! qtdemux ! {payloader} )')
    factory.set_shared(True)
    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "user")
        basic = GstRtspServer.RTSPAuth.make_basic(args.user, args.password)
        auth.add_basic(basic, token)
        server.set_auth(auth)
        perms = GstRtspServer.RTSPPermissions()
        perms.add_permission_for_role("user", "media.factory.access", True)
        perms.add_permission_for_role("user", "media.factory.construct", True)
        factory.set_permissions(perms)
    server.get_mount_points().add_factory(args.mount, factory)
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clip", required=True)
    parser.add_argument("--mount", default="/cam")
    parser.add_argument("--codec", choices=sorted(PAYLOADERS), default="h264")
    parser.add_argument("--user", default="")
    parser.add_argument("--password", default="")
    args = parser.parse_args()
    Gst.init(None)
    server = build_server(args)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 1
    loop = GLib.MainLoop()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, loop.quit)
    print(f"READY {args.port}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
