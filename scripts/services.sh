#!/usr/bin/env bash
# System packages and services the tests use; each step is skipped when
# already in place. Needs root (or sudo) only when something must be installed.
set -euo pipefail

APT_PACKAGES=(
  ffmpeg redis-server
  gir1.2-gst-rtsp-server-1.0 gstreamer1.0-rtsp python3-gi gstreamer1.0-tools
  gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
  gstreamer1.0-plugins-ugly gstreamer1.0-libav
  chromium chromium-driver
)
# promtool (tests/metrics/test_promtool.py) ships in the prometheus server package only;
# it is installed without recommends and its service is never started.
TOOL_PACKAGES=(prometheus)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing system packages: ${missing[*]}" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
    { as_root apt-get update -q >/dev/null &&
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
fi

missing_tools=()
for p in "${TOOL_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing_tools+=("$p")
done
if [ ${#missing_tools[@]} -gt 0 ]; then
  echo "installing system packages (tools only, services not started): ${missing_tools[*]}" >&2
  # policy-rc.d exit 101: Debian's maintainer scripts start no service while it is there
  policy=/usr/sbin/policy-rc.d
  own_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod 755 "$policy"
    own_policy=1
  fi
  install_tools() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      "${missing_tools[@]}" >/dev/null
  }
  install_tools || { as_root apt-get update -q >/dev/null && install_tools; } ||
    { [ -z "$own_policy" ] || as_root rm -f "$policy"; exit 1; }
  [ -z "$own_policy" ] || as_root rm -f "$policy"
  if [ -d /run/systemd/system ]; then  # nor at the next boot
    as_root systemctl disable prometheus >/dev/null 2>&1 || true
  fi
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting redis-server on 127.0.0.1:6379" >&2
  mkdir -p /tmp/framerelay-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /tmp/framerelay-redis --logfile /tmp/framerelay-redis/redis.log
  for _ in $(seq 50); do redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
