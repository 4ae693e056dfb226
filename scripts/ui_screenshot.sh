#!/usr/bin/env bash
# A PNG of one page of Feast's UI for a featurectl repo, taken by headless Chromium: starts `featurectl ui` for the
# repo on a free loopback port, screenshots the page (default: the project's Lineage page), stops the server.
#
#   scripts/ui_screenshot.sh OUT.png [--repo DIR] [--registry URL] [--page PATH] [--size WxH]
#
# PATH is relative to the project's pages, e.g. `feature-view/asset_activity` or `data-source`. The repo must have
# been applied (`featurectl apply`). PYTHON picks the interpreter (default: the checkout's .venv).
set -Eeuo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
die() { echo "ui_screenshot: $*" >&2; exit 1; }

[[ $# -ge 1 && $1 != -* ]] || die "usage: $0 OUT.png [--repo DIR] [--registry URL] [--page PATH] [--size WxH]"
out="$1"; shift
repo="feature_repo"; page="lineage"; size="1400,1000"; global=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --repo) repo="$2"; shift 2 ;;
        --registry) global+=(--registry "$2"); shift 2 ;;
        --page) page="$2"; shift 2 ;;
        --size) size="${2/x/,}"; shift 2 ;;
        *) die "unknown option $1" ;;
    esac
done
command -v chromium >/dev/null || die "chromium is not installed: run scripts/setup.sh (it apt-installs it)"
[[ -x "$python" ]] || die "no Python at $python: run scripts/setup.sh, or set PYTHON"

work="$(mktemp -d)"
server=""
cleanup() {
    if [[ -n "$server" ]]; then kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
(cd "$root" && exec "$python" -m featurectl --repo "$repo" "${global[@]}" ui --port "$port") > "$work/ui.log" 2>&1 &
server=$!
# `featurectl ui` prints the project's address before it binds; the page is ready once the port answers.
for _ in $(seq 600); do
    kill -0 "$server" 2>/dev/null || { cat "$work/ui.log" >&2; die "featurectl ui exited (its output is above)"; }
    url="$(grep -o 'http://127.0.0.1:[0-9]*/p/[^ ]*/' "$work/ui.log" | head -n1 || true)"
    if [[ -n "$url" ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    sleep 0.2
done
[[ -n "$url" ]] || { cat "$work/ui.log" >&2; die "featurectl ui did not start within 120 s"; }

# --virtual-time-budget lets the page fetch the registry and lay out its graph before the shot; no sandbox, since
# CI runs as root. Chromium's own complaints (no D-Bus, no GPU) go to its log, shown only if it fails.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile" \
    --window-size="$size" --force-device-scale-factor=2 --virtual-time-budget=20000 \
    --screenshot="$(realpath -m "$out")" "$url$page/" > "$work/chromium.log" 2>&1 \
    || { cat "$work/chromium.log" >&2; die "chromium failed (its output is above)"; }
[[ -s "$out" ]] || { cat "$work/chromium.log" >&2; die "chromium wrote no screenshot to $out"; }
echo "ui_screenshot: $out ($url$page/)"
