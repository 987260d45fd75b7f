#!/usr/bin/env bash
# Install the two peer servers the benchmark compares against: beanstalkd and
# redis-server, from Debian's packages.
#
# Why a script: the bench must run on a fresh machine, so the project itself
# has to bring its peers. It is idempotent (does nothing when both binaries
# are already on PATH) and leaves no system service running: the benchmark
# starts its own private instances on free loopback ports, and a packaged
# service listening on 6379/11300 would only skew the CPU figures.
set -euo pipefail

need=()
command -v beanstalkd >/dev/null 2>&1 || need+=(beanstalkd)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ "${#need[@]}" -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

# Forbid maintainer scripts from starting services while we install
# (policy-rc.d exit 101 = "action not allowed"). Only a file we create is
# removed again.
POLICY=/usr/sbin/policy-rc.d
created_policy=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    created_policy=1
fi
cleanup() {
    if [ -n "$created_policy" ]; then
        $SUDO rm -f "$POLICY"
    fi
}
trap cleanup EXIT

echo "install-peers: installing ${need[*]}" >&2
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends beanstalkd redis-server

# Belt and braces: if a service got started or enabled anyway, stop and
# disable it. None of these may fail the install.
for service in beanstalkd redis-server; do
    if command -v systemctl >/dev/null 2>&1; then
        # Works offline too (no systemd running): it removes the symlinks.
        $SUDO systemctl disable "$service" >/dev/null 2>&1 || true
    fi
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        $SUDO systemctl stop "$service" >/dev/null 2>&1 || true
    elif command -v service >/dev/null 2>&1; then
        $SUDO service "$service" stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1; then
        $SUDO update-rc.d "$service" disable >/dev/null 2>&1 || true
    fi
done

command -v beanstalkd >/dev/null && command -v redis-server >/dev/null
