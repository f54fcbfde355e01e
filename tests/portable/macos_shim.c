/* tests/portable/macos_shim.c: a preload library that makes Linux answer a few calls as macOS (XNU) does,
   so that Linux CI can run the paths a Mac takes (make test-portable, and the shared-memory case
   of make test). Build: cc -shared -fPIC tests/portable/macos_shim.c -o macos_shim.so -ldl
   Use:   LD_PRELOAD=$PWD/macos_shim.so MACOS_SHIM_LOG=shim.log program ...

   What it changes, for POSIX shared-memory objects only (files under /dev/shm, which is where
   glibc's shm_open puts them, and where ddp.h's Linux build opens them directly):
   - ftruncate and posix_fallocate round the object's size up to 16 KiB, the page size of Apple
     silicon, as XNU rounds a shared-memory object to whole pages (fstat then reports the rounded
     size). XNU also refuses to size an object twice (EINVAL); so does this.
   - shm_open refuses a name longer than 31 characters with ENAMETOOLONG (XNU's PSHMNAMLEN).
   and for every file:
   - fcntl(fd, 51), macOS's F_FULLFSYNC, which Linux does not have, is carried out as fsync. A
     program learns the number from Apple's <fcntl.h>; make test-portable passes -DF_FULLFSYNC=51.
   With MACOS_SHIM_LOG set, each call it changed or answered appends one line to that file, so a
   test can count what happened instead of guessing from timings. */
#define _GNU_SOURCE 1
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define SHIM_PAGE 16384L           /* vm_page_size on Apple silicon */
#define SHIM_NAME_MAX 31           /* PSHMNAMLEN in XNU's bsd/kern/posix_shm.c */
#define SHIM_F_FULLFSYNC 51        /* F_FULLFSYNC in Apple's <sys/fcntl.h> */

/* One line to $MACOS_SHIM_LOG. Append mode (O_APPEND) and a single flush at fclose keep the lines of
   several processes whole. */
static void shim_log(const char* fmt, ...) {
    const char* path = getenv("MACOS_SHIM_LOG");
    FILE* f;
    va_list ap;
    if (!path || !*path || !(f = fopen(path, "a"))) return;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

/* The object's name when fd is a POSIX shared-memory object, else NULL. */
static const char* shim_shm_name(int fd, char* buf, size_t n) {
    char link[64];
    ssize_t k;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    k = readlink(link, buf, n - 1);
    if (k <= 0) return NULL;
    buf[k] = 0;
    return strncmp(buf, "/dev/shm/", 9) == 0 ? buf + 8 : NULL;
}

/* The C library's own `name`, into the function pointer at `slot` (POSIX's dlsym idiom: a copy,
   because ISO C has no cast from an object pointer to a function pointer). */
static void shim_next(const char* name, void* slot) {
    void* f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "macos_shim: %s not found in the libraries after the shim\n", name);
        abort();
    }
    memcpy(slot, &f, sizeof f);
}

/* The size XNU would give the object, or -1 with errno (an object sized before). */
static off_t shim_round(int fd, const char* name, off_t len, const char* call) {
    struct stat st;
    off_t r = (len + SHIM_PAGE - 1) / SHIM_PAGE * SHIM_PAGE;
    if (fstat(fd, &st) == 0 && st.st_size != 0) {
        shim_log("%s %s: refused (EINVAL): XNU sizes a shared-memory object once", call, name);
        errno = EINVAL;
        return -1;
    }
    shim_log("%s %s: %lld bytes rounded up to %lld", call, name, (long long)len, (long long)r);
    return r;
}

int ftruncate(int fd, off_t len) {
    static int (*next)(int, off_t);
    char buf[4096];
    const char* name = shim_shm_name(fd, buf, sizeof buf);
    if (!next) shim_next("ftruncate", &next);
    if (name && len > 0) {
        off_t r = shim_round(fd, name, len, "ftruncate");
        if (r < 0) return -1;
        len = r;
    }
    return next(fd, len);
}

int posix_fallocate(int fd, off_t off, off_t len) {
    static int (*next)(int, off_t, off_t);
    char buf[4096];
    const char* name = shim_shm_name(fd, buf, sizeof buf);
    if (!next) shim_next("posix_fallocate", &next);
    if (name && off == 0 && len > 0) {
        off_t r = shim_round(fd, name, len, "posix_fallocate");
        if (r < 0) return errno;
        len = r;
    }
    return next(fd, off, len);
}

int shm_open(const char* name, int oflag, mode_t mode) {
    static int (*next)(const char*, int, mode_t);
    if (!next) shim_next("shm_open", &next);
    if (name && strlen(name) > SHIM_NAME_MAX) {
        shim_log("shm_open %s: refused (ENAMETOOLONG): longer than %d characters", name, SHIM_NAME_MAX);
        errno = ENAMETOOLONG;
        return -1;
    }
    return next(name, oflag, mode);
}

/* fcntl's third argument is an int, a pointer or nothing; passing it on as a pointer-sized
   value is what the C library does itself. */
static int shim_fcntl(int (**next)(int, int, ...), const char* which, int fd, int cmd, void* arg) {
    if (cmd == SHIM_F_FULLFSYNC) {
        int r = fsync(fd);
        shim_log("fcntl F_FULLFSYNC fd %d: done as fsync (%s)", fd, r == 0 ? "ok" : strerror(errno));
        return r;
    }
    if (!*next) shim_next(which, next);
    return (*next)(fd, cmd, arg);
}
/* fcntl and fcntl64 (the same call on 64-bit systems; the C library exports both names). */
#define SHIM_FCNTL(name)                                                                           \
    int name(int fd, int cmd, ...) {                                                               \
        static int (*next)(int, int, ...);                                                         \
        va_list ap;                                                                                \
        void* arg;                                                                                 \
        va_start(ap, cmd);                                                                         \
        arg = va_arg(ap, void*);                                                                   \
        va_end(ap);                                                                                \
        return shim_fcntl(&next, #name, fd, cmd, arg);                                             \
    }
SHIM_FCNTL(fcntl)
SHIM_FCNTL(fcntl64)
