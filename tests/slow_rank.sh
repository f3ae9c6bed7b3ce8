#!/bin/sh
# tests/slow_rank.sh — the collectives' timeout measures progress, not a peer's work: the trainer at
# 2 ranks (TP 2) with --timeout 2.
#   (a) one rank slow in every long phase (TPK_TEST_SLOW_RANK=1:S, S = 4 s, twice the timeout,
#       in each): it hashes the checkpoint's files with heartbeats, then loads it, sets up its
#       first step and saves under the phases' budget, 4 S in all; the job trains to the end:
#       exit 0, its last step line and save, no error line;
#   (b) the same rank stopped (SIGSTOP) while it hashes (its heartbeats stop): the job ends within
#       the timeout plus a margin, with one "no answer from a peer within 2 s" line;
#   (c) a rank stopped mid-training: the job ends within the timeout plus a margin (make test's
#       case of it: tests/faults.sh's (f), the same at --timeout 5, is make test-long's).
# Processes are found by PID (the trainer's ranks below this script's mpirun), never by name.
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup slow_rank
fail() { echo "FAIL $1"; [ -n "$2" ] && tail -8 "$2" | sed 's/^/    /'; }

# start NAME ARGS...: the trainer at 2 ranks in the background, output in $T/NAME.log, its exit
# status in $T/NAME.rc, the background job's PID in $T/NAME.pid
start() {
    name=$1; shift
    rm -f "$T/$name.rc"
    (timeout $((300 * scale)) mpirun $mpiflags -x TPK_TEST_SLOW_RANK -np 2 "$B/train" "$@" > "$T/$name.log" 2>&1; echo $? > "$T/$name.rc") &
    echo $! > "$T/$name.pid"
}
descendants() {
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}
# rank NAME R: the PID of world rank R of the run started as NAME (its OMPI_COMM_WORLD_RANK)
rank() {
    for p in $(descendants "$(cat "$T/$1.pid")"); do
        [ "$(ps -o comm= -p "$p" 2>/dev/null)" = train ] || continue
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"
    done
}
# waitfor NAME PATTERN SECONDS: until the log holds PATTERN
waitfor() {
    i=0
    while [ $i -lt $(($3 * 10 * scale)) ] && ! grep -q "$2" "$T/$1.log" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
}
# waitrc NAME SECONDS: until $T/NAME.rc exists; prints the seconds waited
waitrc() {
    i=0
    while [ $i -lt $(($2 * 10 * scale)) ] && [ ! -s "$T/$1.rc" ]; do sleep 0.1; i=$((i + 1)); done
    echo $((i / 10))
}
# cleanup NAME: every rank of the run gone
cleanup() {
    for p in $(descendants "$(cat "$T/$1.pid")"); do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
}
limit=$((2 + 15 * scale))

timeout $((120 * scale)) mpirun $mpiflags -np 2 "$B/train" --text "$text" $small --tp 2 --steps 2 --save "$T/c" > "$T/save.log" 2>&1
[ -f "$T/c/model.safetensors" ] || fail "a checkpoint to load: it was not saved" "$T/save.log"

# ---- (a) a rank slow to read the checkpoint --------------------------------------------------------
export TPK_TEST_SLOW_RANK=1:4
t0=$(date +%s)
start slow --text "$text" $small --tp 2 --steps 4 --load "$T/c" --save "$T/c2" --timeout 2
waitrc slow 120 > /dev/null
rc=$(cat "$T/slow.rc" 2>/dev/null) secs=$(($(date +%s) - t0))
if [ "$rc" = 0 ] && grep -q '^step *4/4' "$T/slow.log" && grep -q '^saved ' "$T/slow.log" && ! grep -q 'error' "$T/slow.log" && [ $secs -ge 16 ]; then
    ok "(a) rank 1 slow to hash, load, set up the first step and save (4 s each) at --timeout 2: trained to step 4 and saved in $secs s, no error"
else
    fail "(a) rank 1 slow to hash, load, set up the first step and save (4 s each) at --timeout 2 (exit '$rc' after $secs s)" "$T/slow.log"
fi
cleanup slow

# ---- (b) that rank stopped while it hashes -----------------------------------------------------------
export TPK_TEST_SLOW_RANK=1:120
start hstop --text "$text" $small --tp 2 --steps 4 --load "$T/c" --timeout 2
i=0; pid=""
while [ $i -lt $((300 * scale)) ] && [ -z "$pid" ]; do sleep 0.1; i=$((i + 1)); pid=$(rank hstop 1); done
sleep 4 # past MPI's start and into the hashing (4 s: twice the timeout, with heartbeats)
if [ -z "$pid" ] || [ -s "$T/hstop.rc" ]; then
    fail "(b) rank stopped while hashing: the run did not start or ended early" "$T/hstop.log"
else
    kill -STOP "$pid"
    waited=$(waitrc hstop $((60 * scale)))
    rc=$(cat "$T/hstop.rc" 2>/dev/null)
    n=$(grep -c "^train: error: .*no answer from a peer within 2 s" "$T/hstop.log")
    if [ -n "$rc" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -eq 1 ] && [ "$waited" -le $limit ]; then
        ok "(b) the slow rank stopped (SIGSTOP) while hashing at --timeout 2: one error line, exit $rc after $waited s (limit $limit s)"
    else
        fail "(b) the slow rank stopped while hashing (exit '$rc' after $waited s, $n error lines)" "$T/hstop.log"
    fi
fi
cleanup hstop
unset TPK_TEST_SLOW_RANK

# ---- (c) a rank stopped mid-training -------------------------------------------------------------
start tstop --text "$text" $small --tp 2 --steps 1000000 --timeout 2
waitfor tstop '^step' 120
pid=$(rank tstop 1)
if [ -z "$pid" ]; then
    fail "(c) rank stopped mid-training: the run did not start" "$T/tstop.log"
else
    kill -STOP "$pid"
    waited=$(waitrc tstop $((60 * scale)))
    rc=$(cat "$T/tstop.rc" 2>/dev/null)
    n=$(grep -c "^train: error: .*no answer from a peer within 2 s" "$T/tstop.log")
    if [ -n "$rc" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -eq 1 ] && [ "$waited" -le $limit ]; then
        ok "(c) a rank stopped (SIGSTOP) mid-training at --timeout 2: one error line, exit $rc after $waited s (limit $limit s)"
    else
        fail "(c) a rank stopped mid-training (exit '$rc' after $waited s, $n error lines)" "$T/tstop.log"
    fi
fi
cleanup tstop
