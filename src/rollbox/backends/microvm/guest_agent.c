/* rbx-agent, protocol unit: frames on the virtio-serial port, request dispatch, the
 * guest's lifecycle requests (hello, configure, restored, quiesce with its warm set) and the
 * ppoll main loop. Shared types and declarations: guest_agent.h (which describes the wire
 * protocol); the other units: guest_agent_json.c, guest_agent_exec.c, guest_agent_files.c. */

#include "guest_agent.h"

/* ------------------------------------------------------------------ small helpers */

double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int e = errno;
    close(fd);
    errno = e;
    return w == (ssize_t)n ? 0 : -1;
}

void set_nonblock(int fd, int on) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/* Python's str(OSError(errno, strerror, filename)). */
void oserr_msg(Buf *b, int err, const char *path) {
    if (path) buf_printf(b, "[Errno %d] %s: '%s'", err, strerror(err), path);
    else buf_printf(b, "[Errno %d] %s", err, strerror(err));
}

/* The error object of guest_agent._oserror: not_found / is_dir / not_dir / os. */
static void jo_oserror(JOut *o, int err, const char *path) {
    const char *type = err == ENOENT ? "not_found" : err == EISDIR ? "is_dir"
                     : err == ENOTDIR ? "not_dir" : "os";
    Buf m = {0};
    oserr_msg(&m, err, path);
    buf_addc(&m, '\0');
    jo_key(o, "error");
    buf_adds(&o->b, "{\"type\": ");
    jesc(&o->b, type, strlen(type));
    buf_adds(&o->b, ", \"message\": ");
    jesc(&o->b, m.p, strlen(m.p));
    buf_addc(&o->b, '}');
    buf_free(&m);
}

void jo_error(JOut *o, const char *type, const char *msg) {
    jo_key(o, "error");
    buf_adds(&o->b, "{\"type\": ");
    jesc(&o->b, type, strlen(type));
    buf_adds(&o->b, ", \"message\": ");
    jesc(&o->b, msg, strlen(msg));
    buf_addc(&o->b, '}');
}

static int port = -1;
int connected;
Buf out, inbuf;
Exec *execs;
Write *writes;
Send *sends;
static volatile sig_atomic_t got_signal;
int test_mode; /* --fd: on the host, so never touch host-wide state */
int cgroups_ok;
char spare_cg[160]; /* see make_spare() */ /* the guest's cgroup2 tree is set up (never in --fd test mode) */

static void on_signal(int sig) {
    (void)sig;
    got_signal = 1;
}

void send_frame(int kind, int64_t stream, const void *data, size_t len) {
    if (!connected) return;
    unsigned char h[HDR] = {'R', 'B', (unsigned char)kind,
                            (unsigned char)((uint32_t)stream >> 24), (unsigned char)((uint32_t)stream >> 16),
                            (unsigned char)((uint32_t)stream >> 8), (unsigned char)(uint32_t)stream,
                            (unsigned char)(len >> 24), (unsigned char)(len >> 16),
                            (unsigned char)(len >> 8), (unsigned char)len};
    buf_add(&out, h, HDR);
    buf_add(&out, data, len);
}

/* Finish a reply object and queue it as a T_JSON frame. */
void jo_send(JOut *o) {
    buf_addc(&o->b, '}');
    const char *p = buf_data(&o->b);
    int64_t id = strtoll(p + 7, NULL, 10); /* {"id": N */
    send_frame(T_JSON, id, p, buf_size(&o->b));
    buf_free(&o->b);
}

void reply_ok(int64_t rid) {
    JOut o;
    jo_begin(&o, rid);
    jo_send(&o);
}

void reply_error(int64_t rid, const char *type, const char *msg) {
    JOut o;
    jo_begin(&o, rid);
    jo_error(&o, type, msg);
    jo_send(&o);
}

void reply_oserror(int64_t rid, int err, const char *path) {
    JOut o;
    jo_begin(&o, rid);
    jo_oserror(&o, err, path);
    jo_send(&o);
}
static char warm_paths[NWARM][PATH_MAX];
static int warm_next;
static const char *const warm_fixed[] = {
    "/etc/ld.so.cache", "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6",
    "/lib/ld-musl-x86_64.so.1", "/bin/sh",
};

/* Remember an executable that ran (a ring of the last NWARM distinct ones). */
void warm_note(const char *path) {
    if (!*path || strlen(path) >= PATH_MAX) return;
    for (int k = 0; k < NWARM; k++)
        if (strcmp(warm_paths[k], path) == 0) return;
    snprintf(warm_paths[warm_next], PATH_MAX, "%s", path);
    warm_next = (warm_next + 1) % NWARM;
}

/* Which pages of `path` are in the page cache now; fd -1 if none or not a file. */
static Warm warm_scan(const char *path) {
    Warm w = {-1, 0, NULL};
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0) return w;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        close(fd);
        return w;
    }
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = ((size_t)st.st_size + pg - 1) / pg;
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char *vec = malloc(pages);
    if (map == MAP_FAILED || !vec || mincore(map, (size_t)st.st_size, vec) < 0) {
        if (map != MAP_FAILED) munmap(map, (size_t)st.st_size);
        free(vec);
        close(fd);
        return w;
    }
    munmap(map, (size_t)st.st_size);
    w.fd = fd;
    w.pages = pages;
    w.vec = vec;
    return w;
}

/* Read the recorded pages back in (no readahead beyond them). */
static void warm_load(Warm *w) {
    static char page[65536];
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    posix_fadvise(w->fd, 0, 0, POSIX_FADV_RANDOM);
    for (size_t k = 0; k < w->pages; k++) {
        if (!(w->vec[k] & 1)) continue;
        size_t run = 1;
        while (k + run < w->pages && (w->vec[k + run] & 1) && (run + 1) * pg <= sizeof page) run++;
        if (pread(w->fd, page, run * pg, (off_t)(k * pg)) < 0) break;
        k += run - 1;
    }
    close(w->fd);
    free(w->vec);
}

/* drop_caches, except the pages of the warm set that were cached. */
static void drop_caches_keep_warm(void) {
    enum { NF = sizeof warm_fixed / sizeof warm_fixed[0] };
    Warm ws[NF + NWARM];
    size_t n = 0;
    for (size_t k = 0; k < NF; k++) ws[n++] = warm_scan(warm_fixed[k]);
    for (int k = 0; k < NWARM; k++)
        if (warm_paths[k][0]) ws[n++] = warm_scan(warm_paths[k]);
    write_text("/proc/sys/vm/drop_caches", "1");
    for (size_t k = 0; k < n; k++)
        if (ws[k].fd >= 0) warm_load(&ws[k]);
}

static void disconnected(void) {
    connected = 0;
    /* Keep pending output: the "host connected" event and the first data of a new client
     * travel on different virtqueues, so a hello can be read (and answered) before the
     * guest learns the old client left; dropping output here would lose that answer.
     * Stale frames are skipped by the next client (it waits for its nonce). */
    if (buf_size(&out) > (16u << 20)) buf_consume(&out, buf_size(&out));
    buf_consume(&inbuf, buf_size(&inbuf));
    for (Exec *e = execs; e; e = e->next) exec_kill(e);
    while (writes) close_write(writes, 1);
    while (sends) {
        Send *s = sends;
        sends = s->next;
        close(s->fd);
        free(s);
    }
}

static void op_hello(int64_t rid, const JVal *req) {
    for (Exec *e = execs; e; e = e->next) exec_kill(e);
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    JOut o;
    jo_begin(&o, rid);
    jo_key(&o, "nonce");
    JVal *nonce = jget(req, "nonce");
    if (nonce) jdump(&o.b, nonce);
    else buf_adds(&o.b, "null");
    jo_int(&o, "agent_version", AGENT_VERSION);
    jo_str(&o, "agent", "c");
    jo_key(&o, "uptime");
    buf_printf(&o.b, "%.9f", (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
    jo_send(&o);
}

static void op_configure(int64_t rid, const JVal *req) {
    const char *host = jstr(req, "hostname");
    if (host && *host && !test_mode && sethostname(host, strlen(host)) < 0) {
        Buf m = {0};
        oserr_msg(&m, errno, NULL);
        buf_addc(&m, '\0');
        reply_error(rid, "agent", m.p);
        buf_free(&m);
        return;
    }
    const char *keys[][2] = {{"memory_max", "memory.max"}, {"pids_max", "pids.max"}};
    for (size_t k = 0; k < 2; k++) {
        char val[32] = "max", p[PATH_MAX];
        int64_t v;
        if (jtruthy(jget(req, keys[k][0])) && jint(req, keys[k][0], &v))
            snprintf(val, sizeof val, "%lld", (long long)v);
        snprintf(p, sizeof p, "%s/%s", WORKLOAD, keys[k][1]);
        write_text(p, val);
    }
    if (jtruthy(jget(req, "memory_max"))) write_text(WORKLOAD "/memory.swap.max", "0");
    full_command_caps = jtruthy(jget(req, "full_command_caps"));
    reply_ok(rid);
}

static void op_restored(int64_t rid, const JVal *req) {
    const JVal *t = jget(req, "time_ns");
    const char *ent = jstr(req, "entropy");
    if (!t || t->t != J_NUM || !ent) {
        reply_error(rid, "agent", "restored needs time_ns and entropy");
        return;
    }
    struct timespec ts;
    if (t->is_int) {
        ts.tv_sec = (time_t)(t->i / 1000000000);
        ts.tv_nsec = (long)(t->i % 1000000000);
    } else {
        ts.tv_sec = (time_t)(t->d / 1e9);
        ts.tv_nsec = (long)(t->d - (double)ts.tv_sec * 1e9);
    }
    if (ts.tv_nsec < 0 || ts.tv_nsec >= 1000000000) ts.tv_nsec = 0;
    if (!test_mode) clock_settime(CLOCK_REALTIME, &ts);
    /* base64 (non-alphabet characters skipped, like binascii's default) */
    unsigned char seed[512];
    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (const char *p = ent; *p && n < sizeof seed; p++) {
        int v = b64val((unsigned char)*p);
        if (v < 0) continue;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            seed[n++] = (unsigned char)(acc >> bits);
        }
    }
    struct {
        int entropy_count, buf_size;
        unsigned char buf[512];
    } info;
    info.entropy_count = (int)n * 8;
    info.buf_size = (int)n;
    memcpy(info.buf, seed, n);
    int fd = test_mode ? -1 : open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (!test_mode && (fd < 0 || ioctl(fd, RNDADDENTROPY, &info) < 0)) {
        int err = errno;
        if (fd >= 0) close(fd);
        Buf m = {0};
        oserr_msg(&m, err, NULL);
        buf_addc(&m, '\0');
        reply_error(rid, "agent", m.p);
        buf_free(&m);
        return;
    }
    if (fd >= 0) {
        ioctl(fd, RNDRESEEDCRNG);
        close(fd);
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    JOut o;
    jo_begin(&o, rid);
    jo_int(&o, "time_ns", (int64_t)now.tv_sec * 1000000000 + now.tv_nsec);
    jo_send(&o);
}

static void op_quiesce(int64_t rid, const JVal *req) {
    make_spare(); /* in the snapshot: the first exec after a restore needs no mkdir */
    sync();
    if (jtruthy(jget(req, "drop_caches")) && !test_mode) drop_caches_keep_warm();
    reply_ok(rid);
}

static void handle_json(int64_t stream, const char *payload, size_t len) {
    const char *err = NULL;
    JVal *req = jparse(payload, len, &err);
    if (!req || req->t != J_OBJ) {
        Buf m = {0};
        buf_printf(&m, "malformed request: %s", req ? "not a JSON object" : err);
        buf_addc(&m, '\0');
        reply_error(stream, "agent", m.p);
        buf_free(&m);
        jfree(req);
        return;
    }
    int64_t rid = 0;
    jint(req, "id", &rid);
    const char *op = jstr(req, "op");
    if (!op) reply_error(stream, "agent", "request without an op");
    else if (!strcmp(op, "hello")) op_hello(rid, req);
    else if (!strcmp(op, "ping")) reply_ok(rid);
    else if (!strcmp(op, "configure")) op_configure(rid, req);
    else if (!strcmp(op, "exec")) op_exec(rid, req);
    else if (!strcmp(op, "kill")) op_kill(rid, req);
    else if (!strcmp(op, "restored")) op_restored(rid, req);
    else if (!strcmp(op, "quiesce")) op_quiesce(rid, req);
    else if (!strcmp(op, "stat")) op_stat(rid, req);
    else if (!strcmp(op, "read_file")) op_read_file(rid, req);
    else if (!strcmp(op, "write_file")) op_write_file(rid, req);
    else if (!strcmp(op, "get_tar")) op_tool(rid, op, req, K_TOOL_OUT);
    else if (!strcmp(op, "fs_diff")) op_tool(rid, op, req, K_TOOL_OUT);
    else if (!strcmp(op, "put_tar")) op_tool(rid, op, req, K_TOOL_IN);
    else {
        Buf m = {0};
        buf_adds(&m, "unknown op ");
        jesc(&m, op, strlen(op));
        buf_addc(&m, '\0');
        reply_error(stream, "agent", m.p);
        buf_free(&m);
    }
    jfree(req);
}

static void handle(int kind, int64_t stream, const char *payload, size_t len) {
    if (kind == T_JSON) {
        handle_json(stream, payload, len);
        return;
    }
    Exec *e = find_exec(stream);
    if (e && e->kind == K_EXEC && (kind == T_IN || kind == T_EOF)) {
        feed_stdin(e, payload, len, kind == T_EOF);
        return;
    }
    if (e && e->kind == K_TOOL_IN && (kind == T_DATA || kind == T_EOF)) {
        feed_stdin(e, payload, len, kind == T_EOF);
        return;
    }
    Write *w = writes;
    while (w && w->rid != stream) w = w->next;
    if (!w) return;
    if (kind == T_DATA && w->fd >= 0 && !w->err) {
        size_t off = 0;
        while (off < len) {
            ssize_t n = write(w->fd, payload + off, len - off);
            if (n < 0) {
                if (errno == EINTR) continue;
                w->err = errno;
                break;
            }
            off += (size_t)n;
        }
    } else if (kind == T_EOF) {
        finish_write(w);
    }
}

/* ------------------------------------------------------------------ transport, loop */

static void open_port(void) {
    const char *base = "/sys/class/virtio-ports";
    while (port < 0) {
        DIR *d = opendir(base);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char p[PATH_MAX], name[64] = "";
            snprintf(p, sizeof p, "%s/%s/name", base, de->d_name);
            FILE *f = fopen(p, "re");
            if (!f) continue;
            if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = '\0';
            fclose(f);
            if (strcmp(name, PORT_NAME) == 0) {
                snprintf(p, sizeof p, "/dev/%s", de->d_name);
                port = open(p, O_RDWR | O_NONBLOCK | O_CLOEXEC);
                if (port >= 0) break;
            }
        }
        if (d) closedir(d);
        if (port < 0) usleep(10000);
    }
    /* SIGIO when the host (dis)connects, so we need not poll while nobody is there */
    fcntl(port, F_SETOWN, getpid());
    fcntl(port, F_SETFL, fcntl(port, F_GETFL) | O_ASYNC);
}

void flush_out(void) {
    while (buf_size(&out)) {
        size_t n = buf_size(&out);
        ssize_t w = write(port, buf_data(&out), n > CHUNK ? CHUNK : n);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            disconnected();
            return;
        }
        buf_consume(&out, (size_t)w);
    }
}

/* Frames out of inbuf (resynchronising on the magic after garbage), each handled. */
static void parse_frames(void) {
    while (1) {
        size_t have = buf_size(&inbuf);
        unsigned char *p = (unsigned char *)buf_data(&inbuf);
        if (have < HDR) return;
        if (p[0] != 'R' || p[1] != 'B') {
            size_t i = 1;
            while (i + 1 < have && !(p[i] == 'R' && p[i + 1] == 'B')) i++;
            buf_consume(&inbuf, i + 1 < have ? i : have - 1);
            continue;
        }
        int kind = p[2];
        uint32_t stream = (uint32_t)p[3] << 24 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 8 | p[6];
        uint32_t len = (uint32_t)p[7] << 24 | (uint32_t)p[8] << 16 | (uint32_t)p[9] << 8 | p[10];
        if (len > MAX_FRAME || kind < T_JSON || kind > T_EOF) { /* not a real header */
            buf_consume(&inbuf, 2);
            continue;
        }
        if (have < HDR + len) return;
        /* handle() may grow `out` but never inbuf: copy the payload out first anyway, a
         * disconnect inside handle() would clear inbuf under us */
        char *payload = malloc(len + 1);
        if (!payload) abort();
        memcpy(payload, p + HDR, len);
        payload[len] = '\0';
        buf_consume(&inbuf, HDR + len);
        handle(kind, stream, payload, len);
        free(payload);
    }
}

static void read_port(void) {
    static char data[CHUNK];
    ssize_t n = read(port, data, sizeof data);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        connected = 1;
        return;
    }
    if (n <= 0) {
        if (connected) disconnected();
        return;
    }
    connected = 1;
    buf_add(&inbuf, data, (size_t)n);
    parse_frames();
}

static void pump_sends(void) {
    static char data[CHUNK];
    while (sends && buf_size(&out) < CHUNK * 4) {
        Send *s = sends;
        ssize_t n = read(s->fd, data, sizeof data);
        if (n < 0 && errno == EINTR) continue;
        if (n > 0) {
            send_frame(T_DATA, s->rid, data, (size_t)n);
            continue;
        }
        int err = n < 0 ? errno : 0;
        sends = s->next;
        close(s->fd);
        if (err) {
            reply_oserror(s->rid, err, NULL);
        } else {
            send_frame(T_EOF, s->rid, "", 0);
            reply_ok(s->rid);
        }
        free(s);
    }
}

static void step(void) {
    struct pollfd fds[3 + 3 * 256];
    nfds_t nf = 0;
    int port_idx = -1;
    /* an upload's tar goes to the helper's stdin: stop reading the port while it is
     * behind, so the host waits instead of the guest buffering the whole tar in RAM */
    int backlog = 0;
    for (Exec *e = execs; e; e = e->next)
        backlog |= e->kind == K_TOOL_IN && buf_size(&e->stdin_buf) > (4u << 20);
    if (connected) {
        port_idx = (int)nf;
        fds[nf].fd = port;
        fds[nf].events = (backlog ? 0 : POLLIN) | (buf_size(&out) ? POLLOUT : 0);
        nf++;
    }
    double deadline = 0;
    int throttle = connected && buf_size(&out) >= CHUNK * 4;
    for (Exec *e = execs; e; e = e->next) {
        e->pidx_in = e->pidx_out = e->pidx_err = -1;
        if (nf + 3 > sizeof fds / sizeof fds[0]) continue;
        if (e->out_fd >= 0 && !(e->kind == K_TOOL_OUT && throttle)) {
            e->pidx_out = (int)nf;
            fds[nf].fd = e->out_fd;
            fds[nf++].events = POLLIN;
        }
        if (e->err_fd >= 0) {
            e->pidx_err = (int)nf;
            fds[nf].fd = e->err_fd;
            fds[nf++].events = POLLIN;
        }
        if (e->in_fd >= 0 && buf_size(&e->stdin_buf)) {
            e->pidx_in = (int)nf;
            fds[nf].fd = e->in_fd;
            fds[nf++].events = POLLOUT;
        }
        if (e->deadline && !e->timed_out && (!deadline || e->deadline < deadline))
            deadline = e->deadline;
    }
    double timeout = -1;
    if (deadline) {
        timeout = deadline - mono();
        if (timeout < 0) timeout = 0;
    }
    if (!connected) /* host absent: a read returns EOF at once, so wait for SIGIO (or poll slowly) */
        timeout = timeout < 0 ? 0.5 : (timeout < 0.5 ? timeout : 0.5);
    if (sends && buf_size(&out) < CHUNK * 4) timeout = 0;
    /* the spare cgroup is made once the host has been quiet for a while (not while it
     * waits for something) */
    int idle_spare = cgroups_ok && !spare_cg[0] && !spare_failed && !execs && !sends &&
                     (timeout < 0 || timeout > 0.05);
    if (idle_spare) timeout = 0.05;
    struct timespec ts, *tsp = NULL;
    if (timeout >= 0) {
        ts.tv_sec = (time_t)timeout;
        ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
        tsp = &ts;
    }
    sigset_t none;
    sigemptyset(&none);
    int r = ppoll(fds, nf, tsp, &none); /* SIGCHLD / SIGIO interrupt it */
    if (r < 0) {
        for (nfds_t k = 0; k < nf; k++) fds[k].revents = 0;
    }
    if (r == 0 && idle_spare) make_spare();
    got_signal = 0;
    reap();
    if ((port_idx >= 0 && (fds[port_idx].revents & POLLOUT)) || buf_size(&out)) flush_out();
    if ((port_idx >= 0 && (fds[port_idx].revents & ~POLLOUT) && !backlog) || !connected)
        read_port();
    Exec *next;
    for (Exec *e = execs; e; e = next) {
        next = e->next;
        if (e->pidx_out >= 0 && fds[e->pidx_out].revents && on_output(e, e->out_fd, T_OUT) == 0)
            close_fd(&e->out_fd);
        if (e->pidx_err >= 0 && fds[e->pidx_err].revents && on_output(e, e->err_fd, T_ERR) == 0)
            close_fd(&e->err_fd);
        if (e->pidx_in >= 0 && fds[e->pidx_in].revents) flush_stdin(e);
        check_exec(e); /* may free e */
    }
    pump_sends();
}

/* `rbx-agent` in the guest; `rbx-agent --fd N` serves an inherited fd instead of the
 * virtio port and leaves cgroups alone (tests on the host). */
int main(int argc, char **argv) {
    /* fds 0-2 must be taken, or pipes would land there and dup2 would clobber them */
    int fd;
    while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd < 3) {
    }
    if (fd >= 3) close(fd);
    if (!getenv("PATH")) setenv("PATH", DEFPATH, 1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGIO, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
    /* SIGCHLD/SIGIO are only let in while waiting in ppoll: no EINTR anywhere else */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGIO);
    sigprocmask(SIG_BLOCK, &block, NULL);
    if (argc == 3 && strcmp(argv[1], "--fd") == 0) {
        test_mode = 1;
        prctl(PR_SET_CHILD_SUBREAPER, 1); /* orphans come to us, as to PID 1 in the guest */
        port = atoi(argv[2]);
        connected = 1; /* a socket: no SIGIO on connect, the peer is there from the start */
        fcntl(port, F_SETFD, FD_CLOEXEC);
        set_nonblock(port, 1);
    } else {
        setup_cgroups();
        open_port();
    }
    while (1) step(); /* PID 1 never returns */
}
