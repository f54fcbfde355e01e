#!/usr/bin/env bash
# tests/portable/test_portable.sh: the paths a student's laptop takes, checked on this Linux machine
# (make test-portable; .ci/run runs it). Three parts, each skipped with its reason where its tools
# are missing:
#   portable  ddp.h built with -DDDP_PORTABLE, so that every Linux-only branch is off as on macOS
#             (no futex, shm_open and ftruncate instead of /dev/shm files, no /proc, no core
#             binding), CPU only, run under tests/portable/macos_shim.c: shared-memory objects rounded up to
#             16 KiB as macOS rounds them, F_FULLFSYNC answered. The unit tests, the transport
#             tests and test_ddprun.sh (these two with a macOS-like shell: no timeout program, a
#             date without %N, no $EPOCHREALTIME), a 2- and a 4-rank demo that must use shared
#             memory, snapshots written with F_FULLFSYNC, and the error hints of a non-Linux system.
#   musl      built with musl-gcc (musl-tools): the unit tests and a 4-rank demo on shared memory.
#   aarch64   cross-built (gcc-aarch64-linux-gnu) and run under qemu-user: the spin loop's yield
#             hint, the unit tests (but test_ddp), and TUTORIAL.md's runnable blocks of chapters 1
#             to 7 (ddprun and mpirun start aarch64 programs through a binfmt_misc entry that lives only in a
#             user namespace of this run). qemu runs them with the x86 host's memory ordering, so
#             it cannot show a weak-memory bug of real arm64 hardware.
#   bash tests/portable/test_portable.sh BUILD [PART...]     (all three parts: about 4-5 minutes on 2 cores)
# Each case prints "ok   name", "FAIL name" (then details) or "skip name: reason"; the last line is
# "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/compat.sh
BUILD=${1:-build}
[ $# -gt 0 ] && shift
PARTS=${*:-portable musl aarch64}
. tests/report.sh   # pass, fail, skip; ok, bad, skp, run_prog
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
UNIT="test_basics test_nn test_data test_store test_env test_pg test_ddp test_sampler test_snapshot test_desync"

# The project's Makefile into its own folder with other compilers or flags, and none of the
# settings that the calling make exports (its CUDA, BLAS and MPI flags).
sub_make() {  # FOLDER MAKE-ARGUMENTS...
    local dir=$1
    shift
    env -u HAVE_CUDA -u CUDA_CFLAGS -u CUDA_LIBS -u BLAS_CFLAGS -u BLAS_LIBS -u HAVE_MPI -u MPI_CFLAGS -u MPI_LIBS \
        -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -j2 BUILD="$dir" CUDA=0 MPI=0 "$@"
}
build_or_fail() {  # NAME FOLDER MAKE-ARGUMENTS...: builds, or reports why not; warnings fail too
    local name=$1 out
    shift
    if ! out=$(sub_make "$@" 2>&1); then
        bad "$name" "the build failed:" "$(grep -m 5 -E 'error|Error' <<<"$out")"
        return 1
    fi
    if grep -q 'warning:' <<<"$out"; then bad "$name" "the build warns:" "$(grep -m 5 'warning:' <<<"$out")"; return 1; fi
    ok "$name"
}
targets() {  # FOLDER NAME...: the build paths of tests and programs
    local dir=$1 t
    shift
    for t in "$@"; do
        case $t in test_*) echo "$dir/tests/$t" ;; ch[0-9]*) echo "$dir/examples/$t" ;; *) echo "$dir/$t" ;; esac
    done
}
accuracy() { sed -n 's/^\(\[rank [0-9]*\]: \)\{0,1\}test accuracy: //p' <<<"$1" | head -n 1; }
took() { echo "== $1 took $(awk "BEGIN{printf \"%.0f\", $(now) - $2}") s"; }

# ---- portable -----------------------------------------------------------------------------------
part_portable() {
    local B=$BUILD/portable start shim n out acc used rounded port first t
    start=$(now)
    echo "== portable: -DDDP_PORTABLE, CPU only, under tests/portable/macos_shim.c (16 KiB shared-memory pages)"
    # -DF_FULLFSYNC=51: the number Apple's <fcntl.h> gives it; tests/portable/macos_shim.c answers it
    build_or_fail portable_build "$B" CFLAGS="-O2 -DDDP_PORTABLE -DF_FULLFSYNC=51" \
        $(targets "$B" $UNIT ddprun allreduce_perf ch01_single_gpu ch03_multi_gpu ch04_multi_node) || return
    shim=$B/macos_shim.so
    if ! out=$(${CC:-cc} -shared -fPIC -O2 tests/portable/macos_shim.c -o "$shim" -ldl 2>&1); then
        bad portable_shim_build "$out"
        return
    fi
    case $shim in /*) ;; *) shim=$PWD/$shim ;; esac
    export LD_PRELOAD=$shim MACOS_SHIM_LOG=$TMP/shim.log
    for t in $UNIT; do run_prog "$t (portable)" "$B/tests/$t"; done

    # the shell scripts as a Mac runs them: PATH without timeout and with a BSD-like date, and bash
    # without $EPOCHREALTIME (BASH_ENV runs before each script)
    mkdir -p "$TMP/macbin"
    local IFS=:
    for d in $PATH; do [ -d "$d" ] && ln -s "$d"/* "$TMP/macbin/" 2>/dev/null; done
    unset IFS
    rm -f "$TMP/macbin/timeout" "$TMP/macbin/gtimeout" "$TMP/macbin/date"
    printf '#!/bin/sh\nfor a in "$@"; do shift; set -- "$@" "$(printf "%%s" "$a" | sed "s/%%N/N/g")"; done\nexec %s "$@"\n' \
        "$(command -v date)" >"$TMP/macbin/date"
    chmod +x "$TMP/macbin/date"
    echo 'unset EPOCHREALTIME EPOCHSECONDS' >"$TMP/mac_bash_env"
    mac_shell() { env PATH="$TMP/macbin" BASH_ENV="$TMP/mac_bash_env" DDP_TEST_PORTABLE=1 "$@"; }
    # portable: checks that the stand-in date answers %N as BSD date does
    if mac_shell sh -c 'command -v timeout' >/dev/null 2>&1 || [ "$(mac_shell date +%N)" != N ]; then
        bad portable_macos_like_shell "the stand-in PATH still has timeout, or its date prints digits for N"
    else
        run_prog "test_transport (portable, macOS-like shell)" mac_shell bash tests/multiproc/test_transport.sh "$B"
        run_prog "test_ddprun (portable, macOS-like shell)" mac_shell bash tests/multiproc/test_ddprun.sh "$B/ddprun"
    fi

    # the demo on 2 and 4 ranks: it trains, and every rank uses shared memory of 16 KiB pages
    for n in 2 4; do
        MACOS_SHIM_LOG=$TMP/demo$n.log
        out=$(MACOS_SHIM_LOG=$TMP/demo$n.log DDP_DEBUG=INFO with_timeout 300 "$B/examples/ch03_multi_gpu" --nproc $n \
              --device cpu --save-every 0 2>&1)
        acc=$(accuracy "$out")
        used=$(grep -c "transport: shared memory ($n ranks on this host" <<<"$out")
        rounded=$(grep -c 'bytes rounded up to' "$TMP/demo$n.log" 2>/dev/null)
        if [ -n "$acc" ] && awk "BEGIN{exit !($acc >= 0.95)}" && [ "$used" -eq $n ] && [ "${rounded:-0}" -ge 1 ]; then
            ok "portable_demo_${n}_ranks_on_16k_shared_memory (test accuracy $acc; $used ranks on shared memory; $(head -n 1 "$TMP/demo$n.log"))"
        else
            bad "portable_demo_${n}_ranks_on_16k_shared_memory" "test accuracy ${acc:-none} (want >= 0.95), $used of $n ranks on shared memory, ${rounded:-0} segments rounded (want >= 1)" \
                "$(grep -E 'transport|ERR|error' <<<"$out" | head -n 4)"
        fi
    done
    export MACOS_SHIM_LOG=$TMP/shim.log

    # snapshots go to the disk with F_FULLFSYNC where the system has it (Apple: fsync alone does not)
    out=$(MACOS_SHIM_LOG=$TMP/sync.log with_timeout 120 "$B/examples/ch01_single_gpu" --device cpu --epochs 2 --save-every 1 \
          --snapshot "$TMP/p.safetensors" 2>&1)
    n=$(grep -c 'F_FULLFSYNC fd [0-9]*: done as fsync (ok)' "$TMP/sync.log" 2>/dev/null)
    if [ -s "$TMP/p.safetensors" ] && [ "${n:-0}" -ge 1 ]; then ok "portable_snapshot_uses_f_fullfsync ($n snapshot writes)"
    else bad portable_snapshot_uses_f_fullfsync "F_FULLFSYNC calls: ${n:-0} (want >= 1)" "$(tail -n 3 <<<"$out")"; fi

    # the error text suggests commands a Mac has: lsof, not Linux's ss
    port=$((20000 + RANDOM % 10000))
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TIMEOUT=30 \
        with_timeout 40 "$B/examples/ch04_multi_node" --device cpu >"$TMP/holder.txt" 2>&1 &
    local holder=$! i
    for i in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    out=$(RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port DDP_TIMEOUT=5 with_timeout 30 \
          "$B/examples/ch04_multi_node" --device cpu 2>&1)
    kill -TERM $holder 2>/dev/null
    wait $holder 2>/dev/null
    first=$(grep -m1 'DDP_ERR_PORT_IN_USE' <<<"$out")
    # and the mpi backend asked of a build without it names no Debian command
    out=$(DDP_BACKEND=mpi RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port with_timeout 30 \
          "$B/examples/ch04_multi_node" --device cpu 2>&1)
    if grep -qF "\`lsof -nP -iTCP:$port -sTCP:LISTEN\` shows which" <<<"$first" && ! grep -q 'ss -ltnp' <<<"$first" &&
       grep -q 'DDP_ERR_NOT_BUILT: the mpi backend .*install Open MPI or MPICH' <<<"$out" && ! grep -q apt-get <<<"$out"; then
        ok portable_hints_name_commands_of_the_system
    else bad portable_hints_name_commands_of_the_system "want the lsof hint for a busy port and no apt-get for a missing mpi backend; got:" \
             "${first:-no DDP_ERR_PORT_IN_USE line}" "$(grep -m1 DDP_ERR_NOT_BUILT <<<"$out")"; fi
    unset LD_PRELOAD MACOS_SHIM_LOG
    took portable "$start"
}

# ---- musl ---------------------------------------------------------------------------------------
part_musl() {
    local B=$BUILD/musl start out acc used t
    start=$(now)
    echo "== musl: musl-gcc, CPU only"
    if ! command -v musl-gcc >/dev/null 2>&1; then
        skp musl_build "musl-gcc is not installed (apt-get install musl-tools)"
        return
    fi
    # CBLAS=0: a C library built against glibc (OpenBLAS here) does not link into a musl program
    build_or_fail musl_build "$B" CC=musl-gcc CBLAS=0 CFLAGS=-O2 $(targets "$B" $UNIT ch03_multi_gpu) || return
    for t in $UNIT; do run_prog "$t (musl)" "$B/tests/$t"; done
    out=$(DDP_DEBUG=INFO with_timeout 300 "$B/examples/ch03_multi_gpu" --nproc 4 --device cpu --save-every 0 2>&1)
    acc=$(accuracy "$out")
    used=$(grep -c "transport: shared memory (4 ranks on this host" <<<"$out")
    if [ -n "$acc" ] && awk "BEGIN{exit !($acc >= 0.95)}" && [ "$used" -eq 4 ]; then
        ok "musl_demo_4_ranks (test accuracy $acc; 4 ranks on shared memory)"
    else bad musl_demo_4_ranks "test accuracy ${acc:-none} (want >= 0.95), $used of 4 ranks on shared memory" "$(tail -n 4 <<<"$out")"; fi
    took musl "$start"
}

# ---- aarch64 under qemu -------------------------------------------------------------------------
part_aarch64() {
    local B=$BUILD/aarch64 start cc=aarch64-linux-gnu-gcc sysroot=/usr/aarch64-linux-gnu qemu n t why=
    start=$(now)
    echo "== aarch64: $cc, run under qemu-user"
    qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
    if ! command -v $cc >/dev/null 2>&1; then why="$cc is not installed (apt-get install gcc-aarch64-linux-gnu)"
    elif [ -z "$qemu" ]; then why="qemu-aarch64 is not installed (apt-get install qemu-user)"
    elif [ ! -d $sysroot/lib ]; then why="no aarch64 C library under $sysroot (apt-get install libc6-dev-arm64-cross)"; fi
    if [ -n "$why" ]; then
        for t in aarch64_build aarch64_spin_hint aarch64_unit_tests aarch64_tutorial_chapters_1_to_7; do skp $t "$why"; done
        return
    fi
    # everything: chapter 1 starts with `make`, which must find it all built
    build_or_fail aarch64_build "$B" CC=$cc CBLAS=0 CFLAGS=-O2 all || return
    if ! command -v aarch64-linux-gnu-objdump >/dev/null 2>&1; then
        skp aarch64_spin_hint "aarch64-linux-gnu-objdump is not installed (binutils-aarch64-linux-gnu)"
    else
        n=$(aarch64-linux-gnu-objdump -d "$B/tests/test_pg" | grep -cw yield)
        if [ "$n" -ge 1 ]; then ok "aarch64_spin_hint ($n yield instructions in tests/test_pg)"
        else bad aarch64_spin_hint "no yield instruction in $B/tests/test_pg: the shared-memory spin has no arm64 hint"; fi
    fi
    # The unit tests but test_ddp: the reducer is the same C on every architecture, and emulated it
    # took 3-4 of CI's minutes; what it shares with the architecture (the shared-memory ring, the
    # atomics) is in test_pg and test_desync, and chapters 1-7 below train with it under qemu.
    for t in $UNIT; do
        [ "$t" = test_ddp ] && continue
        run_prog "$t (aarch64, qemu)" env QEMU_LD_PREFIX=$sysroot DDP_TEST_EMULATED=qemu-aarch64 "$qemu" "$B/tests/$t"
    done
    # The tutorial: a binfmt_misc entry for aarch64 programs, registered in a mount of binfmt_misc that
    # belongs to a new user namespace (Linux 6.7 and later), so nothing changes for the host.
    cat >"$TMP/binfmt.sh" <<EOF
mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || { echo "cannot mount binfmt_misc in a user namespace"; exit 90; }
printf '%s' ':ddp-aarch64:M::\\x7fELF\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:$qemu:F' \\
    >/proc/sys/fs/binfmt_misc/register 2>/dev/null || { echo "cannot register qemu with binfmt_misc"; exit 90; }
[ "\$1" = probe ] && exit 0
export QEMU_LD_PREFIX=$sysroot CC=$cc CUDA=0 MPI=0 CBLAS=0 CFLAGS=-O2
exec python3 tools/docs.py run "$B" TUTORIAL.md --chapters 1-7 --no-root "chapter 5's network namespaces need root outside the user namespace that runs qemu"
EOF
    userns() { env -u HAVE_CUDA -u CUDA_CFLAGS -u CUDA_LIBS -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
               unshare --user --map-root-user --mount --fork bash "$TMP/binfmt.sh" "$@"; }
    if ! command -v python3 >/dev/null 2>&1; then
        skp aarch64_tutorial_chapters_1_to_7 "python3 is not installed (tools/docs.py runs the blocks)"
    elif ! why=$(userns probe 2>&1); then
        skp aarch64_tutorial_chapters_1_to_7 "${why:-unshare --user failed}: ddprun and mpirun could not start aarch64 programs"
    else
        run_prog "TUTORIAL.md chapters 1-7 (aarch64, qemu)" userns
    fi
    took aarch64 "$start"
}

for part in $PARTS; do
    case $part in
        portable) part_portable ;;
        musl) part_musl ;;
        aarch64) part_aarch64 ;;
        *) bad "part_$part" "no such part (portable, musl, aarch64)" ;;
    esac
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
