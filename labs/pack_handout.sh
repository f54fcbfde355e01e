#!/usr/bin/env bash
# labs/pack_handout.sh [BUILD]: write BUILD/ddp-labs.tar.gz, the labs as students get them, made
# of committed files only (git's HEAD): one top folder, ddp-labs/, holding ddp.h, LICENSE,
# TUTORIAL.md and its figures, examples/gpt.h (lab gpt's model), labs/ without labs/solutions
# (reference solutions, wrong solutions, answer keys) and without labs/README.md (the
# instructors' guide: it names the wrong solutions and shows what the tests print for them), a
# Makefile (labs/handout/Makefile) and a README (labs/handout/README.md). The students' guide
# is labs/GUIDE.md, which goes in as it is.
# Refuses, naming the files, when one that goes in differs from what is committed: an instructor
# who tried the labs would otherwise hand out solved starters. Refuses too when a file that goes
# in names a wrong solution (labs/solutions/wrong/*/NAME.patch). `make lab-handout` calls it.
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-build}
say() { echo "make lab-handout: $*" >&2; }
if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
    say "the handout is made of committed files, and this folder is not a git checkout with a commit"
    exit 2
fi
files=()   # (a read loop, not mapfile: macOS's bash 3.2 has none)
while IFS= read -r f; do files+=("$f"); done < <(git ls-tree -r --name-only HEAD -- ddp.h LICENSE TUTORIAL.md examples/gpt.h labs docs/figures |
                     grep -v -e '^labs/solutions/' -e '^labs/README\.md$' -e '^docs/figures/.*[^g]$' -e '^docs/figures/data/')
changed=$(git status --porcelain --untracked-files=no -- "${files[@]}")
if [ -n "$changed" ]; then
    say "these files differ from what is committed, and the handout is made of committed files only:"
    sed 's/^.. /    /' <<<"$changed" >&2
    say "commit them if the change belongs in the handout, or restore them (git checkout -- FILE: a starter you solved while trying the lab, for instance)"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive --format=tar --prefix=ddp-labs/ HEAD -- "${files[@]}" | tar -x -C "$tmp"
mv "$tmp/ddp-labs/labs/handout/Makefile" "$tmp/ddp-labs/Makefile"
mv "$tmp/ddp-labs/labs/handout/README.md" "$tmp/ddp-labs/README.md"
rm -rf "$tmp/ddp-labs/labs/handout" "$tmp/ddp-labs/labs/pack_handout.sh"
if [ -n "$(find "$tmp/ddp-labs" -path '*solutions*' -o -name '*.patch' -o -path '*/labs/README.md')" ]; then
    say "refusing: a solution or the instructors' labs/README.md would be in the handout"; exit 1
fi
if [ ! -f "$tmp/ddp-labs/labs/GUIDE.md" ]; then
    say "refusing: the students' guide, labs/GUIDE.md, is not in the commit"; exit 1
fi
# The wrong solutions' names say what the tests recognise: none may appear in what students get.
wrong=()
while IFS= read -r f; do f=${f##*/}; wrong+=("${f%.patch}"); done < <(git ls-tree -r --name-only HEAD -- labs/solutions/wrong | grep '\.patch$')
if [ ${#wrong[@]} -gt 0 ]; then
    named=$(grep -rlF "${wrong[@]/#/-e}" "$tmp/ddp-labs" | sed "s|^$tmp/||")
    if [ -n "$named" ]; then
        say "refusing: these files name a wrong solution (labs/solutions/wrong/*/NAME.patch), which students must not see:"
        sed 's/^/    /' <<<"$named" >&2
        exit 1
    fi
fi
mkdir -p "$BUILD"
tar -czf "$BUILD/ddp-labs.tar.gz" -C "$tmp" ddp-labs
echo "$BUILD/ddp-labs.tar.gz: ddp-labs/ from commit $(git rev-parse --short HEAD): ddp.h, TUTORIAL.md, Makefile, README.md and labs/ with GUIDE.md ($(find "$tmp/ddp-labs/labs" -type f | wc -l) files), no solutions, no instructors' README"
