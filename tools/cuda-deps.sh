#!/bin/sh
# Install a CUDA compiler from Debian when none is present, so the CUDA archive, the GPU tests
# and the GPU benchmarks can be compiled on a machine without a GPU (CI does this). Debian ships
# nvcc as nvidia-cuda-toolkit (CUDA 11.8 on Debian 12) in its contrib/non-free components,
# which this enables; its nvcc wants g++-11 as the host compiler. Needs root; exits non-zero
# when no nvcc could be installed.
# make cuda-report also needs cuobjdump (and the toolkit's nvdisasm beside it): where the toolkit
# lacks them, they come from PyPI (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm, into Python's
# nvidia/cu*/bin, where tools/cuda_report.py looks); a failure there is reported, not fatal here
# (make cuda-report then fails, naming cuobjdump).
cuda_tools() {
    for t in cuobjdump nvdisasm; do
        python3 tools/cuda_report.py --find-tool $t >/dev/null 2>&1 && continue
        python3 -m pip --version >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null; }
        echo "cuda-deps: installing $t from PyPI (nvidia-cuda-$t)"
        # Debian's Python refuses pip outside a virtual environment unless told (PEP 668)
        python3 -m pip install -q "nvidia-cuda-$t" 2>/dev/null || python3 -m pip install -q --break-system-packages "nvidia-cuda-$t" ||
            echo "cuda-deps: WARNING: could not install nvidia-cuda-$t: make cuda-report needs $t"
    done
    return 0
}
cd "$(dirname "$0")/.." || exit 1
command -v nvcc >/dev/null 2>&1 && { cuda_tools; exit 0; }
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
command -v nvcc >/dev/null 2>&1 || exit 1
cuda_tools
