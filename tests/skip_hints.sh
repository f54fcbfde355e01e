#!/usr/bin/env bash
# tests/skip_hints.sh REASONS_FILE SKIPS: the line make test prints before its summary. A skip that
# a Debian package cures says so in its reason ("apt-get install PKG ...", in the package names
# .ci/run installs); this collects those packages and counts the skips nothing installable cures
# (a GPU, root, ...). Exits 1, with a second line, when a reason names a package .ci/run does not
# install: a stale hint.
set -u
cd "$(dirname "$0")/.." || exit 2
reasons=$1 skips=$2
hint='apt-get install( -[a-z-]+)*( [a-z0-9][a-z0-9.+-]*)+'
pkgs=$(grep -oE "$hint" "$reasons" | sed -E 's/^apt-get install//; s/ -[a-z-]+//g' | tr ' ' '\n' | grep -v '^$' | sort -u)
cured=$(grep -cE "$hint" "$reasons")
others=$(grep -vE "$hint" "$reasons" | awk '
    /GPU|CUDA/ { gpu++; next } /root|sudo|namespace/ { root++; next } { rest++ }
    END { s = ""; if (gpu) s = gpu " need a GPU or the CUDA toolkit"; if (root) s = s (s ? ", " : "") root " need root";
          if (rest) s = s (s ? ", " : "") rest " other (see their lines)"; print s }')
if [ "$cured" -gt 0 ]; then
    echo "skipped cases: apt-get install $(echo $pkgs) would turn $cured of the $skips into tests (as .ci/run installs them)${others:+; $others}"
else
    echo "skipped cases: no package would turn them into tests: $others"
fi
ci=" $(sed -n '/^for p in/,/; do/p' .ci/run | tr -d '\\;' | tr '\n' ' ') "
stale=""
for p in $pkgs; do case $ci in *" $p "*) ;; *) stale="$stale $p" ;; esac; done
[ -z "$stale" ] || { echo "skip reasons name packages that .ci/run does not install:$stale"; exit 1; }
exit 0
