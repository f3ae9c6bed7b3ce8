#!/bin/sh
# tests/cmake.sh — make install's CMake package (cmake/tpkConfig.cmake.in, tpkConfigVersion.cmake.in)
# used as a CMake project uses it: installed with DESTDIR into a staging tree under a prefix it was
# not built for (the package finds its prefix from its own place), then the README's example
# (the ```c readme-example block, as $B/readme_example.c) built by CMake with plain cc against
# tpk::tpk (MPI, OpenBLAS and -Wl,-u,tpk_ops_default from the target, not from mpicc) and run on
# 2 ranks; the versions of tpk.pc and of the package equal tpk/base/version.h's; a request for
# another MAJOR (or, before 1.0, another MINOR) version is refused, as is COMPONENTS cuda where
# the CUDA archive was not installed. Where nvcc is found and the build is complete (make test
# built it), the same example against tpk::cuda. Run by tests/run.sh on the normal build.
. "$(dirname "$0")/common.sh"
setup cmake
T=$(cd "$T" && pwd) # absolute: CMake reads the paths from its build folder
fails=0
pass() { echo "ok cmake: $1"; }
bad() { echo "FAIL cmake: $1"; [ -n "$2" ] && tail -15 "$2" | sed 's/^/    /'; fails=$((fails + 1)); }
command -v cmake >/dev/null 2>&1 || { bad "cmake is not installed (make deps installs it)"; exit 1; }

ver=$(awk '/^#define TPK_VERSION_(MAJOR|MINOR|PATCH) /{v = v s $3; s = "."} END {print v}' \
    include/tpk/base/version.h)
major=${ver%%.*} rest=${ver#*.} minor=${rest%%.*}
dest=$T/dest prefix=/opt/tpk inst=$T/dest/opt/tpk
if make --no-print-directory -s B="$B" NVCC= install DESTDIR="$dest" PREFIX="$prefix" \
    > "$T/install.log" 2>&1 && [ -f "$inst/lib/cmake/tpk/tpkConfig.cmake" ] &&
    [ -f "$inst/lib/cmake/tpk/tpkConfigVersion.cmake" ] && [ -f "$inst/lib/libtpk_host.a" ]; then
    pass "make install DESTDIR=... PREFIX=$prefix: lib/cmake/tpk/tpkConfig.cmake and its version file"
else bad "make install DESTDIR=$dest PREFIX=$prefix" "$T/install.log"; exit 1; fi
pcver=$(PKG_CONFIG_PATH="$inst/lib/pkgconfig" pkg-config --modversion tpk 2>&1)
if [ "$pcver" = "$ver" ]; then pass "tpk.pc's version is tpk/base/version.h's ($ver)"
else bad "tpk.pc's version \"$pcver\", expected $ver"; fi

# a CMake project of the README's example: FILE.c, the target to link, the find_package arguments
project() {
    dir=$1 src=$2 target=$3 args=$4 langs=${5:-C}
    mkdir -p "$dir"
    [ -n "$src" ] && cp "$src" "$dir/mlp.c"
    cat > "$dir/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.13)
project(tpk_readme_example LANGUAGES $langs)
find_package(tpk $args)
message(STATUS "tpk \${tpk_VERSION}")
add_executable(mlp mlp.c)
target_compile_options(mlp PRIVATE -std=c11 -Wall -Wextra -Werror)
target_link_libraries(mlp PRIVATE $target)
EOF
}
make --no-print-directory -s B="$B" "$B/readme_example.c" > "$T/example.log" 2>&1 ||
    { bad "the README's example ($B/readme_example.c)" "$T/example.log"; exit 1; }

project "$T/src" "$B/readme_example.c" tpk::tpk "$ver REQUIRED"
if cmake -S "$T/src" -B "$T/bld" -DCMAKE_C_COMPILER="${CC:-cc}" -DCMAKE_PREFIX_PATH="$inst" \
    > "$T/configure.log" 2>&1 && grep -q -- "-- tpk $ver\$" "$T/configure.log" &&
    cmake --build "$T/bld" > "$T/build.log" 2>&1; then
    pass "find_package(tpk $ver REQUIRED) and tpk::tpk: the README's example built with ${CC:-cc}"
    out=$(timeout $((120 * scale)) mpirun $mpiflags -np 2 "$T/bld/mlp" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q "^misuse: TPK_ERR_LAYOUT: tpk_col_linear_forward: x: expected layout R"; then
        pass "the example linked against tpk::tpk runs on 2 ranks (exit 0, the misuse refused)"
    else
        bad "the example linked against tpk::tpk on 2 ranks: exit $rc"
        printf '%s\n' "$out" | tail -8 | sed 's/^/    /'
    fi
else bad "find_package(tpk $ver) and tpk::tpk" "$( [ -f "$T/build.log" ] && echo "$T/build.log" || echo "$T/configure.log")"; fi

# versions the package must refuse: the next MAJOR; before 1.0 the next MINOR too
for want in $((major + 1)).0 $( [ "$major" = 0 ] && echo "0.$((minor + 1))"); do
    project "$T/v$want" "$B/readme_example.c" tpk::tpk "$want REQUIRED"
    if ! cmake -S "$T/v$want" -B "$T/v$want/bld" -DCMAKE_PREFIX_PATH="$inst" > "$T/v$want.log" 2>&1 &&
        grep -q "tpkConfig.cmake, version: $ver" "$T/v$want.log"; then
        pass "find_package(tpk $want) refused by the installed $ver"
    else bad "find_package(tpk $want) against $ver: expected a refusal naming version $ver" "$T/v$want.log"; fi
done
# COMPONENTS cuda where only the host archive was installed
project "$T/nocuda" "$B/readme_example.c" tpk::cuda "REQUIRED COMPONENTS cuda"
if ! cmake -S "$T/nocuda" -B "$T/nocuda/bld" -DCMAKE_PREFIX_PATH="$inst" > "$T/nocuda.log" 2>&1 &&
    grep -q "component cuda not installed" "$T/nocuda.log"; then
    pass "find_package(tpk COMPONENTS cuda) refused where the CUDA archive was not installed"
else bad "find_package(tpk COMPONENTS cuda) without the CUDA archive: expected a refusal" "$T/nocuda.log"; fi

# tpk::cuda: where nvcc is found and make test's build is complete (nothing to compile here)
if command -v nvcc >/dev/null 2>&1 && make --no-print-directory -s -q B="$B" all 2>/dev/null; then
    cinst=$T/cdest/opt/tpk
    if make --no-print-directory -s B="$B" install DESTDIR="$T/cdest" PREFIX=/opt/tpk \
        > "$T/cinstall.log" 2>&1 && [ -f "$cinst/lib/libtpk_cuda.a" ]; then
        project "$T/csrc" "$B/readme_example.c" tpk::cuda "$ver REQUIRED COMPONENTS cuda" "C CXX"
        if cmake -S "$T/csrc" -B "$T/cbld" -DCMAKE_PREFIX_PATH="$cinst" > "$T/cconfigure.log" 2>&1 &&
            cmake --build "$T/cbld" > "$T/cbuild.log" 2>&1 &&
            timeout $((120 * scale)) mpirun $mpiflags -np 2 "$T/cbld/mlp" > "$T/crun.log" 2>&1; then
            pass "tpk::cuda: the README's example built against the CUDA archive and run on 2 ranks"
        else bad "tpk::cuda: the README's example" "$(ls -t "$T"/c*.log | head -1)"; fi
    else bad "make install with the CUDA archive" "$T/cinstall.log"; fi
else
    echo "cmake: tpk::cuda not built here (it needs nvcc and make test's complete build in $B)"
fi
[ "$fails" -eq 0 ]
