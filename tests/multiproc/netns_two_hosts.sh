#!/usr/bin/env bash
# Two "hosts" on one machine, each in its own network namespace, for multi-node tests.
#
#   as a test:     bash tests/multiproc/netns_two_hosts.sh [BUILD]      (default build; needs root, else skips)
#   as a library:  . tests/multiproc/netns_two_hosts.sh
#                  two_hosts_setup || { echo "skip mytest: $TWO_HOSTS_SKIP"; exit 0; }
#                  trap two_hosts_teardown EXIT
#                  two_hosts_run 'build/ddprun --nnodes 2 --node-rank {NODE_RANK} ... build/my_example'
#                  # -> $TWO_HOSTS_RC0 $TWO_HOSTS_RC1, outputs in $TWO_HOSTS_OUT0 $TWO_HOSTS_OUT1
#
# Layout: namespaces ddpnode1-<id> (10.77.0.1/24) and ddpnode2-<id> (10.77.0.2/24), joined by one
# veth pair created inside them (nothing is added to the root namespace's links), lo up in each.
# <id> is the pid of the shell that sourced/ran this file, so parallel runs cannot collide;
# namespaces with this prefix left by runs that are gone are removed first.
#
# Safety: before anything else, `ip route replace unreachable <subnet>` goes into the root
# namespace, so a program that by mistake runs outside the namespaces fails at once on this machine
# instead of sending packets to the default gateway. The route is removed at teardown, unless
# another live run still uses it (holders are counted under /run/ddp-multihost, under flock) or it
# was there before any of our runs.
#
# Settings (environment): TWO_HOSTS_SUBNET (a private /24, default 10.77.0.0/24),
# TWO_HOSTS_PREFIX (default ddpnode), TWO_HOSTS_PORT (rank 0's store port, default 29500),
# TWO_HOSTS_TIMEOUT (seconds per run, default 45), TWO_HOSTS_PEER_GRACE (see two_hosts_run).
# The test runs allreduce_perf under ddprun on both nodes; to run something else through the same
# test: TWO_HOSTS_CMD (a two_hosts_run template), TWO_HOSTS_EXPECT (extended regular expressions,
# one a line, that node 0's output must match; both nodes must exit 0), TWO_HOSTS_NAME (the case's
# name, default multinode_netns).
# portable-lint: linux-only (network namespaces): without the ip command it skips, with the reason.

: "${TWO_HOSTS_SUBNET:=10.77.0.0/24}"
: "${TWO_HOSTS_PREFIX:=ddpnode}"
: "${TWO_HOSTS_PORT:=29500}"
: "${TWO_HOSTS_TIMEOUT:=45}"
TWO_HOSTS_NET=${TWO_HOSTS_SUBNET%.*/24}     # 10.77.0
TWO_HOSTS_ADDR0=$TWO_HOSTS_NET.1           # node rank 0, the master
TWO_HOSTS_ADDR1=$TWO_HOSTS_NET.2
TWO_HOSTS_ID=$$
TWO_HOSTS_NS0=${TWO_HOSTS_PREFIX}1-$TWO_HOSTS_ID
TWO_HOSTS_NS1=${TWO_HOSTS_PREFIX}2-$TWO_HOSTS_ID
TWO_HOSTS_DIR=""
TWO_HOSTS_SKIP=""
TWO_HOSTS_UP=0
TWO_HOSTS_ETC_NETNS_NEW=0
MULTIHOST_STATE=${MULTIHOST_STATE:-/run/ddp-multihost}

# ---- the unreachable route, shared by every multi-host test on this machine ------------------
# multihost_route_hold SUBNET: add the route (first thing a test does) and count this run as a user.
multihost_route_hold() {
    local net=$1 key=${1//\//_}
    case $net in 10.*/24|192.168.*/24|172.1[6-9].*/24|172.2[0-9].*/24|172.3[01].*/24) ;;
        *) echo "multihost: $net is not a private /24" >&2; return 1 ;; esac
    mkdir -p "$MULTIHOST_STATE" || return 1
    (
        flock -w 30 9 || exit 1
        cur=$(ip -4 route show exact "$net" 2>/dev/null)
        if [ -n "$cur" ] && ! grep -q '^unreachable' <<<"$cur"; then
            echo "multihost: the root namespace routes $net ($cur); refusing to replace it" >&2; exit 1
        fi
        if ip -4 -o addr show 2>/dev/null | awk '{print $4}' | grep -q "^${net%.*/24}\."; then
            echo "multihost: this machine has an address in $net; choose another subnet" >&2; exit 1
        fi
        if [ -z "$cur" ]; then rm -f "$MULTIHOST_STATE/$key.external"
        elif ! compgen -G "$MULTIHOST_STATE/$key.[0-9]*" >/dev/null; then
            touch "$MULTIHOST_STATE/$key.external"      # someone else's route: never remove it
        fi
        ip route replace unreachable "$net" || exit 1
        echo "$net" > "$MULTIHOST_STATE/$key.$$"
    ) 9>"$MULTIHOST_STATE/lock"
}
# multihost_route_release SUBNET: stop counting this run; the last user removes the route.
multihost_route_release() {
    local net=$1 key=${1//\//_}
    [ -d "$MULTIHOST_STATE" ] || return 0
    (
        flock -w 30 9
        rm -f "$MULTIHOST_STATE/$key.$$"
        for f in "$MULTIHOST_STATE/$key".[0-9]*; do
            [ -e "$f" ] || continue
            kill -0 "${f##*.}" 2>/dev/null || rm -f "$f"       # holder from a run that is gone
        done
        if ! compgen -G "$MULTIHOST_STATE/$key.[0-9]*" >/dev/null && [ ! -e "$MULTIHOST_STATE/$key.external" ]; then
            ip route del unreachable "$net" 2>/dev/null
        fi
        exit 0
    ) 9>"$MULTIHOST_STATE/lock"
}
# multihost_ns_kill NS: end every process in namespace NS (TERM, then KILL), by pid.
multihost_ns_kill() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] || return 0
        sleep 0.2
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    sleep 0.1
}
# multihost_clean_stale PREFIX: remove namespaces PREFIX*-<pid> whose <pid> is no longer running.
multihost_clean_stale() {
    local prefix=$1 ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        case $ns in "$prefix"*-*) ;; *) continue ;; esac
        pid=${ns##*-}
        case $pid in ''|*[!0-9]*) continue ;; esac
        kill -0 "$pid" 2>/dev/null && continue
        multihost_ns_kill "$ns"
        ip netns del "$ns" 2>/dev/null
    done
    for ns in /etc/netns/"$prefix"*-* /tmp/ddp-two-hosts-*; do   # per-namespace hosts files, output folders
        [ -d "$ns" ] || continue
        pid=${ns##*-}
        case $pid in ''|*[!0-9]*) continue ;; esac
        kill -0 "$pid" 2>/dev/null || rm -rf "$ns"
    done
}

# ---- the two hosts -------------------------------------------------------------------------
# two_hosts_setup: route, namespaces, veth. Returns 1 with the reason in TWO_HOSTS_SKIP if this
# machine cannot do it (then nothing is left behind).
two_hosts_setup() {
    local err ns
    TWO_HOSTS_SKIP=""
    if [ "$(id -u)" != 0 ]; then TWO_HOSTS_SKIP="needs root (network namespaces)"; return 1; fi
    if ! command -v ip >/dev/null 2>&1; then TWO_HOSTS_SKIP="the ip command is missing (apt-get install iproute2)"; return 1; fi
    if ! command -v flock >/dev/null 2>&1; then TWO_HOSTS_SKIP="flock is missing (util-linux)"; return 1; fi
    case $TWO_HOSTS_SUBNET in *.0/24) ;; *) TWO_HOSTS_SKIP="TWO_HOSTS_SUBNET must be a /24 ending in .0"; return 1 ;; esac
    if ! err=$(multihost_route_hold "$TWO_HOSTS_SUBNET" 2>&1); then
        TWO_HOSTS_SKIP="cannot add the safety route 'unreachable $TWO_HOSTS_SUBNET': $err"
        multihost_route_release "$TWO_HOSTS_SUBNET"; return 1
    fi
    TWO_HOSTS_UP=1
    multihost_clean_stale "$TWO_HOSTS_PREFIX"
    if ! err=$(ip netns add "$TWO_HOSTS_NS0" 2>&1); then
        TWO_HOSTS_SKIP="ip netns add failed: $err"; two_hosts_teardown; return 1
    fi
    if ! err=$( { ip netns add "$TWO_HOSTS_NS1" &&
         ip -n "$TWO_HOSTS_NS0" link add eth0 type veth peer name eth0 netns "$TWO_HOSTS_NS1" &&
         ip -n "$TWO_HOSTS_NS0" addr add "$TWO_HOSTS_ADDR0/24" dev eth0 &&
         ip -n "$TWO_HOSTS_NS1" addr add "$TWO_HOSTS_ADDR1/24" dev eth0 &&
         ip -n "$TWO_HOSTS_NS0" link set lo up && ip -n "$TWO_HOSTS_NS0" link set eth0 up &&
         ip -n "$TWO_HOSTS_NS1" link set lo up && ip -n "$TWO_HOSTS_NS1" link set eth0 up; } 2>&1); then
        TWO_HOSTS_SKIP="cannot build the namespaces and veth: $err"; two_hosts_teardown; return 1
    fi
    # hostnames node1/node2 (set per run in a UTS namespace) resolve through a per-namespace hosts
    # file: `ip netns exec` binds /etc/netns/<ns>/hosts over /etc/hosts
    [ -d /etc/netns ] || TWO_HOSTS_ETC_NETNS_NEW=1
    for ns in "$TWO_HOSTS_NS0" "$TWO_HOSTS_NS1"; do
        mkdir -p "/etc/netns/$ns" &&
        printf '127.0.0.1 localhost\n%s node1\n%s node2\n' "$TWO_HOSTS_ADDR0" "$TWO_HOSTS_ADDR1" > "/etc/netns/$ns/hosts" ||
            { TWO_HOSTS_SKIP="cannot write /etc/netns/$ns/hosts"; two_hosts_teardown; return 1; }
    done
    TWO_HOSTS_DIR=/tmp/ddp-two-hosts-$TWO_HOSTS_ID
    rm -rf "$TWO_HOSTS_DIR" && mkdir -m 700 "$TWO_HOSTS_DIR" || { TWO_HOSTS_SKIP="cannot make $TWO_HOSTS_DIR"; two_hosts_teardown; return 1; }
    return 0
}

# two_hosts_teardown: kill what runs in the namespaces, delete the veth and the namespaces, remove
# the route. Safe to call twice and after a partial setup.
two_hosts_teardown() {
    [ "$TWO_HOSTS_UP" = 1 ] || return 0
    local ns
    for ns in "$TWO_HOSTS_NS0" "$TWO_HOSTS_NS1"; do
        [ -e "/run/netns/$ns" ] || continue
        multihost_ns_kill "$ns"
        ip -n "$ns" link del eth0 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    for ns in "$TWO_HOSTS_NS0" "$TWO_HOSTS_NS1"; do
        rm -f "/etc/netns/$ns/hosts"; rmdir "/etc/netns/$ns" 2>/dev/null
    done
    [ "$TWO_HOSTS_ETC_NETNS_NEW" = 1 ] && rmdir /etc/netns 2>/dev/null
    multihost_route_release "$TWO_HOSTS_SUBNET"
    [ -n "$TWO_HOSTS_DIR" ] && rm -rf "$TWO_HOSTS_DIR"
    TWO_HOSTS_DIR=""
    TWO_HOSTS_UP=0
}

# two_hosts_run TEMPLATE [TIMEOUT_S]: run TEMPLATE (a bash command line) once in each namespace at
# the same time, with hostname node1 / node2 (own UTS namespace; both names resolve through the
# per-namespace /etc/hosts), with these words replaced: {NODE_RANK} (0 in ddpnode1, 1 in ddpnode2),
# {NNODES} (2), {MASTER_ADDR} (10.77.0.1), {MASTER_PORT}, {NODE_ADDR} (this node's address).
# Both get the same DDP_JOB_TOKEN (and MASTER_ADDR/MASTER_PORT in the environment). Runs in the
# current directory. Sets TWO_HOSTS_RC0/1 (124: timed out; 143: stopped TWO_HOSTS_PEER_GRACE s,
# default 10, after the other node failed) and TWO_HOSTS_OUT0/1 (output files).
# Returns 0 when both exited 0.
two_hosts_run() {
    local tmpl=$1 limit=${2:-$TWO_HOSTS_TIMEOUT} token r cmd p0 p1
    token=netns-$TWO_HOSTS_ID-$RANDOM$RANDOM
    TWO_HOSTS_OUT0=$TWO_HOSTS_DIR/node0.out TWO_HOSTS_OUT1=$TWO_HOSTS_DIR/node1.out
    for r in 0 1; do
        cmd=${tmpl//\{NODE_RANK\}/$r}
        cmd=${cmd//\{NNODES\}/2}
        cmd=${cmd//\{MASTER_ADDR\}/$TWO_HOSTS_ADDR0}
        cmd=${cmd//\{MASTER_PORT\}/$TWO_HOSTS_PORT}
        if [ $r = 0 ]; then cmd=${cmd//\{NODE_ADDR\}/$TWO_HOSTS_ADDR0}; else cmd=${cmd//\{NODE_ADDR\}/$TWO_HOSTS_ADDR1}; fi
        local ns=$TWO_HOSTS_NS0 out=$TWO_HOSTS_OUT0
        [ $r = 1 ] && ns=$TWO_HOSTS_NS1 out=$TWO_HOSTS_OUT1
        ip netns exec "$ns" unshare --uts env DDP_JOB_TOKEN="$token" MASTER_ADDR="$TWO_HOSTS_ADDR0" MASTER_PORT="$TWO_HOSTS_PORT" \
            timeout -k 5 "$limit" bash -c 'hostname "node$1" && exec bash -c "$0"' "$cmd" $((r + 1)) >"$out" 2>&1 </dev/null &
        if [ $r = 0 ]; then p0=$!; else p1=$!; fi
    done
    # When one node fails, the other cannot know (they are separate ddprun processes): give it
    # TWO_HOSTS_PEER_GRACE seconds to end by itself, then stop it (status 143 = stopped here).
    local grace=${TWO_HOSTS_PEER_GRACE:-10} failed_at="" now
    TWO_HOSTS_RC0="" TWO_HOSTS_RC1=""
    while [ -z "$TWO_HOSTS_RC0" ] || [ -z "$TWO_HOSTS_RC1" ]; do
        if [ -z "$TWO_HOSTS_RC0" ] && ! kill -0 "$p0" 2>/dev/null; then wait "$p0"; TWO_HOSTS_RC0=$?; fi
        if [ -z "$TWO_HOSTS_RC1" ] && ! kill -0 "$p1" 2>/dev/null; then wait "$p1"; TWO_HOSTS_RC1=$?; fi
        now=$(date +%s)
        if [ -z "$failed_at" ] && { [ "${TWO_HOSTS_RC0:-0}" != 0 ] || [ "${TWO_HOSTS_RC1:-0}" != 0 ]; }; then failed_at=$now; fi
        if [ -n "$failed_at" ] && [ $((now - failed_at)) -ge "$grace" ]; then
            [ -z "$TWO_HOSTS_RC0" ] && kill -TERM "$p0" 2>/dev/null
            [ -z "$TWO_HOSTS_RC1" ] && kill -TERM "$p1" 2>/dev/null
            failed_at=$((now + 100000))   # once
        fi
        sleep 0.1
    done
    [ "$TWO_HOSTS_RC0" = 0 ] && [ "$TWO_HOSTS_RC1" = 0 ]
}

# two_hosts_check_isolated: from the root namespace a connection to node 0 must fail at once
# (the unreachable route), not go out through the default gateway. Prints a reason on failure.
two_hosts_check_isolated() {
    local t0 t1 out ms
    t0=$(date +%s%N)
    out=$(timeout 2 bash -c "</dev/tcp/$TWO_HOSTS_ADDR0/9" 2>&1); local rc=$?
    t1=$(date +%s%N); ms=$(( (t1 - t0) / 1000000 ))
    if [ $rc = 0 ]; then echo "a connection from the root namespace to $TWO_HOSTS_ADDR0:9 succeeded"; return 1; fi
    if [ $rc = 124 ]; then echo "the connection attempt from the root namespace hung (${ms} ms): packets leave the machine"; return 1; fi
    if ! grep -qE 'No route to host|Network is unreachable' <<<"$out"; then echo "unexpected error ($rc, ${ms} ms): $out"; return 1; fi
    if [ $ms -gt 1000 ]; then echo "the refusal took ${ms} ms"; return 1; fi
    if ! ip -4 route show exact "$TWO_HOSTS_SUBNET" | grep -q '^unreachable'; then echo "no unreachable route for $TWO_HOSTS_SUBNET"; return 1; fi
    return 0
}

# ---- the test ----------------------------------------------------------------------------------
two_hosts_main() {
    local build=${1:-build} name=${TWO_HOSTS_NAME:-multinode_netns} tmpl status=0 why expect pat missing
    cd "$(dirname "${BASH_SOURCE[0]}")/../.." || return 1
    if [ "$(id -u)" != 0 ]; then echo "skip $name: needs root (network namespaces)"; return 0; fi
    if ! command -v ip >/dev/null 2>&1; then echo "skip $name: the ip command is missing (apt-get install iproute2)"; return 0; fi
    if [ ! -x "$build/ddprun" ] || [ ! -x "$build/allreduce_perf" ]; then
        echo "FAIL $name"; echo "    $build/ddprun or $build/allreduce_perf is not built (make)"; return 1
    fi
    trap 'two_hosts_teardown' EXIT
    trap 'two_hosts_teardown; exit 130' INT TERM
    if ! two_hosts_setup; then echo "skip $name: $TWO_HOSTS_SKIP"; return 0; fi
    tmpl=${TWO_HOSTS_CMD:-"$build/ddprun --nnodes {NNODES} --node-rank {NODE_RANK} --nproc-per-node 2 --master-addr {MASTER_ADDR} --master-port {MASTER_PORT} $build/allreduce_perf -b 4K -e 1M -n 3 -w 1"}
    # what node 0's output must show: extended regular expressions, one a line
    if [ -n "${TWO_HOSTS_CMD:-}" ]; then expect=${TWO_HOSTS_EXPECT:-}
    else expect=$'Out of bounds values : 0 OK\nworld size 4\nRank +[0-9]+ Pid +[0-9]+ on +node1 \nRank +[0-9]+ Pid +[0-9]+ on +node2 '; fi
    two_hosts_run "$tmpl"
    missing=""
    while IFS= read -r pat; do
        [ -z "$pat" ] || grep -qE -- "$pat" "$TWO_HOSTS_OUT0" || missing="$missing \"$pat\""
    done <<<"$expect"
    if [ "$TWO_HOSTS_RC0" = 0 ] && [ "$TWO_HOSTS_RC1" = 0 ] && [ -z "$missing" ]; then
        echo "ok   $name"
    else
        echo "FAIL $name"
        echo "    node 0 ($TWO_HOSTS_NS0, $TWO_HOSTS_ADDR0) exit $TWO_HOSTS_RC0, node 1 ($TWO_HOSTS_NS1, $TWO_HOSTS_ADDR1) exit $TWO_HOSTS_RC1 (want 0 0)"
        [ -z "$missing" ] || echo "    node 0's output lacks:$missing"
        echo "    node 0:"; tail -n 8 "$TWO_HOSTS_OUT0" | sed 's/^/      /'
        echo "    node 1:"; tail -n 8 "$TWO_HOSTS_OUT1" | sed 's/^/      /'
        status=1
    fi
    if why=$(two_hosts_check_isolated); then echo "ok   ${name}_isolated"
    else echo "FAIL ${name}_isolated"; echo "    $why"; status=1; fi
    two_hosts_teardown
    return $status
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    two_hosts_main "$@"
    exit $?
fi
