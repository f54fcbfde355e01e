/* fakegpu's NVRTC: the kernel source a program hands to nvrtcCreateProgram is compiled by the host
   C++ compiler, after kernel_shim.h, into a shared object kept in a cache folder (keyed by a hash
   of everything that goes into it, so the ranks of a job and later runs share it). Options are
   checked as NVRTC checks them. The "PTX" and "CUBIN" it returns are small text images that name
   the shared object and carry the PTX version and target, so that cudaLibraryLoadData can apply
   the driver's rules: PTX newer than the driver fails, CUBIN runs only on its own architecture.
   The host compiler forgives what NVRTC does not: the shim includes <math.h> and <string.h>, so
   INFINITY, FLT_MAX or memcpy compile here and nowhere on a GPU. So each program is also compiled
   by the real NVRTC (it needs no GPU): the libnvrtc.so the build found (FAKEGPU_REAL_NVRTC_LIB), or
   the one FAKEGPU_REAL_NVRTC names (empty: none), with the same source and options; its errors are
   the stand-in's. A program it accepted leaves a mark in the cache folder and is not sent again. */
#define _GNU_SOURCE
#include "fakegpu.h"

#include <errno.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FAKEGPU_SHIM
#error "build with -DFAKEGPU_SHIM=\"path/to/kernel_shim.h\""
#endif

extern char** environ;

static const int fg_archs[] = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121}; /* NVRTC 13.0's */
#define FG_NARCH ((int)(sizeof fg_archs / sizeof fg_archs[0]))

struct _nvrtcProgram {
    char* src;
    char name[256];
    char* log;
    char* ptx;
    size_t ptx_n;
    char* cubin;
    size_t cubin_n;
};

FG_EXPORT const char* nvrtcGetErrorString(nvrtcResult r) {
    switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
    default: return "NVRTC_ERROR unknown";
    }
}

FG_EXPORT nvrtcResult nvrtcVersion(int* major, int* minor) {
    if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
    *major = fg_cfg()->nvrtc_major;
    *minor = fg_cfg()->nvrtc_minor;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetNumSupportedArchs(int* n) {
    if (!n) return NVRTC_ERROR_INVALID_INPUT;
    *n = FG_NARCH;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetSupportedArchs(int* archs) {
    if (!archs) return NVRTC_ERROR_INVALID_INPUT;
    memcpy(archs, fg_archs, sizeof fg_archs);
    return NVRTC_SUCCESS;
}

static char* fg_strdup(const char* s) {
    size_t n = strlen(s) + 1;
    char* d = (char*)malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

FG_EXPORT nvrtcResult nvrtcCreateProgram(nvrtcProgram* out, const char* src, const char* name, int nheaders,
                                         const char* const* headers, const char* const* include_names) {
    struct _nvrtcProgram* p;
    (void)headers, (void)include_names;
    if (!out) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!src || nheaders < 0 || nheaders > 0) return NVRTC_ERROR_INVALID_INPUT; /* no headers in the stand-in */
    p = (struct _nvrtcProgram*)calloc(1, sizeof *p);
    if (!p || !(p->src = fg_strdup(src))) {
        free(p);
        return NVRTC_ERROR_OUT_OF_MEMORY;
    }
    snprintf(p->name, sizeof p->name, "%s", name ? name : "default_program");
    *out = p;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcDestroyProgram(nvrtcProgram* pp) {
    struct _nvrtcProgram* p;
    if (!pp || !*pp) return NVRTC_ERROR_INVALID_PROGRAM;
    p = *pp;
    free(p->src), free(p->log), free(p->ptx), free(p->cubin), free(p);
    *pp = NULL;
    return NVRTC_SUCCESS;
}

static void fg_set_log(struct _nvrtcProgram* p, const char* text) {
    free(p->log);
    p->log = fg_strdup(text);
}

/* "compute_90" or "sm_90" -> 90 (and *real = 1 for sm_); 0 when not an architecture NVRTC knows. */
static int fg_parse_arch(const char* v, int* real) {
    int i, n = 0;
    char tail[8] = "";
    if (sscanf(v, "compute_%d%7s", &n, tail) == 1) *real = 0;
    else if (sscanf(v, "sm_%d%7s", &n, tail) == 1) *real = 1;
    else return 0;
    for (i = 0; i < FG_NARCH; i++)
        if (fg_archs[i] == n) return n;
    return 0;
}

static uint64_t fg_fnv(uint64_t h, const void* data, size_t n) {
    const unsigned char* b = (const unsigned char*)data;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static char* fg_read_file(const char* path, size_t* n) {
    FILE* f = fopen(path, "rb");
    char* buf;
    long len;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char*)malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[len] = 0, *n = (size_t)len;
    return buf;
}

/* How many parameters the function whose "(" is at p takes (commas at depth one, plus one). */
static int fg_param_count(const char* p) {
    int depth = 0, n = 0, any = 0;
    for (; *p; p++) {
        if (*p == '(') depth++;
        else if (*p == ')' && --depth == 0) break;
        else if (depth == 1 && *p == ',') n++;
        else if (depth >= 1 && *p != ' ' && *p != '\n' && *p != '\t') any = 1;
    }
    return any ? n + 1 : 0;
}

/* The names of the __global__ functions in src, one per line ("name count"), into out. */
static void fg_kernel_names(const char* src, char* out, size_t cap) {
    const char* p = src;
    size_t used = 0;
    out[0] = 0;
    while ((p = strstr(p, "__global__")) != NULL) {
        const char* q = p + 10;
        size_t len;
        while (*q == ' ' || *q == '\t' || *q == '\n') q++;
        if (strncmp(q, "void", 4) == 0) {
            q += 4;
            while (*q == ' ' || *q == '\t' || *q == '\n') q++;
            for (len = 0; q[len] == '_' || (q[len] >= 'a' && q[len] <= 'z') || (q[len] >= 'A' && q[len] <= 'Z') ||
                          (q[len] >= '0' && q[len] <= '9');
                 len++) {}
            if (len && used + len + 16 < cap) {
                memcpy(out + used, q, len);
                used += len;
                used += (size_t)snprintf(out + used, cap - used, " %d\n", fg_param_count(strchr(q + len, '(')));
            }
        }
        p += 10;
    }
}

/* Run the host compiler; its output goes to `log`. Returns its exit status (-1: not started). */
static int fg_run_compiler(const char* cpp, const char* so, const char* log, const char* std_flag, char* const* defs,
                           int ndefs) {
    const char* cxx = getenv("FAKEGPU_CXX");
    char* argv[64];
    int argc = 0, i, st = 0;
    pid_t pid;
    posix_spawn_file_actions_t fa;
    argv[argc++] = (char*)(cxx && *cxx ? cxx : "c++");
    argv[argc++] = (char*)std_flag;
    argv[argc++] = (char*)"-O2";
    argv[argc++] = (char*)"-fPIC";
    argv[argc++] = (char*)"-shared";
    argv[argc++] = (char*)"-ffp-contract=off";
    argv[argc++] = (char*)"-w";
    for (i = 0; i < ndefs && argc < 56; i++) argv[argc++] = defs[i];
    argv[argc++] = (char*)"-o";
    argv[argc++] = (char*)so;
    argv[argc++] = (char*)cpp;
    argv[argc++] = (char*)"-lm";
    argv[argc] = NULL;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        return -1;
    }
    posix_spawn_file_actions_destroy(&fa);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#ifndef FAKEGPU_REAL_NVRTC_LIB
#define FAKEGPU_REAL_NVRTC_LIB ""
#endif
static const char* fg_real_nvrtc_path(void) { /* "" when there is none to ask */
    return getenv("FAKEGPU_REAL_NVRTC") ? getenv("FAKEGPU_REAL_NVRTC") : FAKEGPU_REAL_NVRTC_LIB;
}
/* The same program through the real NVRTC: NVRTC_SUCCESS when it compiles there (or there is no
   real NVRTC to ask, or the cache folder `dir` marks it as accepted before), else
   NVRTC_ERROR_COMPILATION with the real compiler's log. The question is the source, not the
   target: an architecture the stand-in's NVRTC version knows and the installed one does not (an
   older or newer toolkit) is asked as the nearest one it knows, at or below. */
static nvrtcResult fg_real_nvrtc(struct _nvrtcProgram* p, int nopt, const char* const* opts, const char* dir) {
    typedef nvrtcResult (*create_fn)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                     const char* const*);
    typedef nvrtcResult (*compile_fn)(nvrtcProgram, int, const char* const*);
    typedef nvrtcResult (*logsize_fn)(nvrtcProgram, size_t*);
    typedef nvrtcResult (*log_fn)(nvrtcProgram, char*);
    typedef nvrtcResult (*destroy_fn)(nvrtcProgram*);
    typedef nvrtcResult (*narch_fn)(int*);
    typedef nvrtcResult (*archs_fn)(int*);
    static void* lib; /* opened once, kept: NVRTC is not meant to be unloaded */
    const char* path = fg_real_nvrtc_path();
    char mark[1200];
    uint64_t h = 0x84222325cbf29ce4ull;
    int i, fd;
    create_fn create;
    compile_fn compile;
    logsize_fn logsize;
    log_fn getlog;
    destroy_fn destroy;
    narch_fn narch;
    archs_fn archs;
    nvrtcProgram rp = NULL;
    nvrtcResult r;
    size_t n = 0;
    char *log, *msg, arch_opt[64];
    const char* ropts[64];
    if (!*path) return NVRTC_SUCCESS;
    if (nopt > 64) /* the real compile must see every option the program was given, or none */
        fg_fatal("nvrtcCompileProgram: %d options; the stand-in passes at most 64 on to the real NVRTC", nopt);
    h = fg_fnv(h, path, strlen(path) + 1);
    h = fg_fnv(h, p->src, strlen(p->src) + 1);
    for (i = 0; i < nopt; i++) h = fg_fnv(h, opts[i], strlen(opts[i]) + 1);
    snprintf(mark, sizeof mark, "%s/%016llx.nvrtc-accepted", dir, (unsigned long long)h);
    if (access(mark, F_OK) == 0) return NVRTC_SUCCESS;
    if (!lib && !(lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
        fg_fatal("FAKEGPU_REAL_NVRTC=%s: %s", path, dlerror());
    create = (create_fn)dlsym(lib, "nvrtcCreateProgram"), compile = (compile_fn)dlsym(lib, "nvrtcCompileProgram");
    logsize = (logsize_fn)dlsym(lib, "nvrtcGetProgramLogSize"), getlog = (log_fn)dlsym(lib, "nvrtcGetProgramLog");
    destroy = (destroy_fn)dlsym(lib, "nvrtcDestroyProgram");
    narch = (narch_fn)dlsym(lib, "nvrtcGetNumSupportedArchs"), archs = (archs_fn)dlsym(lib, "nvrtcGetSupportedArchs");
    if (!create || !compile || !logsize || !getlog || !destroy)
        fg_fatal("FAKEGPU_REAL_NVRTC=%s is not an NVRTC library", path);
    for (i = 0; i < nopt; i++) ropts[i] = opts[i];
    for (i = 0; i < nopt; i++) { /* the architecture: "--gpu-architecture=X", "-arch=X", or either name, then X */
        int j = i, want, is_sm = 0, k, cnt = 0, have[64], best = 0;
        const char* v = !strncmp(opts[i], "--gpu-architecture=", 19) ? opts[i] + 19
                        : !strncmp(opts[i], "-arch=", 6)              ? opts[i] + 6
                        : (!strcmp(opts[i], "--gpu-architecture") || !strcmp(opts[i], "-arch")) && i + 1 < nopt
                            ? opts[j = i + 1]
                            : NULL;
        if (!v || !(want = fg_parse_arch(v, &is_sm)) || !narch || !archs) continue;
        if (narch(&cnt) != NVRTC_SUCCESS || cnt <= 0 || cnt > 64 || archs(have) != NVRTC_SUCCESS) continue;
        for (k = 0; k < cnt; k++)
            if (have[k] <= want && have[k] > best) best = have[k];
        if (!best) best = have[0]; /* all newer than the one asked: its oldest */
        snprintf(arch_opt, sizeof arch_opt, "%s%s_%d", j == i ? "--gpu-architecture=" : "", is_sm ? "sm" : "compute",
                 best);
        ropts[j] = arch_opt;
        break;
    }
    if (create(&rp, p->src, p->name, 0, NULL, NULL) != NVRTC_SUCCESS) fg_fatal("the real nvrtcCreateProgram failed");
    r = compile(rp, nopt, ropts);
    if (r != NVRTC_SUCCESS) {
        if (logsize(rp, &n) != NVRTC_SUCCESS || !(log = (char*)calloc(n + 1, 1))) fg_fatal("the real NVRTC's log");
        getlog(rp, log);
        if (!(msg = (char*)malloc(n + 256))) fg_fatal("out of memory");
        snprintf(msg, n + 256,
                 "the real NVRTC refuses this program, as it would on a GPU (the stand-in asks the toolkit's NVRTC "
                 "too; FAKEGPU_REAL_NVRTC= with nothing after it stops that):\n%s",
                 log);
        fg_set_log(p, msg);
        free(msg), free(log);
    } else if ((fd = open(mark, O_WRONLY | O_CREAT, 0600)) >= 0) {
        close(fd);
    }
    destroy(&rp);
    return r == NVRTC_SUCCESS ? NVRTC_SUCCESS : NVRTC_ERROR_COMPILATION;
}

FG_EXPORT nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int nopt, const char* const* opts) {
    int i, arch = 75, real = 0, ndefs = 0;
    char std_flag[32] = "-std=c++17", *defs[32], names[8192], dir[1024], so[1200], tmp[1300], cpp[1300], logp[1300];
    char* shim;
    size_t shim_n = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    const char* tmpdir = getenv("TMPDIR");
    FILE* f;
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    if (nopt < 0 || (nopt > 0 && !opts)) return NVRTC_ERROR_INVALID_INPUT;
    fg_set_log(p, "");
    for (i = 0; i < nopt; i++) {
        const char* o = opts[i];
        const char* v = NULL;
        char msg[512];
        if (!o) return NVRTC_ERROR_INVALID_INPUT;
        if (!strncmp(o, "--gpu-architecture=", 19)) v = o + 19;
        else if (!strncmp(o, "-arch=", 6)) v = o + 6;
        else if ((!strcmp(o, "--gpu-architecture") || !strcmp(o, "-arch")) && i + 1 < nopt) v = opts[++i];
        if (v) {
            if (!(arch = fg_parse_arch(v, &real))) {
                fg_set_log(p, "nvrtc: error: invalid value for --gpu-architecture (-arch)\n");
                return NVRTC_ERROR_INVALID_OPTION;
            }
            continue;
        }
        if (!strncmp(o, "--std=", 6) || !strncmp(o, "-std=", 5)) {
            const char* s = strchr(o, '=') + 1;
            if (strcmp(s, "c++03") && strcmp(s, "c++11") && strcmp(s, "c++14") && strcmp(s, "c++17") && strcmp(s, "c++20")) {
                fg_set_log(p, "nvrtc: error: invalid value for --std (-std)\n");
                return NVRTC_ERROR_INVALID_OPTION;
            }
            /* the shim itself needs C++14 or later */
            snprintf(std_flag, sizeof std_flag, "-std=%s", strcmp(s, "c++20") ? "c++17" : "c++20");
            continue;
        }
        if ((!strncmp(o, "-D", 2) && o[2]) || !strncmp(o, "--define-macro=", 15)) {
            if (ndefs < 32) defs[ndefs++] = (char*)o;
            continue;
        }
        if (!strcmp(o, "-default-device") || !strcmp(o, "--device-debug") || !strcmp(o, "-G") ||
            !strcmp(o, "-lineinfo") || !strcmp(o, "--generate-line-info") || !strcmp(o, "--use_fast_math") ||
            !strcmp(o, "-use_fast_math") || !strncmp(o, "-ftz=", 5) || !strncmp(o, "-prec-div=", 10) ||
            !strncmp(o, "-prec-sqrt=", 11) || !strncmp(o, "-fmad=", 6))
            continue;
        snprintf(msg, sizeof msg, "nvrtc: error: unrecognized option %s\n", o);
        fg_set_log(p, msg);
        return NVRTC_ERROR_INVALID_OPTION;
    }
    /* the kernels are the same code for every architecture: the cache key leaves it out */
    if (!(shim = fg_read_file(FAKEGPU_SHIM, &shim_n))) fg_fatal("cannot read the kernel shim %s", FAKEGPU_SHIM);
    h = fg_fnv(h, shim, shim_n + 1);
    h = fg_fnv(h, std_flag, strlen(std_flag) + 1);
    for (i = 0; i < ndefs; i++) h = fg_fnv(h, defs[i], strlen(defs[i]) + 1);
    h = fg_fnv(h, p->src, strlen(p->src) + 1);
    if (getenv("FAKEGPU_CXX")) h = fg_fnv(h, getenv("FAKEGPU_CXX"), strlen(getenv("FAKEGPU_CXX")));
    if (getenv("FAKEGPU_CACHE") && *getenv("FAKEGPU_CACHE")) snprintf(dir, sizeof dir, "%s", getenv("FAKEGPU_CACHE"));
    else snprintf(dir, sizeof dir, "%s/fakegpu-cache-%d", tmpdir && *tmpdir ? tmpdir : "/tmp", (int)getuid());
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) fg_fatal("cannot make the kernel cache %s: %s", dir, strerror(errno));
    if (fg_real_nvrtc(p, nopt, opts, dir) != NVRTC_SUCCESS) {
        free(shim);
        return NVRTC_ERROR_COMPILATION;
    }
    snprintf(so, sizeof so, "%s/%016llx.so", dir, (unsigned long long)h);
    fg_kernel_names(p->src, names, sizeof names);
    if (access(so, R_OK) != 0) {
        int rc;
        char* line;
        snprintf(cpp, sizeof cpp, "%s/%016llx-%d.cpp", dir, (unsigned long long)h, (int)getpid());
        snprintf(tmp, sizeof tmp, "%s/%016llx-%d.so", dir, (unsigned long long)h, (int)getpid());
        snprintf(logp, sizeof logp, "%s/%016llx-%d.log", dir, (unsigned long long)h, (int)getpid());
        if (!(f = fopen(cpp, "w"))) fg_fatal("cannot write %s: %s", cpp, strerror(errno));
        fprintf(f, "%s\n#line 1 \"%s\"\n%s\n", shim, p->name, p->src);
        for (line = names; *line;) {
            char* nl = strchr(line, '\n');
            fprintf(f, "FG_KERNEL(%.*s)\n", (int)(strchr(line, ' ') - line), line);
            line = nl + 1;
        }
        fclose(f);
        rc = fg_run_compiler(cpp, tmp, logp, std_flag, defs, ndefs);
        if (rc != 0) {
            size_t n = 0;
            char* log = fg_read_file(logp, &n);
            const char* coop[] = {"__syncthreads", "__shared__", "__shfl", "__syncwarp"};
            const char* why = NULL;
            size_t k;
            for (k = 0; k < sizeof coop / sizeof coop[0] && !why; k++)
                if (strstr(p->src, coop[k])) why = coop[k];
            if (why && log) { /* a reason the log would not give: the stand-in's own limit */
                size_t m = strlen(log) + 512;
                char* both = (char*)malloc(m);
                if (both) {
                    snprintf(both, m,
                             "fakegpu: this program uses %s, which the GPU stand-in cannot run: it runs the threads "
                             "of a block one after another, so threads that wait for each other or share a block's "
                             "memory need a real GPU (%s). The host compiler said:\n%s",
                             why, *fg_real_nvrtc_path() ? "the real NVRTC accepted it" : "test it there", log);
                    free(log);
                    log = both;
                }
            }
            fg_set_log(p, log ? log : "the host compiler (FAKEGPU_CXX, default c++) could not be started\n");
            free(log);
            unlink(cpp), unlink(tmp), unlink(logp);
            free(shim);
            return NVRTC_ERROR_COMPILATION;
        }
        if (rename(tmp, so) != 0) fg_fatal("rename %s: %s", tmp, strerror(errno));
        unlink(cpp), unlink(logp);
    }
    free(shim);
    /* the images */
    {
        int vmaj = fg_cfg()->nvrtc_major >= 13 ? 9 : 8, vmin = fg_cfg()->nvrtc_minor;
        size_t cap = strlen(names) * 64 + 4096, used;
        char* line;
        free(p->ptx);
        free(p->cubin);
        p->cubin = NULL, p->cubin_n = 0;
        if (!(p->ptx = (char*)malloc(cap))) return NVRTC_ERROR_OUT_OF_MEMORY;
        used = (size_t)snprintf(p->ptx, cap,
                                "//\n// Generated by fakegpu, a CPU stand-in for NVRTC: not real PTX\n//\n\n"
                                ".version %d.%d\n.target sm_%d\n.address_size 64\n// fakegpu-object %s\n\n",
                                vmaj, vmin, arch, so);
        for (line = names; *line;) {
            char* nl = strchr(line, '\n');
            int k, np = atoi(strchr(line, ' ') + 1), nlen = (int)(strchr(line, ' ') - line);
            used += (size_t)snprintf(p->ptx + used, cap - used, ".visible .entry %.*s(\n", nlen, line);
            for (k = 0; k < np && used < cap; k++)
                used += (size_t)snprintf(p->ptx + used, cap - used, "\t.param .b64 %.*s_param_%d%s\n", nlen, line, k,
                                         k + 1 < np ? "," : "");
            if (used < cap) used += (size_t)snprintf(p->ptx + used, cap - used, ")\n{\n\tret;\n}\n\n");
            line = nl + 1;
        }
        p->ptx_n = used + 1;
        if (real) {
            char head[1400];
            p->cubin_n = (size_t)snprintf(head, sizeof head, "FAKEGPU-CUBIN sm_%d %s", arch, so) + 1;
            if (!(p->cubin = (char*)malloc(p->cubin_n))) return NVRTC_ERROR_OUT_OF_MEMORY;
            memcpy(p->cubin, head, p->cubin_n);
        }
    }
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetPTXSize(nvrtcProgram p, size_t* n) {
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!n) return NVRTC_ERROR_INVALID_INPUT;
    if (!p->ptx) return NVRTC_ERROR_INVALID_PROGRAM; /* not compiled */
    *n = p->ptx_n;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetPTX(nvrtcProgram p, char* out) {
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!out) return NVRTC_ERROR_INVALID_INPUT;
    if (!p->ptx) return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(out, p->ptx, p->ptx_n);
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t* n) {
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!n) return NVRTC_ERROR_INVALID_INPUT;
    if (!p->ptx) return NVRTC_ERROR_INVALID_PROGRAM;
    *n = p->cubin_n; /* 0 after a compile for a virtual architecture, as NVRTC says */
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char* out) {
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!out) return NVRTC_ERROR_INVALID_INPUT;
    if (!p->ptx) return NVRTC_ERROR_INVALID_PROGRAM;
    if (p->cubin_n) memcpy(out, p->cubin, p->cubin_n);
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t* n) {
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!n) return NVRTC_ERROR_INVALID_INPUT;
    *n = (p->log ? strlen(p->log) : 0) + 1;
    return NVRTC_SUCCESS;
}

FG_EXPORT nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char* out) {
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    if (!out) return NVRTC_ERROR_INVALID_INPUT;
    strcpy(out, p->log ? p->log : "");
    return NVRTC_SUCCESS;
}

int fg_image_parse(const void* image, char* so_path, size_t n, int* is_cubin, int* target, int* ptx_major,
                   int* ptx_minor) {
    const char* s = (const char*)image;
    const char *v, *t, *o;
    char path[4096];
    *is_cubin = 0, *target = 0, *ptx_major = *ptx_minor = 0;
    if (sscanf(s, "FAKEGPU-CUBIN sm_%d %4095s", target, path) == 2) {
        *is_cubin = 1;
        snprintf(so_path, n, "%s", path);
        return 1;
    }
    v = strstr(s, "\n.version ");
    t = strstr(s, "\n.target sm_");
    o = strstr(s, "// fakegpu-object ");
    if (!v || !t || !o || sscanf(v + 10, "%d.%d", ptx_major, ptx_minor) != 2 || sscanf(t + 12, "%d", target) != 1 ||
        sscanf(o + 18, "%4095s", path) != 1)
        return 0;
    snprintf(so_path, n, "%s", path);
    return 1;
}
