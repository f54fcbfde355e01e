/* tests/fuzz/fuzz_store.c: libFuzzer target for the store server's message handling (>>store:
   ddp__server_read, ddp__serve, ddp__server_wake_parked).

   A ddp__server is built by hand (no listening socket, no thread) with connections whose fds are
   one end of non-blocking AF_UNIX socket pairs; the harness writes the input into the other end
   in small pieces, calls ddp__server_read after each piece as the server thread would, wakes the
   parked requests, and reads every reply back, checking its framing (magic, status 0..3, length
   then the value). At the end parked requests time out as they would on the server, and
   everything is freed (LeakSanitizer checks that nothing is left).

   The first input byte picks the mode:
     0  the bytes go to one fresh connection (no HELLO): the handshake and header checks
     1  one connection that has already sent a valid HELLO with the job token: SET, GET, ADD,
        WAIT, CHECK and malformed requests
     2  two connections, both after HELLO; the rest is pieces, each a byte (bit 0: which
        connection, bits 1-7: length - 1) then that many bytes: a WAIT on one answered by a SET
        on the other, and so on

   Build:  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -DDDP_NO_CUDA \
             -I. tests/fuzz/fuzz_store.c -o fuzz_store -lpthread -lm      (or: make fuzz)
   Seeds:  DDP_FUZZ_WRITE_SEEDS=DIR ./fuzz_store   writes a few valid conversations to DIR and
           exits; tests/fuzz/corpus_store/ holds the same kind of files. */
#define DDP_IMPLEMENTATION
#include "ddp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOKEN "fuzz-job-token"
#define PIECE 64 /* bytes written before each ddp__server_read in modes 0 and 1 */

static void quiet(ddp_log_level level, const char* line, void* user) { (void)level, (void)line, (void)user; }

static void die(const char* what) {
    fprintf(stderr, "fuzz_store: %s\n", what);
    abort();
}

/* The client side of one connection: its socket and the reply being read. */
typedef struct peer {
    int fd;          /* -1 once the server dropped the connection */
    int server_fd;   /* the server's end, to find the connection after indexes shift */
    unsigned char head[12];
    size_t got;      /* bytes of the current reply's header read */
    uint64_t body_left;
    long replies;
} peer;

static int set_nonblocking(int fd) { return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static ddp__server* server_new(void) {
    ddp__server* s = (ddp__server*)ddp__calloc(sizeof *s);
    if (!s) die("calloc");
    s->listen_fd = -1;
    s->wake[0] = s->wake[1] = -1;
    s->idle_s = 10.0;
    pthread_mutex_init(&s->lock, NULL);
    snprintf(s->token, sizeof s->token, "%s", TOKEN);
    return s;
}

static void conn_add(ddp__server* s, peer* p) {
    int sv[2];
    ddp__sconn* c;
    memset(p, 0, sizeof *p);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) die("socketpair");
    set_nonblocking(sv[0]);
    set_nonblocking(sv[1]);
    if (s->nconns == s->capconns) {
        int cap = s->capconns ? 2 * s->capconns : 4;
        ddp__sconn* grown = (ddp__sconn*)ddp__malloc((size_t)cap * sizeof *grown);
        if (!grown) die("malloc");
        if (s->nconns) memcpy(grown, s->conns, (size_t)s->nconns * sizeof *grown);
        if (s->conns) DDP_FREE(s->conns);
        s->conns = grown;
        s->capconns = cap;
    }
    c = &s->conns[s->nconns++];
    memset(c, 0, sizeof *c);
    c->fd = sv[0];
    c->since = ddp__now();
    snprintf(c->peer, sizeof c->peer, "fuzz peer %d", sv[1]);
    p->fd = sv[1];
    p->server_fd = sv[0];
}

static int conn_index(ddp__server* s, int server_fd) {
    int i;
    for (i = 0; i < s->nconns; i++)
        if (s->conns[i].fd == server_fd) return i;
    return -1;
}

/* Read every reply byte waiting for p and check the framing. */
static void drain(peer* p) {
    unsigned char buf[4096];
    for (;;) {
        ssize_t k;
        size_t i;
        if (p->fd < 0) return;
        k = recv(p->fd, buf, sizeof buf, 0);
        if (k <= 0) return; /* EAGAIN, or the server closed its end */
        for (i = 0; i < (size_t)k;) {
            if (p->body_left) {
                size_t take = (size_t)k - i < p->body_left ? (size_t)k - i : (size_t)p->body_left;
                p->body_left -= take;
                i += take;
                continue;
            }
            p->head[p->got++] = buf[i++];
            if (p->got == 12) {
                if (ddp__le32(p->head) != DDP__STORE_MAGIC) die("a reply without the magic");
                if (p->head[4] > DDP__ST_BAD || p->head[5] || p->head[6] || p->head[7]) die("a reply with a bad status");
                p->body_left = ddp__le32(p->head + 8);
                if (p->body_left > DDP_STORE_MAX_VALUE) die("a reply longer than any value");
                p->got = 0;
                p->replies++;
            }
        }
    }
}

/* A request as the client writes it. */
static size_t request(unsigned char* out, int op, const char* key, size_t klen, const void* val, size_t vlen,
                      uint32_t timeout_ms) {
    ddp__put_le32(out, DDP__STORE_MAGIC);
    out[4] = DDP__STORE_VERSION & 0xff, out[5] = DDP__STORE_VERSION >> 8;
    out[6] = (unsigned char)op, out[7] = 0;
    ddp__put_le32(out + 8, (uint32_t)klen);
    ddp__put_le32(out + 12, (uint32_t)vlen);
    ddp__put_le32(out + 16, timeout_ms);
    if (klen) memcpy(out + 20, key, klen);
    if (vlen) memcpy(out + 20 + klen, val, vlen);
    return 20 + klen + vlen;
}

/* Give bytes to the connection of p, let the server read them, wake the parked, drop on error. */
static void feed(ddp__server* s, peer* peers, int npeers, peer* p, const unsigned char* data, size_t n) {
    int i, r;
    if (p->fd < 0) return;
    if (n && send(p->fd, data, n, MSG_NOSIGNAL) != (ssize_t)n) die("the socket pair did not take a small piece");
    i = conn_index(s, p->server_fd);
    if (i < 0) die("a live peer without its connection");
    r = ddp__server_read(s, i);
    ddp__server_wake_parked(s); /* as the server thread does, before it drops a connection */
    if (r != 0 && (i = conn_index(s, p->server_fd)) >= 0) ddp__sconn_close(s, i, NULL);
    for (i = 0; i < npeers; i++) {
        drain(&peers[i]);
        if (peers[i].fd >= 0 && conn_index(s, peers[i].server_fd) < 0) { /* dropped by the server */
            drain(&peers[i]);
            close(peers[i].fd);
            peers[i].fd = -1;
        }
    }
}

static void hello(ddp__server* s, peer* peers, int npeers, peer* p) {
    unsigned char b[64];
    size_t n = request(b, DDP__OP_HELLO, NULL, 0, TOKEN, strlen(TOKEN), 0);
    feed(s, peers, npeers, p, b, n);
    if (p->fd < 0 || p->replies != 1 || !s->conns[conn_index(s, p->server_fd)].hello) die("the valid HELLO was refused");
}

static void write_seed(const char* dir, const char* name, const unsigned char* b, size_t n) {
    char path[512];
    FILE* f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) die("cannot write a seed");
}

/* Valid conversations for each mode (the seed corpus), then exit. */
static void write_seeds(const char* dir) {
    unsigned char b[2048], *p;
    unsigned char delta[8];
    const char* keys[2] = {"k1", "count"};
    unsigned char list[64];
    size_t nl = 0, i;
    for (i = 0; i < 2; i++) { /* a WAIT/CHECK list: u32 length, bytes */
        ddp__put_le32(list + nl, (uint32_t)strlen(keys[i]));
        memcpy(list + nl + 4, keys[i], strlen(keys[i]));
        nl += 4 + strlen(keys[i]);
    }
    ddp__put_le64(delta, 3);
    /* mode 0: HELLO then a few requests; and a wrong token */
    p = b;
    *p++ = 0;
    p += request(p, DDP__OP_HELLO, NULL, 0, TOKEN, strlen(TOKEN), 0);
    p += request(p, DDP__OP_SET, "k1", 2, "value", 5, 0);
    p += request(p, DDP__OP_GET, "k1", 2, NULL, 0, 1000);
    write_seed(dir, "seed_store_hello", b, (size_t)(p - b));
    p = b;
    *p++ = 0;
    p += request(p, DDP__OP_HELLO, NULL, 0, "wrong", 5, 0);
    write_seed(dir, "seed_store_wrong_token", b, (size_t)(p - b));
    /* mode 1: every operation */
    p = b;
    *p++ = 1;
    p += request(p, DDP__OP_SET, "k1", 2, "value", 5, 0);
    p += request(p, DDP__OP_ADD, "count", 5, delta, 8, 0);
    p += request(p, DDP__OP_ADD, "count", 5, delta, 8, 0);
    p += request(p, DDP__OP_CHECK, NULL, 0, list, nl, 0);
    p += request(p, DDP__OP_WAIT, NULL, 0, list, nl, 1000);
    p += request(p, DDP__OP_GET, "k1", 2, NULL, 0, 1000);
    write_seed(dir, "seed_store_ops", b, (size_t)(p - b));
    p = b;
    *p++ = 1;
    p += request(p, DDP__OP_GET, "absent", 6, NULL, 0, 50); /* parks, then times out */
    write_seed(dir, "seed_store_parked", b, (size_t)(p - b));
    /* mode 2: a WAIT on connection 0 answered by a SET on connection 1 */
    {
        unsigned char r[256];
        size_t n = request(r, DDP__OP_WAIT, NULL, 0, list, 4 + 2, 1000); /* waits for k1 */
        p = b;
        *p++ = 2;
        *p++ = (unsigned char)(((n - 1) << 1) | 0);
        memcpy(p, r, n), p += n;
        n = request(r, DDP__OP_SET, "k1", 2, "v", 1, 0);
        *p++ = (unsigned char)(((n - 1) << 1) | 1);
        memcpy(p, r, n), p += n;
        write_seed(dir, "seed_store_two_conns", b, (size_t)(p - b));
    }
    exit(0);
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc, (void)argv;
    ddp__set_log(quiet, NULL);
    if (getenv("DDP_FUZZ_WRITE_SEEDS")) write_seeds(getenv("DDP_FUZZ_WRITE_SEEDS"));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    ddp__server* s;
    peer peers[2];
    int npeers, mode, i;
    size_t at;
    if (size < 1) return 0;
    mode = data[0] % 3;
    data++, size--;
    s = server_new();
    npeers = mode == 2 ? 2 : 1;
    for (i = 0; i < npeers; i++) conn_add(s, &peers[i]);
    for (i = 0; mode > 0 && i < npeers; i++) hello(s, peers, npeers, &peers[i]);
    if (mode < 2) {
        for (at = 0; at < size; at += PIECE)
            feed(s, peers, npeers, &peers[0], data + at, size - at < PIECE ? size - at : PIECE);
    } else {
        for (at = 0; at < size;) {
            peer* p = &peers[data[at] & 1];
            size_t n = (size_t)(data[at] >> 1) + 1;
            at++;
            if (n > size - at) n = size - at;
            feed(s, peers, npeers, p, data + at, n);
            at += n;
        }
    }
    /* the end of the run: parked requests time out as on the server */
    for (i = 0; i < s->nconns; i++) {
        ddp__sconn* c = &s->conns[i];
        if (!c->parked) continue;
        c->parked = 0;
        DDP_FREE(c->body);
        c->body = NULL;
        c->got = 0;
        if (ddp__sreply(c, DDP__ST_TIMEOUT, NULL, 0) != 0) ddp__sconn_close(s, i--, NULL);
    }
    for (i = 0; i < npeers; i++) drain(&peers[i]);
    if (getenv("DDP_FUZZ_VERBOSE")) /* what a run did, to see that a seed reaches what it should */
        for (i = 0; i < npeers; i++)
            fprintf(stderr, "fuzz_store: mode %d, connection %d: %ld replies, %s; %d keys stored\n", mode, i,
                    peers[i].replies, peers[i].fd >= 0 ? "open" : "dropped", s->nkv);
    for (i = 0; i < s->nkv; i++) { /* whole entries, each key stored once */
        int j;
        if (!s->kv[i].key || (!s->kv[i].val && s->kv[i].len)) die("a broken key-value entry");
        for (j = 0; j < i; j++)
            if (!strcmp(s->kv[i].key, s->kv[j].key)) die("the same key is stored twice (a key with a NUL byte?)");
    }
    ddp__server_free(s); /* closes the server's ends and frees the keys and values */
    for (i = 0; i < npeers; i++)
        if (peers[i].fd >= 0) close(peers[i].fd);
    return 0;
}
