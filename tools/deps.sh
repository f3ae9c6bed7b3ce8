#!/bin/sh
# Install the Debian packages tpk needs (C and C++ compilers, Open MPI, OpenBLAS, pkg-config, cmake for
# the CMake package's test) when they are missing.
# As root it installs them; otherwise it prints the exact command and fails.
pkgs="make gcc g++ openmpi-bin libopenmpi-dev libopenblas-dev pkg-config cmake"
[ -n "$TPK_EXTRA_PKGS" ] && pkgs="$pkgs $TPK_EXTRA_PKGS"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null || {
        echo "deps: apt-get install$missing failed"; exit 1; }
else
    echo "deps: missing Debian packages:$missing"
    echo "deps: run: sudo apt-get install -y$missing"
    exit 1
fi
