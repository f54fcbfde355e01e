# tools/ddp_decls.awk: ddp.h without its function bodies, for the Makefile, which compiles the
# implementation once into an object and every program against this header:
#     awk -f tools/ddp_decls.awk ddp.h > BUILD/obj/ddp_decls.h
# The output defines DDP_IMPLEMENTATION and DDP__EXPORT_INTERNALS, then holds ddp.h line for line,
# except that each function definition becomes its prototype (a static function is left out), a
# line that only calls a macro at top level (DDP__CONVERSIONS(DDP__PRIVATE): definitions) is left
# out, and each top-level variable becomes an extern declaration without its initializer: a
# DDP__PRIVATE one is defined in ddp_internals.o, a static one serves only the sizeof of a type.
# So a program compiled with -include of it sees every type, macro, system header and prototype
# that compiling the whole header would give it (the internals, ddp__ names, too), and its own
# #include "ddp.h" then adds nothing (ddp.h's guards, DDP_H_INCLUDED and DDP__IMPLEMENTED, are set).
#
# It reads ddp.h's layout, and stops with an error naming the line where that layout breaks:
#   - a top-level declaration starts in column 0; a function definition's "{" ends the line of its
#     head, and its body ends with a line that is exactly "}", where its braces balance (or the
#     whole definition is one line);
#   - a top-level variable is static or DDP__PRIVATE, and no literal or comment comes before its
#     initializer's "=" on that line.
# POSIX awk only: mawk (Debian's awk) and BSD awk (macOS's; Debian's original-awk) give the same output.

BEGIN {
    state = "top"  # top, decl (reading a declaration), body (inside a function body)
    incom = 0      # inside a /* */ comment, across lines
    inpp = 0       # on a preprocessor line continued with a backslash
    bodies = 0     # function bodies left out, for the check at the end
    print "/* Generated from ddp.h by tools/ddp_decls.awk (make): ddp.h without its function bodies."
    print "   Do not edit: edit ddp.h. A program compiled with -include of this file links the"
    print "   implementation as an object (Makefile). */"
    print "#define DDP_IMPLEMENTATION"
    print "#define DDP__EXPORT_INTERNALS"
}

function fail(msg) {
    printf("tools/ddp_decls.awk: %s:%d: %s\n", FILENAME, FNR, msg) > "/dev/stderr"
    failed = 1
    exit 1
}

# The line's code without comments, string literals and character literals (each literal is kept as
# its empty quotes), so that braces, parentheses and "=" can be counted. Carries incom across lines.
function code(s,    out, i, n, c, q, j) {
    out = ""
    i = 1
    n = length(s)
    while (i <= n) {
        if (incom) {
            j = index(substr(s, i), "*/")
            if (j == 0) return out
            i += j + 1
            incom = 0
            out = out " "
            continue
        }
        c = substr(s, i, 1)
        if (c == "/" && substr(s, i + 1, 1) == "*") { incom = 1; i += 2; continue }
        if (c == "/" && substr(s, i + 1, 1) == "/") return out
        if (c == "\"" || c == "'") {
            q = c
            i++
            while (i <= n) {
                c = substr(s, i, 1)
                if (c == "\\") i += 2
                else if (c == q) { i++; break }
                else i++
            }
            out = out q q
            continue
        }
        out = out c
        i++
    }
    return out
}

function count(s, re,    t) { t = s; return gsub(re, "", t) }

# The first of ( = { ; in the declaration's code: what kind of declaration it is.
function first_of(s,    i, c) {
    for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "(" || c == "=" || c == "{" || c == ";") return c
    }
    return ""
}

# Output: in the top state at once; while a declaration is read, into its buffer.
function out(s) { print s }
function hold(s, pp) { dn++; dl[dn] = s; dpp[dn] = pp }
function emit_held_pp(    i) { for (i = 1; i <= dn; i++) if (dpp[i]) print dl[i] }
function emit_held(    i) { for (i = 1; i <= dn; i++) print dl[i] }

# A variable as an extern declaration, without its initializer: a DDP__PRIVATE one is defined in
# the object (with external linkage in ddp_internals.o); a static one is there only for the types
# that take their size from it (sizeof ddp__err_msg): a program that used one would not link.
function extern_decl(    i, d, k, n, ch, cut, pre) {
    d = 0
    cut = 0
    for (i = 1; i <= dn && !cut; i++) {
        if (dpp[i]) continue
        n = length(code_of[i])
        for (k = 1; k <= n; k++) {
            ch = substr(code_of[i], k, 1)
            if (ch == "{" || ch == "(" || ch == "[") d++
            else if (ch == "}" || ch == ")" || ch == "]") d--
            else if (ch == "=" && d == 0) { cut = i; break }
        }
    }
    if (cut) {
        pre = substr(dl[cut], 1, index(dl[cut], "=") - 1)
        if (pre ~ /["'\/]/ || index(code_of[cut], "=") != k)
            fail("a variable whose line with the initializer's \"=\" holds a literal, a comment or another \"=\" before it")
        sub(/[ \t]*$/, "", pre)
        dl[cut] = pre ";"
    }
    for (i = 1; i <= dn; i++) {
        if (dpp[i]) print dl[i]
        else if (!cut || i <= cut) {
            if (!done_kw) { if (!sub(/^(static|DDP__PRIVATE)[ \t]+/, "extern ", dl[i])) fail("a variable that does not start with static or DDP__PRIVATE"); done_kw = 1 }
            print dl[i]
        }
    }
    done_kw = 0
}

# A declaration read to its end (no body): emit it, its extern form, or only its preprocessor lines.
function finish_decl(    kind) {
    kind = first_of(dcode)
    if (dcode ~ /^[ \t]*typedef[ \t]/) {
        emit_held()
    } else if (dcode ~ /^[ \t]*(struct|union|enum)[ \t{]/) {
        if (dcode !~ /[}][ \t]*;[ \t]*$/) fail("a struct, union or enum definition that also declares a variable")
        emit_held()
    } else if (kind == "(") {
        if (dcode ~ /\(\*/) fail("a top-level function pointer variable (neither a type nor a prototype)")
        if (dcode ~ /^[ \t]*static[ \t]/) emit_held_pp()
        else emit_held()
    } else if (dcode ~ /^[ \t]*(static|DDP__PRIVATE)[ \t]/) {
        extern_decl()
    } else {
        fail("a top-level declaration that is neither a type, a prototype, static nor DDP__PRIVATE")
    }
    state = "top"
}

# A function definition's head: its prototype, or nothing for a static function.
function finish_head(one_line,    last, b, pre) {
    if (dcode !~ /^[ \t]*(DDP__PRIVATE|DDP__DEF|static)[ \t]/)
        fail("a function definition that is not DDP__PRIVATE, DDP__DEF or static")
    last = dl[dn]
    if (one_line) {
        b = index(last, "{")
        pre = substr(last, 1, b - 1)
        if (pre ~ /["'\/]/) fail("a one-line function whose head holds a literal or comment")
    } else {
        pre = last
        if (pre !~ /[{][ \t]*$/) fail("a function head whose \"{\" is followed by a comment")
        sub(/[ \t]*[{][ \t]*$/, "", pre)
        if (pre ~ /^[ \t]*$/) fail("a function's \"{\" on a line of its own")
    }
    sub(/[ \t]*$/, "", pre)
    dl[dn] = pre ";"
    if (dcode ~ /^[ \t]*static[ \t]/) emit_held_pp()
    else emit_held()
}

{
    line = $0
    wascom = incom
    c = code(line)

    # preprocessor lines, with their continuations: kept wherever they are, in place
    if (inpp || (!wascom && line ~ /^[ \t]*#/)) {
        inpp = (line ~ /\\$/)
        if (state == "decl") hold(line, 1)
        else out(line)
        next
    }

    if (state == "body") {
        depth += count(c, "[{]") - count(c, "[}]")
        if (line == "}") {
            if (depth != 0) fail("a line that is exactly \"}\" inside a function body (its braces do not balance there)")
            state = "top"
            bodies++
        } else if (depth <= 0) {
            fail("a function body that does not end with a line that is exactly \"}\"")
        }
        next
    }

    if (state == "top") {
        if (c ~ /^[ \t]*$/) { out(line); next }  # blank lines and comments
        if (wascom) fail("code after the end of a comment, at top level")
        if (line ~ /^extern "C" [{][ \t]*$/) { externc++; out(line); next }
        if (c ~ /^[}][ \t]*$/ && externc > 0) { externc--; out(line); next }
        if (line !~ /^[A-Za-z_]/) fail("a top-level line that starts neither in column 0 nor with a name")
        # a line that only calls a macro, such as DDP__CONVERSIONS(DDP__PRIVATE): it expands to
        # function definitions, which the object holds
        if (c ~ /^[A-Z_][A-Z0-9_]*[(].*[)][ \t]*$/ && count(c, "[(]") == count(c, "[)]")) {
            out("/* " line ": definitions, left out */")
            next
        }
        state = "decl"
        dn = 0
        dcode = ""
        depth = 0
        paren = 0
    }

    # state decl: one more line of a declaration
    before = depth
    hold(line, 0)
    code_of[dn] = c
    dcode = dcode " " c
    depth += count(c, "[{]") - count(c, "[}]")
    paren += count(c, "[(]") - count(c, "[)]")
    if (depth < 0 || paren < 0) fail("more closing than opening braces or parentheses")
    if (paren > 0) next
    isfn = (first_of(dcode) == "(" && dcode !~ /^[ \t]*typedef[ \t]/)
    if (isfn && before == 0 && depth == 1 && c ~ /[{][ \t]*$/) {
        finish_head(0)
        state = "body"
        next
    }
    if (isfn && before == 0 && depth == 0 && c ~ /[}][ \t]*$/ && index(c, "{")) {
        finish_head(1)
        bodies++
        state = "top"
        next
    }
    if (depth == 0 && c ~ /;[ \t]*$/) finish_decl()
}

END {
    if (failed) exit 1
    if (state == "body") why = "ends inside a function body"
    else if (state == "decl") why = "ends inside a declaration"
    else if (incom) why = "ends inside a comment"
    else if (inpp) why = "ends inside a continued preprocessor line"
    else if (bodies < 100) why = "holds only " bodies " function bodies: is it ddp.h?"
    if (why != "") { printf("tools/ddp_decls.awk: %s %s\n", FILENAME, why) > "/dev/stderr"; exit 1 }
}
