#!/usr/bin/env bash
# Fetch the two peer servers the benchmark compares against, beanstalkd and
# redis-server, etcd (what a cluster's tests coordinate through),
# Prometheus's promtool (what checks the alert rules in deploy/) and stunnel
# (the TLS sidecar a plain-TCP client reaches a TLS port through), from
# Debian's packages, unpacked under a local directory
# (loadtests/.peers/ by default, git-ignored; PEERS_DIR overrides it).
#
# Why local: the bench must run on a fresh machine, so the project brings its
# own peers, but it has no business changing the system. Nothing is installed:
# `apt-get download` fetches the .deb files and `dpkg -x` unpacks them, so no
# package is registered with dpkg, no maintainer script runs, no service is
# started or enabled and no file lands outside PEERS_DIR. The bench runs the
# binaries from there (with the unpacked libraries on LD_LIBRARY_PATH), as
# private instances on free loopback ports. Idempotent: does nothing when all
# five binaries are already unpacked.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dest=${PEERS_DIR:-$here/.peers}
root=$dest/root
packages=(beanstalkd redis-server etcd-server prometheus stunnel4)
binaries=(beanstalkd redis-server etcd promtool stunnel4)

have_all() {
    for binary in "${binaries[@]}"; do
        [ -x "$root/usr/bin/$binary" ] || return 1
    done
}
if have_all; then
    exit 0
fi
for tool in apt-get dpkg; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "install-peers: needs $tool (a Debian or Ubuntu system) to fetch ${packages[*]}" >&2
        exit 1
    fi
done

# apt's own answer to "what would installing these add to this system":
# the packages plus the libraries this system lacks. Only a simulation, so it
# needs no root and changes nothing.
plan() {
    apt-get install --simulate --no-install-recommends "${packages[@]}" 2>/dev/null \
        | awk '/^Inst /{print $2}'
}
if ! apt-get install --simulate --no-install-recommends "${packages[@]}" >/dev/null 2>&1; then
    # No package lists yet (a fresh container): fetch them. This reads the
    # archive's indexes; it installs nothing.
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "install-peers: apt-get update (package lists are missing)" >&2
    $sudo apt-get update -q
fi
# The peers themselves always (even if the system has them installed), their
# missing dependencies as apt resolves them.
mapfile -t needed < <({ printf '%s\n' "${packages[@]}"; plan; } | sort -u)

work=$(mktemp -d "${TMPDIR:-/tmp}/qs-peers.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
chmod 755 "$work" && chmod 777 "$work/debs"   # apt downloads as its own user (_apt)
echo "install-peers: downloading ${needed[*]} into $dest" >&2
(cd "$work/debs" && apt-get download -q "${needed[@]}")
for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$work/root"
done
# Debian links redis-server to redis-check-rdb; keep every link inside the tree.
find "$work/root" -type l -lname '/*' | while read -r link; do
    target=$(readlink "$link")
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$work/root$target")" "$link"
done

mkdir -p "$dest"
printf '# downloaded by install-peers.sh\n*\n' > "$dest/.gitignore"
rm -rf "$root"
mv "$work/root" "$root"
have_all
echo "install-peers: ${binaries[*]} are in $root" >&2
