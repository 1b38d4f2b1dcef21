#!/usr/bin/env bash
# HAProxy and nginx for the fleet tests (tests/system/test_fleet_proxy.py), without root: Debian's own
# packages, fetched with `apt-get download` and unpacked under build/proxies/, with wrappers in
# build/proxies/bin that find their libraries. A machine with haproxy and nginx installed
# (apt-get install haproxy nginx) needs none of this: the tests take those from PATH.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${EDGEKIT_PROXIES:-$ROOT/build/proxies}
if [ -x "$DEST/bin/haproxy" ] && [ -x "$DEST/bin/nginx" ]; then exit 0; fi
mkdir -p "$DEST/debs" "$DEST/root" "$DEST/bin"
packages=(haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1 nginx)
have() { ls "$DEST"/debs/haproxy_*.deb "$DEST"/debs/nginx_*.deb >/dev/null 2>&1; }
fetch() { (cd "$DEST/debs" && apt-get download -q "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true); }
if ! have; then  # debs already there (carried to a machine without a network) are used as they are
    command -v apt-get >/dev/null || { echo "no apt-get here: install haproxy and nginx yourself" >&2; exit 1; }
    fetch
    # no package lists yet (a fresh container): fetch them, where we may
    if ! have && [ "$(id -u)" = 0 ]; then apt-get update -qq; fetch; fi
    have || { echo "apt-get could not download haproxy and nginx" >&2; exit 1; }
fi
for deb in "$DEST"/debs/*.deb; do dpkg-deb -x "$deb" "$DEST/root"; done
for tool in haproxy nginx; do
    cat > "$DEST/bin/$tool" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH="$DEST/root/usr/lib/\$(uname -m)-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$DEST/root/usr/sbin/$tool" "\$@"
WRAP
    chmod +x "$DEST/bin/$tool"
done
"$DEST/bin/haproxy" -v | head -1
"$DEST/bin/nginx" -v
