#!/usr/bin/env python3
"""tests/portable/lint_portable.py: forms that work on GNU/Linux but not on a student's Mac, found without
a Mac. `make test` runs it; each rule is one case:
    ok   portable_NAME
    FAIL portable_NAME      (then one indented line per finding: file:line: what, and what instead)

Shell scripts (tests/, labs/, bench/; macOS runs them with bash 3.2 and BSD tools):
    timeout (not on macOS: tests/compat.sh's with_timeout), date's %N (BSD date prints "N": now),
    mapfile/readarray (read_lines), associative arrays, other bash 4+ forms, /proc, GNU-only flags.
C sources: a file that asks for strict POSIX (_POSIX_C_SOURCE) must also ask for _DARWIN_C_SOURCE
    on Apple systems, or macOS hides MAP_ANONYMOUS, mkdtemp and friends from it; and no
    preprocessor line inside the arguments of a call (with _FORTIFY_SOURCE, macOS's default,
    printf-like functions are macros, and a directive inside a macro's arguments is undefined).

A line that needs a form on purpose says why in a comment holding "portable:", on that line or
alone on the line above (for example a fallback that only runs where the form exists); a script that only makes sense on Linux (network
namespaces, a SLURM cluster) says "portable-lint: linux-only" near its top, and must skip itself
with its reason where the Linux tools are missing. Standard library only.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHELL_DIRS = ["tests", "tests/multiproc", "tests/portable", "tests/fakegpu", "labs", "bench"]
C_DIRS = [".", "tests/unit", "tests/multiproc", "tests/multiproc/confusions", "tests/crosscheck", "tests/portable",
          "tests/fuzz", "labs", "examples", "tools", "bench"]

# name, pattern (on the line with its comment removed), what to do instead
SHELL_RULES = [
    ("timeout", r"(^|[\s;&|({`!])timeout\s+(-[a-z]\s+\S+\s+)*\d",
     "macOS has no timeout: use with_timeout from tests/compat.sh"),
    ("date_nanoseconds", r"\bdate\b[^|;]*%N",
     "BSD date prints a literal N for %N: use now from tests/compat.sh"),
    ("mapfile", r"(^|[\s;&|({])(mapfile|readarray)\s",
     "bash 3.2 (macOS) has no mapfile: use read_lines from tests/compat.sh"),
    ("associative_array", r"\b(declare|local|typeset)\s+-[a-zA-Z]*A",
     "bash 3.2 (macOS) has no associative arrays: use files or plain variables"),
    ("bash4_forms", r"\$\{[^}]*(,,|\^\^)[^}]*\}|\|&|&>>|\bcoproc\b|\b(declare|local|typeset)\s+-[a-zA-Z]*n\b"
     r"|\bwait\s+-n\b|\bshopt\s+-s\s+globstar|\[\[\s+-v\s|\$\{\w+\[-\d+\]\}|\$\{\w+@[QEPAa]\}|\$\{?EPOCH(REAL)?TIME",
     "a bash 4+ form; macOS runs bash 3.2"),
    ("proc_filesystem", r"/proc/",
     "macOS has no /proc: record what you need (a pid file, a log line) instead"),
    ("gnu_only_tools", r"\bsed\s+(-[a-zA-Z]+\s+)*-i\b|\bgrep\s+(-[a-zA-Z]+\s+)*-[a-zA-Z]*P|\breadlink\s+-f\b"
     r"|(^|[\s;&|(`$])(nproc|setsid|flock)\b|\bstat\s+-c\b|\bxargs\s+-r\b",
     "a GNU/Linux-only tool or flag (sed -i, grep -P, readlink -f, nproc, setsid, flock, stat -c, xargs -r)"),
]


def files_under(dirs, exts):
    for d in dirs:
        full = os.path.join(ROOT, d)
        if not os.path.isdir(full):
            continue
        for name in sorted(os.listdir(full)):
            if name.endswith(exts) and os.path.isfile(os.path.join(full, name)):
                yield os.path.normpath(os.path.join(d, name))


def shell_code(line):
    """The line without its comment (a # that starts a word, outside quotes) and the comment."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;(") and not line[i - 1:i + 1] == "$#":
            return line[:i], line[i:]
    return line, ""


def lint_shell():
    found = {name: [] for name, _, _ in SHELL_RULES}
    for path in files_under(SHELL_DIRS, (".sh",)):
        lines = open(os.path.join(ROOT, path), errors="replace").read().split("\n")
        if any("portable-lint: linux-only" in l for l in lines[:40]):
            continue
        heredoc = None
        for n, line in enumerate(lines, 1):
            if heredoc:  # the text of a here-document is another language (Python, a job file)
                if line.strip() == heredoc:
                    heredoc = None
                continue
            m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
            if m and "<<<" not in line:
                heredoc = m.group(1)
            code, comment = shell_code(line)
            above = lines[n - 2].strip() if n >= 2 else ""
            if "portable:" in comment or (above.startswith("#") and "portable:" in above):
                continue
            for name, pattern, why in SHELL_RULES:
                if re.search(pattern, code):
                    found[name].append("%s:%d: %s\n        %s" % (path, n, why, line.strip()[:140]))
    return found


def strip_c(text):
    """C source with comments and string literals blanked (line breaks kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(q + " " * (min(j, n) - i - 1) + q)
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def lint_c():
    darwin, directive = [], []
    for path in files_under(C_DIRS, (".c", ".h")):
        if path == os.path.normpath("tests/portable/macos_shim.c"):  # a Linux preload library by design
            continue
        text = open(os.path.join(ROOT, path), errors="replace").read()
        code = strip_c(text)
        if re.search(r"^\s*#\s*define\s+_POSIX_C_SOURCE\b", code, re.M) and \
                not re.search(r"^\s*#\s*define\s+_DARWIN_C_SOURCE\b", code, re.M):
            darwin.append("%s: defines _POSIX_C_SOURCE without _DARWIN_C_SOURCE for __APPLE__: macOS then "
                          "hides MAP_ANONYMOUS, mkdtemp and other non-POSIX declarations" % path)
        # a preprocessor line while a call's parentheses are open (outside #define bodies; the
        # condition of an if or while is no call, and no macro)
        depth, call_line, in_define, is_call = 0, 0, False, False
        for n, line in enumerate(code.split("\n"), 1):
            stripped = line.strip()
            if in_define:
                in_define = line.rstrip().endswith("\\")
                continue
            if stripped.startswith("#"):
                if re.match(r"#\s*define\b", stripped):
                    in_define = line.rstrip().endswith("\\")
                elif depth > 0 and is_call and re.match(r"#\s*(if|ifdef|ifndef|elif|else|endif)\b", stripped):
                    directive.append("%s:%d: %s inside the arguments of the call that opens on line %d: with "
                                     "_FORTIFY_SOURCE that call may be a macro; choose the value before the "
                                     "call" % (path, n, stripped.split()[0], call_line))
                continue
            for k, c in enumerate(line):
                if c == "(":
                    if depth == 0:
                        call_line = n
                        word = re.search(r"(\w+)\s*$", line[:k])
                        is_call = bool(word) and word.group(1) not in ("if", "while", "for", "switch", "return",
                                                                        "sizeof")
                    depth += 1
                elif c == ")":
                    depth = max(0, depth - 1)
                elif c in ";{}":
                    depth = 0
    return {"darwin_feature_macro": darwin, "directive_in_call": directive}


def main():
    results = lint_shell()
    results.update(lint_c())
    failed = 0
    for name, items in results.items():
        if items:
            print("FAIL portable_%s" % name)
            for it in items:
                print("    " + it)
            failed += 1
        else:
            print("ok   portable_%s" % name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
