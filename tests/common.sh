# tests/common.sh — sourced by the trainer's test scripts (tests/train.sh, tests/faults.sh): the
# build directory, mpirun's flags, a text every Debian system has, a small model, the fixtures
# program, and T = build/tests/NAME made empty (NAME: the script's first argument to `setup`).
cd "$(dirname "$0")/.." || exit 1
# TPK_TIME_SCALE (a whole number, default 1) multiplies every time limit: a busy machine
scale=${TPK_TIME_SCALE:-1}
case "$scale" in '' | *[!0-9]* | 0) echo "TPK_TIME_SCALE: expected a whole number >= 1, got '$scale'" >&2; exit 1 ;; esac
# TPK_TESTS: which cases run (tests/run.sh sets it): quick (make test: each behaviour in one
# configuration), long (make test-long, CI: the configurations quick leaves out), all (both);
# quick_set / long_set say whether a case of that set runs
tests=${TPK_TESTS:-quick}
case "$tests" in quick | long | all) ;; *) echo "TPK_TESTS: expected quick, long or all, got '$tests'" >&2; exit 1 ;; esac
quick_set() { [ "$tests" != long ]; }
long_set() { [ "$tests" != quick ]; }
# pick QUICK LONG: the words of the running set: QUICK's, LONG's, or both (each once, in order)
pick() {
    v=""
    quick_set && v=$1
    long_set && v="$v $2"
    printf '%s\n' $v | awk 'NF && !seen[$0]++ { printf "%s ", $0 }'
}
B=${TPK_BUILD:-build}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# Open MPI, unless the environment says otherwise: the PML named (ob1, what it selects on one node
# anyway; named, mpirun skips opening the cm PML's PSM libraries: 0.2 s a launch) and no grace
# second between SIGTERM and SIGKILL when a job's ranks are taken down (the trainer handles no
# SIGTERM: 1 s a failing launch); make test launches mpirun about 500 times
: "${OMPI_MCA_pml:=ob1}" "${OMPI_MCA_odls_base_sigkill_timeout:=0}"
export OMPI_MCA_pml OMPI_MCA_odls_base_sigkill_timeout
mpiflags="--oversubscribe"
[ "$(id -u)" = 0 ] && mpiflags="$mpiflags --allow-run-as-root"
fx=$B/tests/train_fixtures
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=README.md
small="--layers 2 --hidden 32 --heads 4 --batch 4 --seq-len 16 --lr 3e-3 --warmup 2 --seed 3"
ok() { echo "ok $1"; }
setup() { T=$B/tests/$1; rm -rf "$T" && mkdir -p "$T"; }
