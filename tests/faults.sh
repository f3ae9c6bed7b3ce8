#!/bin/sh
# tests/faults.sh — the trainer (build/gpt2_train) when things break, on the host backend:
#   (a) one rank killed with SIGKILL in the middle of training, at TP 2 and at DP 2: the job ends
#       within 30 s (mpirun takes the other rank down) and says which rank died of signal 9;
#   (b) the checkpoint writer killed with SIGKILL while it saves every step (a model whose save
#       takes most of a step, killed at three different moments): every file under a final name
#       is whole (the strict reader accepts it), the newest complete checkpoint loads, and only
#       temporaries (*.tmp.<pid>) may be left half-written;
#   (c) the disk full during a save (a file-size limit, RLIMIT_FSIZE, on the ranks): one clear
#       error line, a non-zero exit, the previous checkpoint byte for byte as it was and loadable;
#   (d) ranks started with different configurations: tests/train.sh;
#   (e) one rank stopped (SIGSTOP) in the middle of training, at TP 2 and at DP 2, with --timeout 5:
#       the live rank prints one error line naming the timeout and the job ends non-zero within
#       5 s plus a margin, the stopped rank gone with it (mpirun's abort kills it).
# Prints "ok <name>" / "FAIL <name>" lines for tests/run.sh to count.
. "$(dirname "$0")/common.sh"
setup faults
fail() { echo "FAIL $1"; [ -n "$2" ] && tail -8 "$2" | sed 's/^/    /'; }

# start NAME ARGS...: mpirun -np 2 of the trainer in the background, output in $T/NAME.log, its exit
# status in $T/NAME.rc when it ends, the background job's PID in $T/NAME.pid; waits until the log
# holds a line matching $ready
start() {
    name=$1; shift
    rm -f "$T/$name.rc"
    (timeout $((300 * scale)) mpirun $mpiflags -np 2 "$B/gpt2_train" "$@" > "$T/$name.log" 2>&1; echo $? > "$T/$name.rc") &
    echo $! > "$T/$name.pid"
    i=0
    while [ $i -lt $((600 * scale)) ] && ! grep -q "$ready" "$T/$name.log" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
}
# descendants PID: every process below PID (by parent PID, never by name: another checkout's
# suite may be running the same programs at the same time)
descendants() {
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done
}
# ranks NAME: the PIDs of the trainer's ranks (not mpirun) of the run started as NAME
ranks() {
    for p in $(descendants "$(cat "$T/$1.pid")"); do
        [ "$(ps -o comm= -p "$p" 2>/dev/null)" = gpt2_train ] && echo "$p"
    done
}
# wait until $T/NAME.rc exists, at most SECONDS; prints the seconds waited
waitrc() {
    i=0
    while [ $i -lt $(($2 * 10)) ] && [ ! -s "$T/$1.rc" ]; do sleep 0.1; i=$((i + 1)); done
    echo $((i / 10))
}

# ---- (a) a rank killed mid-training ------------------------------------------------------------
for mesh in tp dp; do
    [ $mesh = tp ] && m="--tp 2" || m="--tp 1"
    ready="^step"
    start kill_$mesh --text "$text" $small $m --steps 1000000 --csv "$T/kill_$mesh.csv"
    pid=$(ranks kill_$mesh | tail -1)
    if [ -z "$pid" ]; then fail "(a) rank killed at $mesh 2: the run did not start" "$T/kill_$mesh.log"; continue; fi
    kill -9 "$pid"
    waited=$(waitrc kill_$mesh 60)
    rc=$(cat "$T/kill_$mesh.rc" 2>/dev/null)
    if [ -n "$rc" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$waited" -le 30 ] && grep -q "signal 9" "$T/kill_$mesh.log"; then
        ok "(a) a rank killed with SIGKILL at $(echo $mesh | tr a-z A-Z) 2: the job ended in ${waited} s (limit 30 s) naming the rank and signal 9"
    else
        fail "(a) a rank killed with SIGKILL at $mesh 2 (exit '$rc' after $waited s)" "$T/kill_$mesh.log"
    fi
    r=$(ranks kill_$mesh); [ -n "$r" ] && kill -9 $r 2>/dev/null
done

# ---- (b) the writer killed while saving ------------------------------------------------------------
mid="--layers 4 --hidden 256 --heads 4 --batch 2 --seq-len 16 --seed 5"
for delay in 0.05 0.3 0.9; do
    d="$T/save_$delay"
    ready="^saved"
    start save_$delay --text "$text" $mid --tp 2 --steps 1000000 --save "$d" --save-every 1
    sleep "$delay"
    pid=$(ranks save_$delay | head -1)
    [ -n "$pid" ] && kill -9 $(ranks save_$delay)
    waitrc save_$delay 60 > /dev/null
    bad=0 tmp=0 newest=""
    for c in "$d"/step-*; do
        [ -d "$c" ] || continue
        for f in model.safetensors optim.safetensors; do
            [ -f "$c/$f" ] && ! "$fx" check "$c/$f" > /dev/null 2>&1 && { echo "    partial file under a final name: $c/$f"; bad=1; }
        done
        tmp=$((tmp + $(ls "$c" | grep -c '\.tmp\.')))
        [ -f "$c/config.json" ] && newest="$c" # config.json is written last
    done
    newest=$(for c in "$d"/step-*; do [ -f "$c/config.json" ] && echo "$c"; done | sort -t- -k2 -n | tail -1)
    out=$(timeout 120 mpirun $mpiflags -np 1 "$B/gpt2_train" --eval-only --load "$newest" --text "$text" --batch 2 --seq-len 16 --eval-batches 1 2>&1)
    if [ -n "$newest" ] && [ $bad -eq 0 ] && printf '%s\n' "$out" | grep -q '^val_loss'; then
        ok "(b) writer killed ${delay} s into saving every step: no partial file under a final name ($tmp temporaries left), the newest complete checkpoint $(basename "$newest") loads"
    else
        fail "(b) writer killed ${delay} s into saving every step (newest '$newest')" "$T/save_$delay.log"
        printf '%s\n' "$out" | tail -3 | sed 's/^/    /'
    fi
done

# ---- (c) the disk full during a save ------------------------------------------------------------------
c="$T/full"
timeout 120 mpirun $mpiflags -np 2 "$B/gpt2_train" --text "$text" $small --tp 2 --steps 2 --save "$c" > "$T/full0.log" 2>&1
before=$(cat "$c"/*.safetensors "$c"/config.json 2>/dev/null | cksum)
# the limit on the ranks only (64 blocks: below one checkpoint file); TCP between the ranks, since
# shared-memory transports extend files of their own
out=$(timeout 120 mpirun $mpiflags --mca btl self,tcp -np 2 sh -c "ulimit -f 64 && exec $B/gpt2_train --text $text $small --tp 2 --steps 4 --load $c --save $c" 2>&1)
rc=$?
after=$(cat "$c"/*.safetensors "$c"/config.json 2>/dev/null | cksum)
n=$(printf '%s\n' "$out" | grep -c '^gpt2_train: error: ')
load=$(timeout 120 mpirun $mpiflags -np 1 "$B/gpt2_train" --eval-only --load "$c" --text "$text" --batch 2 --seq-len 16 --eval-batches 1 2>&1)
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && printf '%s\n' "$out" | grep -q "File too large" && [ "$before" = "$after" ] &&
   printf '%s\n' "$load" | grep -q '^val_loss' && ! ls "$c" | grep -q '\.tmp\.'; then
    ok "(c) the disk full during a save: one error line (File too large), the previous checkpoint unchanged and loadable, no temporary left"
else
    echo "$out" > "$T/full.log"
    fail "(c) the disk full during a save (exit $rc, $n error lines, checkpoint $( [ "$before" = "$after" ] && echo unchanged || echo CHANGED))" "$T/full.log"
fi

# ---- (e) a rank stopped mid-training ------------------------------------------------------------
for mesh in tp dp; do
    [ $mesh = tp ] && m="--tp 2" || m="--tp 1"
    ready="^step"
    start stop_$mesh --text "$text" $small $m --steps 1000000 --timeout 5
    pid=$(ranks stop_$mesh | tail -1)
    if [ -z "$pid" ]; then fail "(e) rank stopped at $mesh 2: the run did not start" "$T/stop_$mesh.log"; continue; fi
    kill -STOP "$pid"
    waited=$(waitrc stop_$mesh $((60 * scale)))
    rc=$(cat "$T/stop_$mesh.rc" 2>/dev/null)
    n=$(grep -c "^gpt2_train: error: .*no answer from a peer within 5 s" "$T/stop_$mesh.log")
    gone=1; kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ] && gone=0
    if [ -n "$rc" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$n" -eq 1 ] && [ "$waited" -le $((5 + 15 * scale)) ] && [ $gone -eq 1 ]; then
        ok "(e) a rank stopped with SIGSTOP at $(echo $mesh | tr a-z A-Z) 2 (--timeout 5): the live rank's one error line, exit $rc after ${waited} s (limit $((5 + 15 * scale)) s), the stopped rank gone"
    else
        fail "(e) a rank stopped with SIGSTOP at $mesh 2 (exit '$rc' after $waited s, $n error lines, stopped rank gone: $gone)" "$T/stop_$mesh.log"
    fi
    kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null
    r=$(ranks stop_$mesh); [ -n "$r" ] && kill -9 $r 2>/dev/null
done
