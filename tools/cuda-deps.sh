#!/bin/sh
# Install a CUDA compiler from Debian when none is present, so the CUDA archive, the GPU tests
# and the GPU benchmarks can be compiled on a machine without a GPU (CI does this). Debian ships
# nvcc as nvidia-cuda-toolkit (CUDA 11.8 on Debian 12) in its contrib/non-free components,
# which this enables; its nvcc wants g++-11 as the host compiler. Needs root; exits non-zero
# when nothing could be installed.
command -v nvcc >/dev/null 2>&1 && exit 0
[ "$(id -u)" = 0 ] || { echo "cuda-deps: run as root: apt-get install nvidia-cuda-toolkit g++-11 (from contrib/non-free)"; exit 1; }
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show nvidia-cuda-toolkit >/dev/null 2>&1; then
    . /etc/os-release
    # the archive this system already uses for its main component (deb822 or one-line format)
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit} $1 == "deb" {print $3; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$uri" ] || { echo "cuda-deps: no Debian archive configured in /etc/apt"; exit 1; }
    cat > /etc/apt/sources.list.d/tpk-cuda.sources <<EOS
Types: deb
URIs: $uri
Suites: ${VERSION_CODENAME:-bookworm}
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOS
    apt-get update -qq || exit 1
fi
echo "cuda-deps: installing nvidia-cuda-toolkit g++-11"
apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit g++-11 >/dev/null || { echo "cuda-deps: apt-get install failed"; exit 1; }
command -v nvcc >/dev/null 2>&1
