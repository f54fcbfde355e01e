#!/usr/bin/env bash
# A real two-node SLURM cluster on this machine, one job submitted with `sbatch --wait`, torn down.
#
#   bash tests/multiproc/slurm_two_hosts.sh [SBATCH_FILE]
#       (default tests/multiproc/slurm_smoke.sbatch; needs root)
#
# Layout (after the team's SLURM reference, section 2): network namespaces
#   ddpslurm-net-<id>:   br0 (bridge, no address) + v1, v2
#   ddpslurm-node1-<id>: eth0 10.77.0.1/24 -> slurmctld + slurmd -N node1
#   ddpslurm-node2-<id>: eth0 10.77.0.2/24 -> slurmd -N node2
# Each daemon is entered with `nsenter --net=/run/netns/... unshare --mount --uts`, binds a hosts
# file (node1, node2) over /etc/hosts in its own mount namespace and sets its hostname; jobs
# inherit that. munged runs in the root namespace on a private socket (AuthInfo=socket=...), so
# nothing of a system munged is touched. slurm.conf is a temporary file named by SLURM_CONF;
# /etc/slurm is not touched. Clients (sbatch, srun, squeue, sinfo, scontrol, scancel) are wrappers
# first on PATH that enter node1's namespaces when called from the root namespace.
# <id> is this script's pid; everything it makes lives in /tmp/ddp-slurm-<id> and is removed at
# the end (daemons are ended by pid). Safety: `ip route replace unreachable 10.77.0.0/24` in the root
# namespace before anything else, removed at the end (see tests/multiproc/netns_two_hosts.sh).
#
# The job runs with its working directory at the repository root (the work tree and /tmp are shared
# by both "nodes"), its output in the temporary folder. It must exit 0; with the default smoke job
# the output must also show "Out of bounds values : 0 OK", "world size 4" and ranks on node1 and
# node2. For another job, SLURM_TWO_HOSTS_EXPECT holds extended regular expressions, one a line,
# that the output must match; SLURM_TWO_HOSTS_NAME renames the case (default slurm_two_hosts);
# SLURM_TWO_HOSTS_TIMEOUT bounds sbatch --wait (default 60 s). SLURM_TWO_HOSTS_KEEP_OUTPUT=FILE
# copies the job's output there.
# portable-lint: linux-only (network namespaces, SLURM daemons): without root or ip it skips, with the reason.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NAME=${SLURM_TWO_HOSTS_NAME:-slurm_two_hosts}
JOBFILE=${1:-tests/multiproc/slurm_smoke.sbatch}
SUBNET=10.77.0.0/24
JOB_TIMEOUT=${SLURM_TWO_HOSTS_TIMEOUT:-60}
ID=$$
PREFIX=ddpslurm-
NSNET=${PREFIX}net-$ID NS1=${PREFIX}node1-$ID NS2=${PREFIX}node2-$ID
T=/tmp/ddp-slurm-$ID
UP=0
PIDS=()           # daemons started here: munged slurmctld slurmd(node1) slurmd(node2)

skip() { echo "skip $NAME: $1"; exit 0; }
fail() { echo "FAIL $NAME"; local l; for l in "$@"; do printf '%s\n' "$l" | sed 's/^/    /'; done; }

cd "$ROOT" || exit 1
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, daemons)"
command -v ip >/dev/null 2>&1 || skip "the ip command is missing (apt-get install iproute2)"
for t in nsenter unshare setpriv flock; do
    command -v $t >/dev/null 2>&1 || skip "$t is missing (util-linux)"
done
missing=""
for t in slurmctld slurmd sbatch munged; do
    command -v $t >/dev/null 2>&1 || [ -x /usr/sbin/$t ] || missing="$missing $t"
done
[ -z "$missing" ] || skip "not installed:$missing (apt-get install --no-install-recommends slurmctld slurmd slurm-client munge)"
[ -r /etc/munge/munge.key ] || skip "no /etc/munge/munge.key (reinstall the munge package)"
id munge >/dev/null 2>&1 || skip "no munge user (reinstall the munge package)"
[ -f "$JOBFILE" ] || { fail "no batch script $JOBFILE"; exit 1; }
JOBFILE=$(cd "$(dirname "$JOBFILE")" && pwd)/$(basename "$JOBFILE")
REAL_SBATCH=$(command -v sbatch)
SLURMCTLD=$(command -v slurmctld || echo /usr/sbin/slurmctld)
SLURMD=$(command -v slurmd || echo /usr/sbin/slurmd)
MUNGED=$(command -v munged || echo /usr/sbin/munged)
CLIENT_DIR=$(dirname "$REAL_SBATCH")

# the route, stale-run cleanup and the namespace helpers are shared with the netns test
# shellcheck source=tests/multiproc/netns_two_hosts.sh
. "$ROOT/tests/multiproc/netns_two_hosts.sh"

teardown() {
    [ $UP = 1 ] || return 0
    local p i ns alive all=""
    # every process in our namespaces now, to wait below until PID 1 has reaped them too
    for ns in "$NS1" "$NS2" "$NSNET"; do all="$all $(ip netns pids "$ns" 2>/dev/null)"; done
    # daemons first, by pid (slurmd ends its job steps), then whatever is left in the namespaces
    for p in "${PIDS[@]:1}"; do kill -TERM "$p" 2>/dev/null; done
    for i in $(seq 1 30); do
        alive=""; for p in "${PIDS[@]:1}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break; sleep 0.1
    done
    for p in "${PIDS[@]:1}"; do kill -KILL "$p" 2>/dev/null; done
    for ns in "$NS1" "$NS2" "$NSNET"; do
        [ -e "/run/netns/$ns" ] || continue
        multihost_ns_kill "$ns"
        ip netns del "$ns" 2>/dev/null
    done
    if [ ${#PIDS[@]} -gt 0 ]; then
        kill -TERM "${PIDS[0]}" 2>/dev/null
        for i in $(seq 1 30); do kill -0 "${PIDS[0]}" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "${PIDS[0]}" 2>/dev/null
    fi
    wait 2>/dev/null
    # children of the daemons (slurmscriptd, slurmstepd) were reparented to PID 1 when their daemon
    # ended; wait (at most 5 s) until they are gone, so that no slurm process is seen after the test
    for i in $(seq 1 50); do
        alive=""; for p in $all; do [ -e "/proc/$p" ] && alive=1; done
        [ -z "$alive" ] && break; sleep 0.1
    done
    multihost_route_release "$SUBNET"
    rm -rf "$T"
    UP=0
}
trap teardown EXIT
trap 'teardown; exit 130' INT TERM

# leftovers of runs that crashed: their munged (in the root namespace) and their folders
clean_stale() {
    local d pid mp
    for d in /tmp/ddp-slurm-*; do
        [ -d "$d" ] || continue
        pid=${d##*-}
        case $pid in ''|*[!0-9]*) continue ;; esac
        kill -0 "$pid" 2>/dev/null && continue
        if [ -r "$d/munge/munged.pid" ]; then
            mp=$(cat "$d/munge/munged.pid")
            if [ -n "$mp" ] && [ "$(cat /proc/"$mp"/comm 2>/dev/null)" = munged ] &&
               tr '\0' ' ' </proc/"$mp"/cmdline 2>/dev/null | grep -q -- "$d/"; then
                kill -TERM "$mp" 2>/dev/null
            fi
        fi
        rm -rf "$d"
    done
    multihost_clean_stale "$PREFIX"
}

# 1. safety route first
err=$(multihost_route_hold "$SUBNET" 2>&1) || { multihost_route_release "$SUBNET"; skip "cannot add the safety route 'unreachable $SUBNET': $err"; }
UP=1
start=$(date +%s.%N)
clean_stale

# 2. namespaces: a bridge in a third one, a veth to each node
if ! err=$( { ip netns add "$NSNET" && ip -n "$NSNET" link add br0 type bridge && ip -n "$NSNET" link set br0 up &&
    for i in 1 2; do
        ns=${PREFIX}node$i-$ID
        ip netns add "$ns" &&
        ip -n "$NSNET" link add v$i type veth peer name eth0 netns "$ns" &&
        ip -n "$NSNET" link set v$i master br0 up &&
        ip -n "$ns" addr add 10.77.0.$i/24 dev eth0 &&
        ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up || exit 1
    done; } 2>&1); then
    skip "cannot build the network namespaces: $err"
fi

# 3. files: config, hosts, per-node directories, client wrappers
mkdir -p "$T" && chmod 755 "$T"
mkdir -p "$T/run" "$T/ctld" "$T/log" "$T/spool.node1" "$T/spool.node2" "$T/bin" "$T/munge"
install -d -m 1777 "$T/tmp.node1" "$T/tmp.node2"
chown munge:munge "$T/munge"; chmod 755 "$T/munge"   # munged wants the socket folder executable by all
printf '127.0.0.1 localhost\n10.77.0.1 node1\n10.77.0.2 node2\n' > "$T/hosts"
export SLURM_CONF=$T/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=ddptest
SlurmctldHost=node1(10.77.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/munge.socket.2
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
EnforcePartLimits=ALL
MinJobAge=4
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd.%n.pid
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/spool.%n
TmpFS=$T/tmp.%n
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.%n.log
PlugStackConfig=$T/plugstack.conf
NodeName=node1 NodeAddr=10.77.0.1 NodeHostname=node1 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=node2 NodeAddr=10.77.0.2 NodeHostname=node2 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
: > "$T/plugstack.conf"
ROOTNET=$(readlink /proc/self/ns/net)
for c in sbatch srun squeue sinfo scontrol scancel; do
    cat > "$T/bin/$c" <<EOF
#!/bin/sh
# in the root namespace: run inside node1's namespaces (never talk to 10.77.0.x from here)
if [ "\$(readlink /proc/self/ns/net)" = "$ROOTNET" ]; then
    exec nsenter --net=/run/netns/$NS1 unshare --mount --uts -- \\
        sh -c 'mount --bind "$T/hosts" /etc/hosts && hostname node1 && exec "\$0" "\$@"' "$CLIENT_DIR/$c" "\$@"
fi
exec "$CLIENT_DIR/$c" "\$@"
EOF
    chmod 755 "$T/bin/$c"
done
export PATH=$T/bin:$PATH

# on NODE CMD...: run CMD in NODE's network namespace, in a new mount + UTS namespace with the
# hosts file and the node's hostname. nsenter, unshare and sh all exec, so $! is CMD's pid.
on() {
    local n=$1; shift
    nsenter --net=/run/netns/${PREFIX}$n-$ID unshare --mount --uts -- \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"' "$n" "$T/hosts" "$@"
}

# 4. daemons: munged (root namespace, private socket), slurmctld + slurmd on node1, slurmd on node2
setpriv --reuid=munge --regid=munge --init-groups "$MUNGED" -F \
    --socket="$T/munge/munge.socket.2" --pid-file="$T/munge/munged.pid" \
    --log-file="$T/munge/munged.log" --seed-file="$T/munge/munged.seed" >"$T/log/munged.out" 2>&1 &
PIDS+=($!)
for i in $(seq 1 50); do [ -S "$T/munge/munge.socket.2" ] && break; sleep 0.1; done
[ -S "$T/munge/munge.socket.2" ] || skip "munged did not start: $(tail -n 3 "$T/log/munged.out" "$T/munge/munged.log" 2>/dev/null | tr '\n' ' ')"
on node1 "$SLURMCTLD" -D -c >"$T/log/slurmctld.out" 2>&1 &
PIDS+=($!)
on node1 "$SLURMD" -D -N node1 >"$T/log/slurmd.node1.out" 2>&1 &
PIDS+=($!)
on node2 "$SLURMD" -D -N node2 >"$T/log/slurmd.node2.out" 2>&1 &
PIDS+=($!)

# 5. both nodes idle within 20 s
idle=""
for i in $(seq 1 100); do
    st=$(timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$st" = "node1 idle node2 idle " ] && { idle=1; break; }
    sleep 0.2
done
if [ -z "$idle" ]; then
    echo "skip $NAME: the cluster did not come up within 20 s (sinfo: ${st:-nothing})"
    tail -n 4 "$T/log/slurmctld.log" "$T/log/slurmd.node1.log" "$T/log/slurmd.node2.log" 2>/dev/null | sed 's/^/    /'
    exit 0
fi
up_s=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}")

# 6. the job
OUT=$T/job.out
t0=$(date +%s.%N)
timeout -k 5 "$JOB_TIMEOUT" sbatch --wait --chdir="$ROOT" --output="$OUT" --job-name=ddp-two-hosts "$JOBFILE" >"$T/sbatch.out" 2>&1
rc=$?
job_s=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")
[ -n "${SLURM_TWO_HOSTS_KEEP_OUTPUT:-}" ] && cp "$OUT" "$SLURM_TWO_HOSTS_KEEP_OUTPUT" 2>/dev/null

if [ -n "${SLURM_TWO_HOSTS_EXPECT:-}" ]; then
    expect=$SLURM_TWO_HOSTS_EXPECT
elif [ "$JOBFILE" = "$ROOT/tests/multiproc/slurm_smoke.sbatch" ]; then
    expect=$'Out of bounds values : 0 OK\nworld size 4\nRank +[0-9]+ Pid +[0-9]+ on +node1 \nRank +[0-9]+ Pid +[0-9]+ on +node2 '
else
    expect=""
fi
why=()
if [ $rc = 124 ] || [ $rc = 137 ]; then why+=("sbatch --wait did not return within $JOB_TIMEOUT s")
elif [ $rc != 0 ]; then why+=("sbatch --wait exited with status $rc (the job's exit status)"); fi
while IFS= read -r pat; do
    [ -n "$pat" ] || continue
    grep -qE -- "$pat" "$OUT" 2>/dev/null || why+=("no line matching \"$pat\" in the job's output")
done <<<"$expect"
if [ ${#why[@]} = 0 ]; then
    echo "ok   $NAME (cluster up in $up_s s, job $job_s s)"
    teardown
    exit 0
fi
fail "${why[@]}" "sbatch: $(tail -n 3 "$T/sbatch.out" 2>/dev/null)" "job output (tail):" \
    "$(tail -n 12 "$OUT" 2>/dev/null)" "slurmctld.log (tail):" "$(tail -n 4 "$T/log/slurmctld.log" 2>/dev/null)"
teardown
exit 1
