#!/usr/bin/env bash
# Peer benchmark for issue #13: Debian's Slurm (slurmctld + NODES slurmd with
# 8 fake GPUs each, high-throughput tuning) against `framespool bench pipeline`
# on the same machine, in the same run. Debian, as root. Not part of CI.
#
#   compose/slurm-peer/run.sh [FRAMESPOOL_BIN]
#
# Environment: JOBS (2000), SUBMITTERS (4), NODES (16), GPUS (8 per node),
# FS_NODES (32), FS_NODES_PER_AGENT (8), KEEP_TMP=1 keeps the temp dir (logs).
set -euo pipefail

FRAMESPOOL=${1:-.venv/bin/framespool}
JOBS=${JOBS:-2000}
SUBMITTERS=${SUBMITTERS:-4}
NODES=${NODES:-16}
GPUS=${GPUS:-8}
FS_NODES=${FS_NODES:-32}
FS_NODES_PER_AGENT=${FS_NODES_PER_AGENT:-8}

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 2; }
[ -x "$FRAMESPOOL" ] || { echo "no framespool binary at $FRAMESPOOL" >&2; exit 2; }
FRAMESPOOL=$(readlink -f "$FRAMESPOOL")

# 1. packages (the only thing left behind).
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q slurm-wlm munge
fi
# The Debian packages may start their services on install; this run wants its
# own daemons only.
if pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null; then
    echo "a slurmctld/slurmd is already running here; stop it first" >&2
    exit 2
fi

TMP=$(mktemp -d /tmp/slurm-peer.XXXXXX)
PIDS=()
MUNGE_STARTED=0
cleanup() {
    set +e
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
    done
    if [ "$MUNGE_STARTED" = 1 ] && [ -f "$TMP/munged.pid" ]; then
        # and wait for it to be gone: a run started right after this one would
        # otherwise find it still exiting and fail to start its own
        munge_pid=$(cat "$TMP/munged.pid")
        kill "$munge_pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$munge_pid" 2>/dev/null || break; sleep 0.1; done
    fi
    if [ "${KEEP_TMP:-0}" = 1 ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT INT TERM

# munge: use a running munged, else start one on a private socket.
export SLURM_CONF=$TMP/slurm.conf
MUNGE_SOCKET=/run/munge/munge.socket.2
if ! pgrep -x munged >/dev/null; then
    [ -s /etc/munge/munge.key ] || { echo "no /etc/munge/munge.key" >&2; exit 2; }
    MUNGE_SOCKET=$TMP/munge.socket
    mkdir -p "$TMP/munge"
    chown munge: "$TMP" "$TMP/munge" 2>/dev/null || true
    # munged runs as root here (--force: root-owned dirs are fine for a bench).
    munged --force --socket="$MUNGE_SOCKET" --pid-file="$TMP/munged.pid" \
        --seed-file="$TMP/munge/seed" --log-file="$TMP/munged.log" ||
        { echo "munged did not start; see $TMP/munged.log (KEEP_TMP=1)" >&2; exit 1; }
    MUNGE_STARTED=1
fi

# 2. configuration: NODES nodes on localhost, GPUS fake GPUs each.
mkdir -p "$TMP/ctld" "$TMP/log"
for i in $(seq "$NODES"); do mkdir -p "$TMP/d/node$i"; done
PORT0=$((17000 + RANDOM % 20000))
{
    echo "ClusterName=peer"
    echo "SlurmctldHost=localhost"
    echo "SlurmctldPort=$PORT0"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$MUNGE_SOCKET"
    echo "StateSaveLocation=$TMP/ctld"
    echo "SlurmdSpoolDir=$TMP/d/%n"
    echo "SlurmctldPidFile=$TMP/slurmctld.pid"
    echo "SlurmdPidFile=$TMP/d/%n/slurmd.pid"
    echo "SlurmctldLogFile=$TMP/log/slurmctld.log"
    echo "SlurmdLogFile=$TMP/log/slurmd-%n.log"
    echo "SlurmctldDebug=${SLURM_DEBUG:-error}"
    echo "SlurmdDebug=${SLURM_DEBUG:-error}"
    # High-throughput tuning (slurm.schedmd.com/high_throughput.html): no
    # accounting, no per-job process tracking or task plugins, schedule in
    # batches rather than at each submit, purge finished jobs quickly.
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "JobCompType=jobcomp/none"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SwitchType=switch/none"
    echo "MpiDefault=none"
    echo "SchedulerType=sched/backfill"
    echo "SchedulerParameters=defer,batch_sched_delay=3,sched_min_interval=100000,default_queue_depth=1000,bf_interval=1,bf_continue,max_rpc_cnt=150"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MinJobAge=2"
    echo "MaxJobCount=100000"
    echo "MessageTimeout=30"
    echo "ReturnToService=2"
    echo "SlurmdParameters=config_overrides"
    echo "GresTypes=gpu"
    for i in $(seq "$NODES"); do
        echo "NodeName=node$i NodeHostname=localhost Port=$((PORT0 + i)) CPUs=$GPUS RealMemory=1000 Gres=gpu:$GPUS State=UNKNOWN"
    done
    echo "PartitionName=gpu Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"
# Slurm drops a GPU without a device file, so each fake GPU is a /dev/null-like
# character device under the temp dir (shared by the nodes: nothing opens them).
mkdir -p "$TMP/dev"
for g in $(seq 0 $((GPUS - 1))); do mknod "$TMP/dev/gpu$g" c 1 3; done
{
    echo "AutoDetect=off"
    echo "NodeName=node[1-$NODES] Name=gpu File=$TMP/dev/gpu[0-$((GPUS - 1))]"
} >"$TMP/gres.conf"

# Daemons in the foreground (-D), in the background here, so that the trap
# knows every pid it must stop.
slurmctld -D -i -f "$SLURM_CONF" >"$TMP/log/slurmctld.out" 2>&1 &
PIDS+=($!)
for i in $(seq "$NODES"); do
    slurmd -D -N "node$i" -f "$SLURM_CONF" >"$TMP/log/slurmd-node$i.out" 2>&1 &
    PIDS+=($!)
done

# Wait until every node is idle.
for _ in $(seq 120); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge "$NODES" ] && break
    sleep 0.5
done
sinfo -N -o '%N %T %G' | head -n 5
idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
if [ "$idle" -lt "$NODES" ]; then
    echo "only $idle of $NODES nodes idle; see logs (KEEP_TMP=1)" >&2
    sinfo -N -o '%N %T %E' >&2
    tail -n 5 "$TMP"/log/*.out "$TMP"/log/*.log >&2 2>/dev/null || true
    exit 1
fi

# 3. JOBS trivial one-GPU jobs from SUBMITTERS parallel submitters.
submit() {
    local n=$1
    for _ in $(seq "$n"); do
        sbatch -Q --gres="gpu:1" -o /dev/null -e /dev/null --wrap true >/dev/null
    done
}
per=$((JOBS / SUBMITTERS))
echo "load before slurm: $(uptime)"
t0=$(date +%s.%N)
SUBS=()
for s in $(seq "$SUBMITTERS"); do
    n=$per
    [ "$s" = "$SUBMITTERS" ] && n=$((JOBS - per * (SUBMITTERS - 1)))
    submit "$n" &
    SUBS+=($!)
done
for pid in "${SUBS[@]}"; do wait "$pid"; done
t_submitted=$(date +%s.%N)
# Completion: no accounting here, so poll squeue (every 0.25 s) until no job is
# left unfinished; note jobs seen ending in any state but COMPLETED (MinJobAge
# keeps finished jobs listed for a few seconds, longer than the poll period).
: >"$TMP/bad"
while :; do
    squeue -h -t all -o '%i %T' >"$TMP/q"
    grep -v -E ' (COMPLETED|PENDING|RUNNING|COMPLETING|CONFIGURING)$' "$TMP/q" >>"$TMP/bad" || true
    grep -q -E ' (PENDING|RUNNING|COMPLETING|CONFIGURING)$' "$TMP/q" || break
    sleep 0.25
done
t1=$(date +%s.%N)
slurm_rate=$(echo "$JOBS / ($t1 - $t0)" | bc -l)
printf 'slurm: %d jobs, %d submitters, %d slurmd x %d GPUs: submitted in %.1f s, all done in %.1f s: %.1f jobs/s\n' \
    "$JOBS" "$SUBMITTERS" "$NODES" "$GPUS" "$(echo "$t_submitted - $t0" | bc -l)" \
    "$(echo "$t1 - $t0" | bc -l)" "$slurm_rate"
echo "slurm: jobs seen ending other than COMPLETED: $(cut -d' ' -f1 "$TMP/bad" | sort -u | wc -l)"

# Stop Slurm before framespool runs, so the two do not share the CPU.
cleanup_slurm() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
cleanup_slurm

# 4. framespool on the same machine, same run.
echo "load before framespool: $(uptime)"
"$FRAMESPOOL" bench pipeline --jobs "$JOBS" --nodes "$FS_NODES" \
    --nodes-per-agent "$FS_NODES_PER_AGENT" --json "$TMP/framespool.json"
fs_rate=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs_per_s"])' "$TMP/framespool.json")

printf '\nslurm      %8.1f jobs/s\nframespool %8.1f jobs/s\nratio      %8.1f x (target >= 10)\n' \
    "$slurm_rate" "$fs_rate" "$(echo "$fs_rate / $slurm_rate" | bc -l)"
uptime
