#!/bin/sh
# tests/slurm.sh — the trainer launched by a real Slurm: a single-node cluster on localhost (a
# generated slurm.conf, munged on a socket of its own, slurmctld and slurmd in the foreground, all
# started here as root and stopped by their PIDs), then
#   srun --mpi=pmix -n 4 build/train --tp 2 ... (TP 2 x DP 2, Slurm's PMIx starting the ranks)
# whose step lines (loss, grad norm) must equal those of mpirun -np 4 with the same flags, and the
# same again inside an allocation (salloc -n 4 mpirun ...: Open MPI reads the allocation); the
# documentation's batch script (docs/slurm/train.sbatch: build/plan, then build/train --plan under
# srun) submitted with sbatch --wait on 1 node x 4 ranks, its steps and checkpoint; and a
# rank stopped (SIGSTOP, by its PID) under srun with --timeout 5: the job ends within 5 s plus a
# margin and the live ranks' flight recorder names the stopped rank (its global task ID) as the one
# that never reached a collective numbered #N. (A rank killed under srun --mpi=pmix ends the step
# at once: Slurm's PMIx plugin cancels it when a task dies, and srun names the task.)
# When Slurm cannot run here (not root, a daemon missing, munged or slurmctld failing to start,
# the node never idle) it prints one "SKIP slurm: <why>" line and exits 0. `make test-slurm`
# installs Debian's slurmctld, slurmd, slurm-client and munge first (as make deps does).
# Prints "ok <name>" / "FAIL <name>" lines like the other scripts.
. "$(dirname "$0")/common.sh"
setup slurm
T=$(cd "$T" && pwd) # absolute: the daemons change directory
skip() { echo "SKIP slurm: $1"; [ -n "$2" ] && [ -f "$2" ] && tail -5 "$2" | sed 's/^/    /'; exit 0; }
fail() { echo "FAIL $1"; [ -n "$2" ] && tail -12 "$2" | sed 's/^/    /'; }

[ "$(id -u)" = 0 ] || skip "not root: the test starts slurmctld, slurmd and munged itself"
for p in munged slurmctld slurmd srun salloc sinfo; do
    command -v "$p" > /dev/null 2>&1 || [ -x "/usr/sbin/$p" ] ||
        skip "$p is not installed (make test-slurm installs Debian's slurmctld, slurmd, slurm-client, munge)"
done
PATH=$PATH:/usr/sbin
[ -x "$B/train" ] || skip "$B/train is not built"
srun --mpi=list 2>&1 | grep -q pmix || true # (its answer needs a configuration: checked below)

pids=""
# stop NAME PID: the daemon stopped by its PID (TERM, then KILL after 5 s)
stop() {
    kill "$2" 2> /dev/null || return 0
    i=0
    while kill -0 "$2" 2> /dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$2" 2> /dev/null
    wait "$2" 2> /dev/null
}
cleanup() {
    [ -n "$kbg" ] && kill "$kbg" 2> /dev/null # the stopped-rank run's background shell
    if [ -n "$ctld" ]; then # this cluster's jobs cancelled (by ID), then their steps' end awaited
        for j in $(squeue -h -o %i 2> /dev/null); do scancel "$j" 2> /dev/null; done
        i=0
        while [ -n "$(squeue -h -o %i 2> /dev/null)" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        i=0 # and their slurmstepd gone (each holds a socket in the spool directory)
        while ls "$T/spool" 2> /dev/null | grep -q '_[0-9]*\.' && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    fi
    [ -n "$ctld" ] && stop slurmctld "$ctld"
    [ -n "$sd" ] && stop slurmd "$sd"
    [ -n "$mg" ] && stop munged "$mg"
}
trap cleanup EXIT INT TERM

# ---- munge: a key and a socket of this test's own ---------------------------------------------
mkdir -p "$T/munge" "$T/state" "$T/spool" && chmod 700 "$T/munge"
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 2> /dev/null && chmod 400 "$T/munge/munge.key"
sock=$T/munge/munge.sock
munged --foreground --force --socket="$sock" --key-file="$T/munge/munge.key" \
    --pid-file="$T/munge/munged.pid" --log-file="$T/munge/munged.log" --seed-file="$T/munge/seed" \
    > "$T/munge/out.log" 2>&1 &
mg=$!
i=0
while [ ! -S "$sock" ] && kill -0 "$mg" 2> /dev/null && [ $i -lt $((100 * scale)) ]; do sleep 0.1; i=$((i + 1)); done
[ -S "$sock" ] || { cat "$T/munge/out.log" >> "$T/munge/munged.log" 2>/dev/null; skip "munged did not start (no socket $sock)" "$T/munge/munged.log"; }

# ---- slurm.conf: this host, 4 CPUs whatever the hardware, ports of its own ----------------------
host=$(hostname -s)
port=$((17000 + $$ % 2000))
cat > "$T/slurm.conf" << EOF
ClusterName=tpktest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
KillOnBadExit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
: > "$T/plugstack.conf"
# the PMIx plugin's directories for the ranks under this test's own (by default it uses
# /tmp/spmix_appdir_UID_JOB.STEP, and job numbers start at 1 again with every new cluster)
mkdir -p "$T/pmix" && echo "PMIxCliTmpDirBase=$T/pmix" > "$T/mpi.conf"
echo "PlugStackConfig=$T/plugstack.conf" >> "$T/slurm.conf"
export SLURM_CONF=$T/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" > "$T/slurmctld.out" 2>&1 &
ctld=$!
slurmd -D -f "$SLURM_CONF" -N "$host" > "$T/slurmd.out" 2>&1 &
sd=$!
t0=$(date +%s)
i=0
state=""
while [ $i -lt $((300 * scale)) ]; do
    kill -0 "$ctld" 2> /dev/null || { cat "$T/slurmctld.out" >> "$T/slurmctld.log"; skip "slurmctld exited at its start" "$T/slurmctld.log"; }
    kill -0 "$sd" 2> /dev/null || { cat "$T/slurmd.out" >> "$T/slurmd.log"; skip "slurmd exited at its start" "$T/slurmd.log"; }
    state=$(sinfo -h -n "$host" -o %t 2> /dev/null | head -1)
    case "$state" in idle*) break ;; esac
    sleep 0.1
    i=$((i + 1))
done
case "$state" in idle*) ;; *) skip "the node never became idle within $((30 * scale)) s (state '$state')" "$T/slurmd.log" ;; esac
srun --mpi=list 2>&1 | grep -q pmix || skip "srun lists no pmix plugin (srun --mpi=list)"
echo "slurm: single-node cluster up in $(($(date +%s) - t0)) s (Slurm $(sinfo -V | awk '{print $2}'), node $host idle)"

# ---- the same run under mpirun, srun and salloc + mpirun ------------------------------------------
args="--text $text $small --tp 2 --steps 10 --log-every 1"
# losses FILE: the step lines' step, loss and grad norm
losses() { grep '^step' "$1" | cut -d'|' -f1-3; }
t1=$(date +%s)
timeout $((300 * scale)) mpirun $mpiflags -np 4 "$B/train" $args > "$T/mpirun.log" 2>&1
rc=$? t_m=$(($(date +%s) - t1))
[ $rc -eq 0 ] && [ "$(losses "$T/mpirun.log" | wc -l)" -eq 10 ] || fail "mpirun -np 4 reference run (exit $rc)" "$T/mpirun.log"

t1=$(date +%s)
timeout $((300 * scale)) srun --mpi=pmix -n 4 --oversubscribe --export=ALL "$B/train" $args > "$T/srun.log" 2>&1
rc=$? t_s=$(($(date +%s) - t1))
if [ $rc -eq 0 ] && grep -q "4 ranks = TP 2 x DP 2" "$T/srun.log" && [ "$(losses "$T/srun.log" | wc -l)" -eq 10 ] &&
    [ "$(losses "$T/srun.log")" = "$(losses "$T/mpirun.log")" ]; then
    ok "slurm: srun --mpi=pmix -n 4 build/train --tp 2 (TP 2 x DP 2): the 10 steps' losses and norms equal mpirun's ($t_s s; mpirun $t_m s)"
else
    fail "slurm: srun --mpi=pmix -n 4 build/train --tp 2 (exit $rc; losses equal: $([ "$(losses "$T/srun.log")" = "$(losses "$T/mpirun.log")" ] && echo yes || echo no))" "$T/srun.log"
    losses "$T/mpirun.log" | sed 's/^/    mpirun: /'
fi

t1=$(date +%s)
timeout $((300 * scale)) salloc -n 4 --oversubscribe mpirun $mpiflags "$B/train" $args > "$T/salloc.log" 2>&1
rc=$? t_a=$(($(date +%s) - t1))
if [ $rc -eq 0 ] && grep -q "4 ranks = TP 2 x DP 2" "$T/salloc.log" && [ "$(losses "$T/salloc.log")" = "$(losses "$T/mpirun.log")" ]; then
    ok "slurm: salloc -n 4 mpirun build/train --tp 2 (Open MPI in the allocation): the losses equal plain mpirun's ($t_a s)"
else
    fail "slurm: salloc -n 4 mpirun build/train --tp 2 (exit $rc)" "$T/salloc.log"
fi

# ---- the documentation's batch script, submitted: docs/slurm/train.sbatch on 1 node x 4 ranks ----
t1=$(date +%s)
MODEL="--layers 2 --hidden 32 --heads 4 --seq-len 16 --batch 4" timeout $((300 * scale)) sbatch --wait --nodes=1 --ntasks-per-node=4 --gpus-per-node=0 --cpus-per-task=1 \
    --time=10 --output="$T/sbatch.out" --export="ALL,BIN=$B,SAVE=$T/sbatch-ckpt" \
    docs/slurm/train.sbatch --text "$text" --steps 4 --lr 3e-3 --warmup 2 --seed 3 > "$T/sbatch.log" 2>&1
rc=$? t_b=$(($(date +%s) - t1))
cat "$T/sbatch.out" >> "$T/sbatch.log" 2> /dev/null
if [ $rc -eq 0 ] && grep -q "^train: 4 ranks" "$T/sbatch.log" && grep -q "^step *4/4" "$T/sbatch.log" &&
    grep -q "^plan: " "$T/sbatch.log" && [ -f "$T/sbatch-ckpt/config.json" ]; then
    ok "slurm: sbatch docs/slurm/train.sbatch (1 node x 4 ranks): the planner's table, 4 steps under --plan ($(grep -m1 '^train: 4 ranks' "$T/sbatch.log" | sed 's/^train: 4 ranks = //; s/,.*//')), the checkpoint ($t_b s)"
else
    fail "slurm: sbatch docs/slurm/train.sbatch (exit $rc)" "$T/sbatch.log"
fi

# ---- a rank stopped under srun: the flight recorder names it --------------------------------------
rm -f "$T/stop.rc"
(timeout $((300 * scale)) srun --mpi=pmix -n 4 --oversubscribe --kill-on-bad-exit=0 --export=ALL \
    "$B/train" --text "$text" $small --tp 2 --steps 1000000 --timeout 5 > "$T/stop.log" 2>&1
 echo $? > "$T/stop.rc") &
kbg=$!
i=0
while [ $i -lt $((600 * scale)) ] && [ ! -s "$T/stop.rc" ] && ! grep -q '^step' "$T/stop.log" 2>/dev/null; do
    sleep 0.1; i=$((i + 1))
done
# the step's task PIDs from slurmd (scontrol listpids: PID JOBID STEPID LOCALID GLOBALID): the
# last rank's process, its global ID the world rank
set -- $(scontrol listpids 2> /dev/null | awk '$5 ~ /^[0-9]+$/ { print $1, $5 }' | while read -r p g; do
    [ "$(ps -o comm= -p "$p" 2> /dev/null)" = train ] && echo "$g $p"; done | sort -n | tail -1)
v=$1 pid=$2
if [ -z "$pid" ] || [ -z "$v" ]; then
    fail "slurm: a rank stopped under srun: the run did not start" "$T/stop.log"
else
    sleep 0.5
    kill -STOP "$pid"
    i=0
    while [ $i -lt $((600 * scale)) ] && [ ! -s "$T/stop.rc" ]; do sleep 0.1; i=$((i + 1)); done
    waited=$((i / 10)) rc=$(cat "$T/stop.rc" 2> /dev/null)
    line=$(grep -m1 "^rank [0-9]*: rank $v never reached .*#[0-9]" "$T/stop.log")
    if [ -n "$rc" ] && [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ -n "$line" ] && [ $waited -le $((5 + 15 * scale)) ]; then
        ok "slurm: rank $v stopped (SIGSTOP) under srun (--timeout 5): the job ended in $waited s (limit $((5 + 15 * scale)) s), '$(echo "$line" | cut -c1-100)'"
    else
        fail "slurm: rank $v stopped under srun (exit '$rc' after $waited s, naming line '$line')" "$T/stop.log"
    fi
    kill -CONT "$pid" 2> /dev/null
fi
