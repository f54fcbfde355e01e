#!/usr/bin/env python3
"""Keeps TUTORIAL.md and README.md true.

  tools/docs.py diffs [--check]       fill in (or, with --check, verify) every generated diff
  tools/docs.py run BUILD FILE... [--chapters A-B] [--no-root REASON]
                                      run every block marked runnable and compare the outputs shown;
                                      --chapters: only TUTORIAL.md's chapters A to B; --no-root: skip
                                      the blocks marked root, with REASON (make test-portable's qemu run)

Markers, each on its own line in the Markdown:

  <!-- diff examples/A.c examples/B.c max=N -->  ...  <!-- /diff -->
      `make diffs` writes between the two markers the unified diff from A to B. The comment at the
      top of each program (what it is, how to run it) differs by design and is left out, so the
      diff shows code only. With max=N the tool fails when more than N lines change (+ and -).
  <!-- run -->, with options <!-- run fails root timeout=S needs=PROGRAM -->
      the ```sh block on the next line runs, from a scratch folder that mirrors the repository's
      top folder, and must exit 0 (or, with `fails`, not 0) within S seconds (120). `root`: the
      block uses sudo and ip netns; it is skipped, with the reason, where those cannot run.
      `needs=PROGRAM`: skipped, with the reason, when PROGRAM is not installed (a PROGRAM with a
      slash, such as build/fakegpu/examples/ch03_multi_gpu, when that file is not built).
  <!-- output -->, or <!-- output rtol=R -->
      the fenced block on the next line is the output of the last run block: every line of it,
      except the `...` lines that mark cuts, must appear in the real output, in that order (a
      process id, "pid 1234", matches any other). With rtol=R a number in a line matches a number
      within R of it, relatively: for figures whose last digits depend on the CPU (OpenBLAS picks
      its matrix kernels by the instruction set, and they round differently).
  <!-- output or -->, with the same options
      another output block for the same run: the real output must match one of them (a plain
      output block right after another is read the same way). For what differs by build (a
      program built without the CUDA toolkit says so where one built with it says that the
      machine has no GPU); the text between the blocks says which is which.

Standard library only: this runs on a student's laptop too. Each block is one case of the test
suite: "ok   NAME", "FAIL NAME" (and indented details) or "skip NAME: reason".
"""
import difflib
import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIFF_OPEN = re.compile(r"^<!-- diff (\S+) (\S+)(?: max=(\d+))? -->$")
DIFF_CLOSE = "<!-- /diff -->"
RUN = re.compile(r"^<!-- run((?: fails| root| timeout=\d+| needs=\S+)*) -->$")
OUTPUT = re.compile(r"^<!-- output( or)?(?: rtol=([0-9.eE+-]+))? -->$")
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][+-]?\d+)?")
CHAPTER = re.compile(r"^## Chapter (\d+)\b")
# The Debian package (as .ci/run installs it) of a program a block needs, for the skip's reason.
PACKAGE = {"mpirun": "openmpi-bin", "ip": "iproute2", "sudo": "sudo", "gnuplot": "gnuplot-nox"}


def header_end(lines):
    """Index just past the comment that opens a C file (0 when it does not open with one)."""
    if not lines or not lines[0].startswith("/*"):
        return 0
    for i, line in enumerate(lines):
        if "*/" in line:
            return i + 1
    return 0


def make_diff(a, b):
    """The unified diff from file a to file b without their opening comments, and how many
    lines it adds or removes."""
    la = open(os.path.join(ROOT, a)).read().splitlines()
    lb = open(os.path.join(ROOT, b)).read().splitlines()
    ha, hb = header_end(la), header_end(lb)
    out, changed = ["--- " + a, "+++ " + b], 0
    for group in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_grouped_opcodes(3):
        # a hunk that only touches the two opening comments is the programs' descriptions
        if all(tag == "equal" or (i2 <= ha and j2 <= hb) for tag, i1, i2, j1, j2 in group):
            continue
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append("@@ -%d,%d +%d,%d @@" % (i1 + 1, i2 - i1, j1 + 1, j2 - j1))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + l for l in la[i1:i2]]
                continue
            out += ["-" + l for l in la[i1:i2]] + ["+" + l for l in lb[j1:j2]]
            if not (i2 <= ha and j2 <= hb):  # the opening comments are not counted
                changed += (i2 - i1) + (j2 - j1)
    return out, changed


def diffs(check):
    """Fill in or verify the generated diffs of TUTORIAL.md. Returns the number of problems."""
    path = os.path.join(ROOT, "TUTORIAL.md")
    lines = open(path).read().split("\n")
    result, problems, i, n = [], 0, 0, 0
    while i < len(lines):
        m = DIFF_OPEN.match(lines[i])
        if not m:
            result.append(lines[i])
            i += 1
            continue
        end = lines.index(DIFF_CLOSE, i + 1)  # ValueError: a marker left open
        a, b, limit = m.group(1), m.group(2), m.group(3)
        body, changed = make_diff(a, b)
        new = ["```diff"] + body + ["```"]
        name = "docs_diff_%s_%s" % (os.path.basename(a).split("_")[0], os.path.basename(b).split("_")[0])
        n += 1
        if check and lines[i + 1:end] != new:
            print("FAIL %s\n    TUTORIAL.md line %d: the diff from %s to %s is stale; run `make diffs`"
                  % (name, i + 1, a, b))
            problems += 1
        elif limit and changed > int(limit):
            print("FAIL %s\n    %s -> %s changes %d lines, more than the %s the chapter promises"
                  % (name, a, b, changed, limit))
            problems += 1
        elif check:
            print("ok   %s (%d lines change%s)" % (name, changed, ", at most " + limit if limit else ""))
        else:
            print("%s -> %s: %d lines change" % (a, b, changed))
        result += [lines[i]] + new + [DIFF_CLOSE]
        i = end + 1
    if not check:
        open(path, "w").write("\n".join(result))
    if n == 0:
        print("FAIL docs_diffs\n    TUTORIAL.md has no <!-- diff --> marker")
        problems += 1
    return problems


def blocks(path):
    """The runnable blocks of a Markdown file: [line, options, text, [(expected output, rtol)...],
    chapter] (chapter: the number of the "## Chapter N" heading above, else None). Several output
    blocks are alternatives, one of which must match."""
    lines = open(path).read().split("\n")
    found, i, chapter = [], 0, None

    def fence(at):  # the fenced block starting at line index at: (its lines, index past it)
        if at >= len(lines) or not lines[at].startswith("```"):
            raise SystemExit("%s:%d: a marker must be followed by a fenced block" % (path, at))
        end = at + 1
        while not lines[end].startswith("```"):
            end += 1
        return lines[at + 1:end], end + 1

    while i < len(lines):
        m = RUN.match(lines[i].strip())
        h = CHAPTER.match(lines[i])
        if h:
            chapter = int(h.group(1))
        if m:
            body, end = fence(i + 1)
            found.append([i + 2, m.group(1).split(), "\n".join(body), [], chapter])  # the fence's line
            i = end
        elif OUTPUT.match(lines[i].strip()):
            if not found:
                raise SystemExit("%s:%d: an output marker with no run block before it" % (path, i + 1))
            m = OUTPUT.match(lines[i].strip())
            if m.group(1) and not found[-1][3]:
                raise SystemExit("%s:%d: an \"output or\" marker with no output block before it" % (path, i + 1))
            rtol = float(m.group(2) or 0)
            expected, i = fence(i + 1)
            found[-1][3].append((expected, rtol))
        else:
            i += 1
    return found


def left_by_the_tutorial():
    """The top folder's .gitignore patterns: the files the tutorial's programs write there
    (snapshots, traces), which a student who followed it has, and which no block may find."""
    pats = []
    try:
        with open(os.path.join(ROOT, ".gitignore")) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "/" not in line.strip("/"):
                    pats.append(line.strip("/"))
    except OSError:
        pass
    return pats


def scratch(build):
    """A folder that looks like the repository's top folder, where a block's files land: the
    repository's files, not what earlier runs left there."""
    d = tempfile.mkdtemp(prefix="ddp-docs-")
    stray = left_by_the_tutorial()
    for name in os.listdir(ROOT):
        if name.startswith(".") or name == "build" or any(fnmatch.fnmatch(name, p) for p in stray):
            continue
        os.symlink(os.path.join(ROOT, name), os.path.join(d, name))
    os.symlink(os.path.abspath(build), os.path.join(d, "build"))
    return d


def same_line(shown, real, rtol=0.0):
    """Equal, except that process ids never repeat from run to run, and that with rtol each
    decimal number may differ from the one shown by that much, relatively."""
    pid = re.compile(r"\bpid \d+")
    shown, real = pid.sub("pid N", shown.rstrip()), pid.sub("pid N", real.rstrip())
    if not rtol:
        return shown == real
    a, b = NUMBER.findall(shown), NUMBER.findall(real)
    if NUMBER.sub("#", shown) != NUMBER.sub("#", real) or len(a) != len(b):
        return False
    return all(abs(float(x) - float(y)) <= rtol * max(abs(float(x)), abs(float(y))) for x, y in zip(a, b))


def missing_in_order(expected, actual, rtol=0.0):
    """The first shown line that the real output lacks (in order), or None."""
    at = 0
    for want in expected:
        want = want.rstrip()
        if want == "..." or not want:
            continue
        while at < len(actual) and not same_line(want, actual[at], rtol):
            at += 1
        if at == len(actual):
            return want
        at += 1
    return None


def run(build, files, chapters=None, no_root=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDP_")}  # a student's shell
    have_numpy = subprocess.call(["python3", "-c", "import numpy"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) == 0 if shutil.which("python3") else False
    have_torch = subprocess.call(["python3", "-c", "import torch"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) == 0 if shutil.which("python3") else False
    can_netns = bool(shutil.which("sudo") and shutil.which("ip")) and subprocess.call(
        ["sudo", "-n", "ip", "netns", "list"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    failed = 0
    for f in files:
        where = scratch(build)
        try:
            for line, opts, text, outputs, chapter in blocks(os.path.join(ROOT, f)):
                if chapters and (chapter is None or not chapters[0] <= chapter <= chapters[1]):
                    continue
                fails = "fails" in opts
                timeout = int(([o[8:] for o in opts if o.startswith("timeout=")] or ["120"])[0])
                first = text.strip().split("\n")[0][:60]
                name = "docs_%s_line%d (%s)" % (os.path.splitext(f)[0].lower(), line, first)
                if "root" in opts and no_root:
                    print("skip %s: %s" % (name, no_root))
                    continue
                if "root" in opts and not can_netns:
                    missing = [p for p in ("sudo", "ip") if not shutil.which(p)]
                    print("skip %s: needs root, sudo and network namespaces (Linux)%s" % (name, (
                        ": apt-get install " + " ".join(PACKAGE.get(p, p) for p in missing)) if missing else
                        "" if os.geteuid() == 0 else ": this user is not root"))
                    continue
                need = [o[6:] for o in opts if o.startswith("needs=") and not (
                    os.access(os.path.join(where, o[6:]), os.X_OK) if "/" in o[6:] else shutil.which(o[6:]))]
                if need:
                    print("skip %s: %s is not %s" % (name, need[0], "built (make found no CUDA toolkit)"
                                                     if need[0].startswith("build/fakegpu/") else
                                                     "installed (apt-get install %s)" % PACKAGE.get(need[0], need[0])))
                    continue
                if "gpt_torch.py" in text and not have_torch:
                    print("skip %s: python3 with torch is not installed (apt-get install python3-torch)" % name)
                    continue
                if "numpy" in text and not have_numpy:
                    print("skip %s: python3 with numpy is not installed (apt-get install python3-numpy)" % name)
                    continue
                start = time.time()
                p = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", text], cwd=where, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    out = p.communicate(timeout=timeout)[0].decode(errors="replace")
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    out = p.communicate()[0].decode(errors="replace")
                    print("FAIL %s\n    still running after %d s" % (name, timeout))
                    failed += 1
                    continue
                took = time.time() - start
                actual = out.split("\n")
                # alternatives: the first one's missing line is reported when none matches
                missing = [missing_in_order(e, actual, r) for e, r in outputs]
                missing = None if not missing or None in missing else missing[0]
                tail = ["    | " + l for l in actual[-8:]]
                if (p.returncode != 0) != fails:
                    print("FAIL %s\n    %s (exit status %d)" % (
                        name, "expected to fail, but it succeeded" if fails else "the command failed",
                        p.returncode))
                    print("\n".join(tail))
                    failed += 1
                elif missing is not None:
                    print("FAIL %s\n    the output shown in %s does not match the real one; first line "
                          "not found (in order):\n    > %s\n    the real output ends with:" % (
                              name, f, missing))
                    print("\n".join(tail))
                    failed += 1
                else:
                    print("ok   %s%s in %.1f s" % (name, ", output as shown," if outputs else "", took))
        finally:
            shutil.rmtree(where, ignore_errors=True)
    return failed


def main(argv):
    if len(argv) >= 2 and argv[1] == "diffs":
        return 1 if diffs("--check" in argv) else 0
    if len(argv) >= 4 and argv[1] == "run":
        args, chapters, no_root = argv[3:], None, None
        if "--chapters" in args:
            k = args.index("--chapters")
            a, _, b = args[k + 1].partition("-")
            chapters = (int(a), int(b or a))
            del args[k:k + 2]
        if "--no-root" in args:
            k = args.index("--no-root")
            no_root = args[k + 1]
            del args[k:k + 2]
        return 1 if run(argv[2], args, chapters, no_root) else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
