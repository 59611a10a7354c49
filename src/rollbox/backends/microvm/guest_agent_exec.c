/* rbx-agent, exec unit: users, spawning (clone3 vfork into a per-exec cgroup), running
 * commands and tar tools, private (verifier) execs, timeouts and reaping, the exec and kill
 * requests. See guest_agent.h. */

#include "guest_agent.h"

/* Field `idx` (0-based, ':' separated) of line into out; 0 if missing. */
static int field(const char *line, int idx, char *out, size_t outsz) {
    const char *p = line;
    for (int k = 0; k < idx; k++) {
        p = strchr(p, ':');
        if (!p) return 0;
        p++;
    }
    size_t n = strcspn(p, ":\n");
    if (n >= outsz) n = outsz - 1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 1;
}

static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return 0;
    return 1;
}

/* getpwnam / getpwuid from the guest's /etc/passwd. */
static int find_passwd(const char *name, int by_uid, unsigned long uid, User *u) {
    FILE *f = fopen("/etc/passwd", "re");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char nm[256], su[32], sg[32];
        if (!field(line, 0, nm, sizeof nm) || !field(line, 2, su, sizeof su) ||
            !field(line, 3, sg, sizeof sg) || !all_digits(su) || !all_digits(sg))
            continue;
        if (by_uid ? strtoul(su, NULL, 10) != uid : strcmp(nm, name) != 0) continue;
        snprintf(u->name, sizeof u->name, "%s", nm);
        u->uid = (uid_t)strtoul(su, NULL, 10);
        u->gid = (gid_t)strtoul(sg, NULL, 10);
        if (!field(line, 5, u->home, sizeof u->home)) u->home[0] = '\0';
        found = 1;
        break;
    }
    fclose(f);
    return found;
}

/* getgrnam(name).gr_gid, or (user) the supplementary groups listing `user`. */
static int scan_groups(const char *gname, gid_t *gid, User *u) {
    FILE *f = fopen("/etc/group", "re");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char nm[256], sg[32], members[4096];
        if (!field(line, 0, nm, sizeof nm) || !field(line, 2, sg, sizeof sg) || !all_digits(sg))
            continue;
        if (gname) {
            if (strcmp(nm, gname) == 0) {
                *gid = (gid_t)strtoul(sg, NULL, 10);
                found = 1;
                break;
            }
            continue;
        }
        if (!field(line, 3, members, sizeof members)) continue;
        gid_t g = (gid_t)strtoul(sg, NULL, 10);
        for (char *tok = strtok(members, ","); tok; tok = strtok(NULL, ",")) {
            if (strcmp(tok, u->name) != 0) continue;
            int dup = 0;
            for (size_t k = 0; k < u->ngroups; k++) dup |= u->groups[k] == g;
            if (!dup && u->ngroups < sizeof u->groups / sizeof u->groups[0])
                u->groups[u->ngroups++] = g;
        }
    }
    fclose(f);
    return found;
}

/* guest_agent.resolve_user: root / uid[:gid] / name[:group]; 0, or -1 with msg set. */
static int resolve_user(const char *spec, User *u, char *msg, size_t msgsz) {
    char name[256], group[256] = "";
    snprintf(name, sizeof name, "%s", spec && *spec ? spec : "root");
    char *colon = strchr(name, ':');
    if (colon) {
        *colon = '\0';
        snprintf(group, sizeof group, "%s", colon + 1);
    }
    memset(u, 0, sizeof *u);
    int numeric = all_digits(name);
    if (find_passwd(name, numeric, numeric ? strtoul(name, NULL, 10) : 0, u)) {
        u->groups[0] = u->gid; /* os.getgrouplist: the primary group first */
        u->ngroups = 1;
        scan_groups(NULL, NULL, u);
    } else if (strcmp(name, "root") == 0) {
        /* a minimal rootfs may have no /etc/passwd: root is root (as on the other backends) */
        snprintf(u->home, sizeof u->home, "/root");
    } else {
        if (!numeric) {
            snprintf(msg, msgsz, "no user '%s' inside the sandbox", name);
            return -1;
        }
        u->uid = (uid_t)strtoul(name, NULL, 10);
        u->gid = (gid_t)u->uid;
        snprintf(u->home, sizeof u->home, "/");
        u->ngroups = 0;
    }
    if (group[0]) {
        gid_t g;
        if (all_digits(group)) g = (gid_t)strtoul(group, NULL, 10);
        else if (!scan_groups(group, &g, u)) {
            snprintf(msg, msgsz, "no group '%s' inside the sandbox", group);
            return -1;
        }
        u->gid = g;
        u->groups[0] = g;
        u->ngroups = 1;
    }
    if (u->ngroups == 0) {
        u->groups[0] = u->gid;
        u->ngroups = 1;
    }
    return 0;
}
int full_command_caps; /* configure "full_command_caps": trusted nested workloads */

static char child_stack[64 * 1024] __attribute__((aligned(16)));

static void child_fail(Spawn *s, int stage, int err) {
    s->stage = stage;
    s->err = err;
    _exit(err == ENOENT && stage != ST_RLIMIT && stage != ST_SETID ? 127 : 126);
}

/* Keep only `keep` (a CAPBIT mask) in every set, the bounding set included (so an exec of
 * a setuid-root file cannot get the rest back). Without CAP_SETPCAP (the --fd test mode as
 * a user) the bounding set stays; effective/permitted/inheritable are only ever narrowed. */
static int limit_caps(uint64_t keep) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) < 0) return -1;
    uint64_t have = (uint64_t)d[0].permitted | ((uint64_t)d[1].permitted << 32);
    if (have & CAPBIT(CAP_SETPCAP)) {
        for (int c = 0; c < 64; c++) {
            if (keep & CAPBIT(c)) continue;
            int r = (int)syscall(SYS_prctl, PR_CAPBSET_READ, c, 0, 0, 0);
            if (r < 0) break; /* past the kernel's last capability */
            if (r == 1 && syscall(SYS_prctl, PR_CAPBSET_DROP, c, 0, 0, 0) < 0) return -1;
        }
    }
    syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    for (int k = 0; k < 2; k++) {
        uint32_t m = (uint32_t)(keep >> (32 * k));
        d[k].effective &= m;
        d[k].permitted &= m;
        d[k].inheritable &= m;
    }
    return syscall(SYS_capset, &h, d) < 0 ? -1 : 0;
}

/* Runs on child_stack in the parent's memory while the parent is suspended (vfork):
 * only syscalls here, no allocation, no stdio. */
static int child_main(void *arg) {
    Spawn *s = arg;
    if (setsid() < 0) child_fail(s, ST_SETSID, errno);
    if (s->cg_fd >= 0 && write(s->cg_fd, "0", 1) != 1) child_fail(s, ST_CGROUP, errno);
    if (dup2(s->in_fd, 0) < 0 || dup2(s->out_fd, 1) < 0 || dup2(s->err_fd, 2) < 0)
        child_fail(s, ST_SETSID, errno);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    int sigs[] = {SIGPIPE, SIGCHLD, SIGIO, SIGTERM};
    for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++) sigaction(sigs[k], &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (s->nofile > 0) {
        struct rlimit rl = {(rlim_t)s->nofile, (rlim_t)s->nofile};
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) child_fail(s, ST_RLIMIT, errno);
    }
    if (s->caps != CAPS_ALL &&
        limit_caps(WORKLOAD_CAPS | (s->caps == CAPS_VERIFIER ? CAPBIT(CAP_WAKE_ALARM) : 0)) < 0)
        child_fail(s, ST_CAPS, errno);
    if (s->setids) {
        if (syscall(SYS_setgroups, s->ngroups, s->groups) < 0) child_fail(s, ST_SETID, errno);
        if (syscall(SYS_setgid, s->gid) < 0) child_fail(s, ST_SETID, errno);
        if (syscall(SYS_setuid, s->uid) < 0) child_fail(s, ST_SETID, errno);
    }
    if (chdir(s->cwd) < 0) {
        s->failpath[0] = '\0';
        child_fail(s, ST_CHDIR, errno);
    }
    const char *file = s->argv[0];
    /* s->failpath: the path being tried (on success the parent learns what ran) */
    if (strchr(file, '/')) {
        size_t n = strlen(file);
        if (n > PATH_MAX) n = PATH_MAX;
        memcpy(s->failpath, file, n);
        s->failpath[n] = '\0';
        execve(file, s->argv, s->envp);
        child_fail(s, ST_EXEC, errno);
    }
    /* os._execvpe: the first error that is not ENOENT/ENOTDIR wins, else the last one */
    int saved = 0, last = ENOENT;
    char full[PATH_MAX + 1], saved_path[PATH_MAX + 1];
    saved_path[0] = full[0] = '\0';
    const char *p = s->path;
    size_t flen = strlen(file);
    while (1) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n + 1 + flen <= PATH_MAX) {
            size_t k = 0;
            if (n) {
                memcpy(full, p, n);
                k = n;
                if (full[k - 1] != '/') full[k++] = '/';
            }
            memcpy(full + k, file, flen + 1);
            memcpy(s->failpath, full, k + flen + 1);
            execve(full, s->argv, s->envp);
            last = errno;
            if (last != ENOENT && last != ENOTDIR && !saved) {
                saved = last;
                memcpy(saved_path, full, strlen(full) + 1);
            }
        }
        if (!e) break;
        p = e + 1;
    }
    const char *fp = saved ? saved_path : full;
    memcpy(s->failpath, fp, strlen(fp) + 1);
    child_fail(s, ST_EXEC, saved ? saved : last);
    return 127;
}

/* clone3(CLONE_VM|CLONE_VFORK|CLONE_INTO_CGROUP): the child starts in its cgroup, which
 * measured ~2 ms cheaper per exec under TCG than writing cgroup.procs from the child (a
 * migration). The child runs on child_stack and finds its Spawn in spawn_arg. */
static Spawn *spawn_arg;

__attribute__((noreturn, used, noinline)) void rbx_clone3_child(void) {
    child_main(spawn_arg);
    _exit(127);
}

static long clone3_vfork(struct clone_args *ca) {
    long ret;
#if defined(__x86_64__)
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xor %%ebp, %%ebp\n\t" /* the child: fresh stack, never returns */
                     "and $-16, %%rsp\n\t"
                     "call rbx_clone3_child\n\t"
                     "hlt\n"
                     "1:"
                     : "=a"(ret)
                     : "a"((long)SYS_clone3), "D"(ca), "S"(sizeof *ca)
                     : "rcx", "r11", "memory");
#else
    (void)ca;
    ret = -ENOSYS;
#endif
    return ret;
}

/* Start a child; its pid, or -1 with errno. Failures after the clone are in s->stage.
 * cg_dir (an O_PATH fd of the child's cgroup, or -1) is used by clone3; when clone3 is
 * unavailable the child writes s->cg_fd (cgroup.procs) itself. */
static pid_t spawn(Spawn *s, int cg_dir) {
    static int no_clone3;
    sigset_t all, old;
    sigfillset(&all);
    /* no handler may run in the child while it borrows our memory */
    sigprocmask(SIG_SETMASK, &all, &old);
    s->stage = ST_OK;
    s->err = 0;
    pid_t pid = -1;
    int e = 0;
    if (cg_dir >= 0 && !no_clone3) {
        struct clone_args ca;
        memset(&ca, 0, sizeof ca);
        ca.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP;
        ca.exit_signal = SIGCHLD;
        ca.stack = (uint64_t)(uintptr_t)child_stack;
        ca.stack_size = sizeof child_stack;
        ca.cgroup = (uint64_t)cg_dir;
        int cg_fd = s->cg_fd;
        s->cg_fd = -1; /* already in the cgroup */
        spawn_arg = s;
        long r = clone3_vfork(&ca);
        s->cg_fd = cg_fd;
        if (r >= 0) pid = (pid_t)r;
        else if (r == -ENOSYS || r == -E2BIG || r == -EINVAL) no_clone3 = 1;
    }
    if (pid < 0) {
        pid = clone(child_main, child_stack + sizeof child_stack,
                    CLONE_VM | CLONE_VFORK | SIGCHLD, s);
        e = errno;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return pid;
}

/* The "rollbox: cannot run ..." message of a child that failed before exec. */
static void start_error_msg(const Spawn *s, const char *cg, Buf *b) {
    buf_printf(b, "rollbox: cannot run '%s': ", s->argv[0]);
    switch (s->stage) {
    case ST_CHDIR: oserr_msg(b, s->err, s->cwd); break;
    case ST_EXEC: oserr_msg(b, s->err, s->failpath); break;
    case ST_CGROUP: {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/cgroup.procs", cg);
        oserr_msg(b, s->err, p);
        break;
    }
    case ST_CAPS:
        buf_adds(b, "dropping capabilities: ");
        oserr_msg(b, s->err, NULL);
        break;
    case ST_RLIMIT:
        if (s->err == EPERM) buf_adds(b, "not allowed to raise maximum limit");
        else oserr_msg(b, s->err, NULL);
        break;
    default: oserr_msg(b, s->err, NULL); break;
    }
}

Exec *find_exec(int64_t rid) {
    for (Exec *e = execs; e; e = e->next)
        if (e->rid == rid) return e;
    return NULL;
}

void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Kill the whole tree: everything in the command's cgroup (setsid daemons too). */
void exec_kill(Exec *e) {
    if (e->reaped && e->kind != K_EXEC) return;
    if (e->cg[0]) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/cgroup.kill", e->cg);
        if (write_text(p, "1") == 0) return;
    }
    if (e->pid > 0) {
        if (e->kind == K_EXEC) kill(-e->pid, SIGKILL);
        else if (!e->reaped) kill(e->pid, SIGKILL);
    }
}

/* 1 when the "KEY N" line of FILE in the exec's cgroup has N > 0. */
static int exec_cg_event(const Exec *e, const char *file, const char *key) {
    if (!e->cg[0]) return 0;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", e->cg, file);
    FILE *f = fopen(p, "re");
    if (!f) return 0;
    char line[128];
    size_t klen = strlen(key);
    int hit = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ' ' && atoll(line + klen + 1) > 0)
            hit = 1;
    }
    fclose(f);
    return hit;
}

static int exec_oom_killed(const Exec *e) { return exec_cg_event(e, "memory.events", "oom_kill"); }

/* pids.events "max" of the exec's cgroup: forks that failed at the pids limit (the guest
 * kernel counts them in the forking task's cgroup). */
static int exec_pids_max_hit(const Exec *e) { return exec_cg_event(e, "pids.events", "max"); }

/* Free and total bytes of the root (the overlay: its upper disk is the disk limit). */
static void root_space(int64_t *free_b, int64_t *total_b) {
    struct statvfs st;
    *free_b = *total_b = -1;
    if (statvfs("/", &st) == 0) {
        *free_b = (int64_t)st.f_bavail * (int64_t)st.f_frsize; /* ext4 keeps a reserve */
        *total_b = (int64_t)st.f_blocks * (int64_t)st.f_frsize;
    }
}

static void exec_free(Exec *e) {
    Exec **pp = &execs;
    while (*pp && *pp != e) pp = &(*pp)->next;
    if (*pp) *pp = e->next;
    close_fd(&e->in_fd);
    close_fd(&e->out_fd);
    close_fd(&e->err_fd);
    close_fd(&e->collect_fd);
    buf_free(&e->stdin_buf);
    buf_free(&e->errbuf);
    free(e->start_error);
    free(e);
}

void flush_stdin(Exec *e) {
    if (e->in_fd < 0) return;
    while (buf_size(&e->stdin_buf)) {
        size_t n = buf_size(&e->stdin_buf);
        ssize_t w = write(e->in_fd, buf_data(&e->stdin_buf), n > CHUNK ? CHUNK : n);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            buf_consume(&e->stdin_buf, buf_size(&e->stdin_buf)); /* reader gone */
            break;
        }
        buf_consume(&e->stdin_buf, (size_t)w);
    }
    if (e->stdin_eof && !buf_size(&e->stdin_buf)) close_fd(&e->in_fd);
}

void feed_stdin(Exec *e, const void *data, size_t len, int eof) {
    if (e->in_fd < 0) return;
    if (eof) e->stdin_eof = 1;
    else buf_add(&e->stdin_buf, data, len);
    flush_stdin(e);
}

/* Read what is there from a command's stdout/stderr; 0 at EOF (or error), 1 otherwise,
 * 2 when nothing was available. */
int on_output(Exec *e, int fd, int kind) {
    static char data[CHUNK];
    ssize_t n = read(fd, data, CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 2;
    if (n <= 0) return 0;
    if (e->kind != K_EXEC) {
        if (kind == T_ERR) {
            if (buf_size(&e->errbuf) < 256 * 1024) buf_add(&e->errbuf, data, (size_t)n);
        } else {
            send_frame(T_DATA, e->rid, data, (size_t)n);
        }
        return 1;
    }
    int64_t *sent = kind == T_OUT ? &e->sent_out : &e->sent_err;
    int64_t room = e->cap - *sent;
    if (room <= 0) {
        e->truncated = 1;
        return 1;
    }
    if (n > room) {
        n = (ssize_t)room;
        e->truncated = 1;
    }
    *sent += n;
    send_frame(kind, e->rid, data, (size_t)n);
    return 1;
}

/* Start a command or tool. On success the Exec is linked into `execs`. */
Exec *exec_start(int64_t rid, int kind, char *const *argv, char *const *envp,
                        const char *path, const char *cwd, const User *u, int64_t nofile,
                        int64_t cap, double timeout, int want_cgroup, int caps) {
    Exec *e = calloc(1, sizeof *e);
    if (!e) abort();
    e->rid = rid;
    e->kind = kind;
    e->cap = cap;
    e->in_fd = e->out_fd = e->err_fd = e->collect_fd = -1;
    e->deadline = timeout > 0 ? mono() + timeout : 0;
    int cg_fd = -1, cg_dir = -1;
    /* the spare cgroup if there is one (a second try makes a fresh one: the workload
     * may have removed the spare) */
    for (int attempt = 0; want_cgroup && cgroups_ok && attempt < 2 && cg_fd < 0; attempt++) {
        int fresh = !spare_cg[0];
        if (fresh)
            snprintf(e->cg, sizeof e->cg, "%s/e%lld-%d-%lld", WORKLOAD, (long long)rid,
                     getpid(), (long long)mono_ns());
        else
            memcpy(e->cg, spare_cg, sizeof e->cg);
        spare_cg[0] = '\0';
        if ((fresh && mkdir(e->cg, 0755) < 0) ||
            (cg_dir = open(e->cg, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0 ||
            (cg_fd = openat(cg_dir, "cgroup.procs", O_WRONLY | O_CLOEXEC)) < 0) {
            if (cg_dir >= 0) close(cg_dir);
            cg_dir = -1;
            rmdir(e->cg);
            e->cg[0] = '\0';
            if (fresh) break;
        }
    }
    int in[2], o[2], er[2];
    if (pipe2(in, O_CLOEXEC) < 0) goto fail0;
    if (pipe2(o, O_CLOEXEC) < 0) goto fail1;
    if (pipe2(er, O_CLOEXEC) < 0) goto fail2;
    Spawn s;
    memset(&s, 0, sizeof s);
    s.argv = argv;
    s.envp = envp;
    s.path = path;
    s.cwd = cwd && *cwd ? cwd : "/";
    s.in_fd = in[0];
    s.out_fd = o[1];
    s.err_fd = er[1];
    s.cg_fd = cg_fd;
    s.nofile = nofile;
    s.caps = caps;
    if (u && (u->uid || u->gid)) {
        s.setids = 1;
        s.uid = u->uid;
        s.gid = u->gid;
        s.groups = u->groups;
        s.ngroups = u->ngroups;
    }
    pid_t pid = spawn(&s, cg_dir);
    if (pid < 0) {
        int err = errno;
        close(er[0]);
        close(er[1]);
        errno = err;
        goto fail2;
    }
    e->pid = pid;
    close(in[0]);
    close(o[1]);
    close(er[1]);
    if (cg_fd >= 0) close(cg_fd);
    if (cg_dir >= 0) close(cg_dir);
    e->in_fd = in[1];
    e->out_fd = o[0];
    e->err_fd = er[0];
    set_nonblock(e->in_fd, 1);
    set_nonblock(e->out_fd, 1);
    set_nonblock(e->err_fd, 1);
    if (s.stage == ST_OK && kind == K_EXEC) warm_note(s.failpath);
    if (s.stage != ST_OK) {
        Buf m = {0};
        buf_printf(&m, "%d ", s.err == ENOENT && s.stage != ST_RLIMIT && s.stage != ST_SETID
                                  ? 127 : 126);
        start_error_msg(&s, e->cg, &m);
        buf_addc(&m, '\0');
        e->start_error = m.p;
    }
    e->next = execs;
    execs = e;
    return e;
fail2:
    close(o[0]);
    close(o[1]);
fail1:
    close(in[0]);
    close(in[1]);
fail0:
    if (cg_fd >= 0) close(cg_fd);
    if (cg_dir >= 0) close(cg_dir);
    if (e->cg[0]) rmdir(e->cg);
    free(e);
    return NULL;
}

/* One per-exec cgroup made ahead of time, off the exec's critical path (creating a memory
 * cgroup is the costliest step of a spawn, and cold right after a restore). */
int spare_failed; /* no idle retries until the next exec ends */

void make_spare(void) {
    if (!cgroups_ok || spare_cg[0]) return;
    char p[sizeof spare_cg];
    snprintf(p, sizeof p, "%s/e-%lld", WORKLOAD, (long long)mono_ns());
    if (mkdir(p, 0755) == 0) memcpy(spare_cg, p, sizeof p);
    else spare_failed = 1;
}

static void sweep_cgroups(void) {
    if (!cgroups_ok) return;
    DIR *d = opendir(WORKLOAD);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] != 'e' || de->d_type != DT_DIR) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", WORKLOAD, de->d_name);
        int live = strcmp(spare_cg, p) == 0;
        for (Exec *e = execs; e; e = e->next) live |= strcmp(e->cg, p) == 0;
        if (!live) rmdir(p);
    }
    closedir(d);
}

static int others_alive(void) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int alive = 0;
    struct dirent *de;
    while (!alive && (de = readdir(d))) {
        char *endp;
        long pid = strtol(de->d_name, &endp, 10);
        if (*endp || pid <= 2) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        char *rp = strrchr(buf, ')');
        if (!rp || rp[1] != ' ') continue;
        long ppid = strtol(rp + 4, NULL, 10);
        if (ppid == 2) continue; /* a kernel thread */
        if (rp[2] != 'Z' && rp[2] != 'X') alive = 1;
    }
    closedir(d);
    return alive;
}

/* SIGKILL every process but PID 1 (and kernel threads), again while forks race it. */
static void kill_others(void) {
    for (int round = 0; round < 1000; round++) {
        kill(-1, SIGKILL);
        if (!others_alive()) return;
        usleep(5000);
    }
}

static int mkdirs_plain(const char *path) {
    char b[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof b) { errno = ENAMETOOLONG; return -1; }
    memcpy(b, path, n + 1);
    for (char *q = b + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(b, 0755) < 0 && errno != EEXIST) return -1;
        *q = '/';
    }
    return mkdir(b, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static size_t b64_decode(const char *src, unsigned char *dst) {
    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (const char *q = src; *q; q++) {
        int v = b64val((unsigned char)*q);
        if (v < 0) continue;
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            dst[n++] = (unsigned char)(acc >> bits);
        }
    }
    return n;
}

/* Sets up the namespace; the saved ns and root fds (opened first) let private_leave go back. */
static int private_enter(const JVal *priv, int *saved_root, int *saved_ns, int *collect_fd) {
    *saved_root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    *saved_ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (*saved_root < 0 || *saved_ns < 0) return -1;
    if (unshare(CLONE_NEWNS) < 0) return -1;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -1;
    const JVal *fresh = jget(priv, "fresh");
    for (size_t k = 0; fresh && fresh->t == J_ARR && k < fresh->n; k++) {
        const JVal *d = fresh->items[k];
        if (d->t != J_STR || d->s[0] != '/') { errno = EINVAL; return -1; }
        if (mkdirs_plain(d->s) < 0) return -1;
        if (mount("tmpfs", d->s, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=256m") < 0)
            return -1;
    }
    const JVal *files = jget(priv, "files");
    for (size_t k = 0; files && files->t == J_ARR && k < files->n; k++) {
        const JVal *f = files->items[k];
        if (f->t != J_ARR || f->n != 3 || f->items[0]->t != J_STR || f->items[1]->t != J_NUM ||
            f->items[2]->t != J_STR) {
            errno = EINVAL;
            return -1;
        }
        const char *path = f->items[0]->s;
        if (path[0] != '/' || strstr(path, "/../") || strstr(path, "/./")) {
            errno = EINVAL;
            return -1;
        }
        char parent[PATH_MAX];
        const char *slash = strrchr(path, '/');
        if ((size_t)(slash - path) >= sizeof parent) { errno = ENAMETOOLONG; return -1; }
        memcpy(parent, path, (size_t)(slash - path));
        parent[slash - path] = 0;
        if (parent[0] && mkdirs_plain(parent) < 0) return -1;
        int mode = (int)(f->items[1]->is_int ? f->items[1]->i : (int64_t)f->items[1]->d) & 07777;
        unsigned char *data = malloc(f->items[2]->slen * 3 / 4 + 4);
        if (!data) abort();
        size_t n = b64_decode(f->items[2]->s, data);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
        int bad = fd < 0;
        for (size_t off = 0; !bad && off < n;) {
            ssize_t w = write(fd, data + off, n - off);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) bad = 1;
            else off += (size_t)w;
        }
        if (!bad && fchmod(fd, (mode_t)mode) < 0) bad = 1;
        int err = errno;
        if (fd >= 0) close(fd);
        free(data);
        if (bad) { errno = err; return -1; }
    }
    const char *collect = jstr(priv, "collect");
    if (collect && *collect) {
        *collect_fd = open(collect, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (*collect_fd < 0) return -1;
    }
    return 0;
}

static void private_leave(int saved_root, int saved_ns) {
    if (saved_ns >= 0 && setns(saved_ns, CLONE_NEWNS) == 0 && saved_root >= 0) {
        if (fchdir(saved_root) == 0 && chroot(".") == 0) (void)!chdir("/");
    }
    if (saved_root >= 0) close(saved_root);
    if (saved_ns >= 0) close(saved_ns);
}

static void collect_at(int64_t rid, int dirfd, const char *rel, size_t *budget, int depth) {
    if (depth > 32) return;
    int dfd = dup(dirfd);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) { close(dfd); return; }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char name[PATH_MAX];
        if (snprintf(name, sizeof name, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >=
            (int)sizeof name)
            continue;
        struct stat st;
        if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                collect_at(rid, sub, name, budget, depth + 1);
                close(sub);
            }
            continue;
        }
        if (!S_ISREG(st.st_mode)) continue;
        int fd = openat(dirfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        size_t nl = strlen(name) + 1;
        size_t want = (size_t)st.st_size;
        if (want > *budget) want = *budget;
        if (want > COLLECT_FILE_MAX - nl - 8) want = COLLECT_FILE_MAX - nl - 8;
        char *msg = malloc(8 + nl + want);
        if (msg) {
            uint32_t mode = st.st_mode & 07777, full = (uint32_t)st.st_size;
            memcpy(msg, &mode, 4);
            memcpy(msg + 4, &full, 4);
            memcpy(msg + 8, name, nl);
            size_t got = 0;
            while (got < want) {
                ssize_t r = read(fd, msg + 8 + nl + got, want - got);
                if (r <= 0) break;
                got += (size_t)r;
            }
            *budget -= got;
            send_frame(T_DATA, rid, msg, 8 + nl + got);
            free(msg);
        }
        close(fd);
    }
    closedir(d);
}

/* The command is gone: flush what is left, reply, free. Tools wait for their EOFs. */
void check_exec(Exec *e) {
    if (e->kind != K_EXEC) {
        if (e->reaped && e->out_fd < 0 && e->err_fd < 0) {
            finish_tool(e);
            exec_free(e);
        }
        return;
    }
    if (e->deadline && !e->reaped && mono() >= e->deadline && !e->timed_out) {
        e->timed_out = 1;
        exec_kill(e);
    }
    if (!e->reaped) return;
    /* take what is left in the pipes, do not wait for daemons (nor read a chatty one's
     * output forever: a pipe holds 64 KiB, so 64 reads are plenty) */
    for (int n = 0; e->out_fd >= 0; n++) {
        int r = on_output(e, e->out_fd, T_OUT);
        if (r == 0 || r == 2 || n >= 64) close_fd(&e->out_fd);
    }
    for (int n = 0; e->err_fd >= 0; n++) {
        int r = on_output(e, e->err_fd, T_ERR);
        if (r == 0 || r == 2 || n >= 64) close_fd(&e->err_fd);
    }
    close_fd(&e->in_fd);
    if (e->timed_out) exec_kill(e);
    int code;
    if (WIFEXITED(e->status)) code = WEXITSTATUS(e->status);
    else if (WIFSIGNALED(e->status)) code = 128 + WTERMSIG(e->status);
    else code = 128;
    if (e->start_error) {
        char *msg = strchr(e->start_error, ' ');
        code = atoi(e->start_error);
        Buf m = {0};
        buf_printf(&m, "%s\n", msg ? msg + 1 : "");
        send_frame(T_ERR, e->rid, m.p, m.len);
        buf_free(&m);
    }
    if (e->collect_fd >= 0) {
        size_t budget = COLLECT_MAX;
        collect_at(e->rid, e->collect_fd, "", &budget, 0);
        close_fd(&e->collect_fd);
    }
    JOut o;
    jo_begin(&o, e->rid);
    jo_int(&o, "exit_code", code);
    jo_bool(&o, "timed_out", e->timed_out);
    jo_bool(&o, "oom_killed", exec_oom_killed(e));
    jo_bool(&o, "pids_exhausted", exec_pids_max_hit(e));
    int64_t disk_free, disk_total;
    root_space(&disk_free, &disk_total);
    jo_int(&o, "disk_free", disk_free);
    jo_int(&o, "disk_total", disk_total);
    jo_bool(&o, "truncated", e->truncated);
    jo_send(&o);
    if (connected) flush_out(); /* the reply first; the cgroup housekeeping can wait */
    char cg[sizeof e->cg];
    memcpy(cg, e->cg, sizeof cg);
    exec_free(e);
    if (cg[0]) rmdir(cg); /* fails while daemons are still in it: the next sweep gets it */
    sweep_cgroups();
    spare_failed = 0;
}

void reap(void) {
    while (1) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return;
        for (Exec *e = execs; e; e = e->next) {
            if (e->pid == pid && !e->reaped) {
                e->reaped = 1;
                e->status = status;
                break;
            }
        }
        /* anything else is an orphan reparented to PID 1: just reaped */
    }
}

/* "K=V" strings of the request's env (plus HOME), NULL-terminated; *path = its PATH. */
static char **make_env(const JVal *env, const char *home, const char **path) {
    size_t n = env && env->t == J_OBJ ? env->n : 0;
    char **envp = calloc(n + 2, sizeof *envp);
    if (!envp) abort();
    size_t k = 0;
    int has_home = 0;
    *path = "/bin:/usr/bin"; /* Python's os.defpath */
    for (size_t j = 0; j < n; j++) {
        const char *key = env->keys[j];
        const JVal *v = env->items[j];
        if (v->t != J_STR) continue;
        /* Python's dict keeps the last duplicate key */
        int dup = 0;
        for (size_t m = j + 1; m < n; m++) dup |= strcmp(env->keys[m], key) == 0;
        if (dup) continue;
        size_t len = strlen(key) + 1 + strlen(v->s) + 1;
        envp[k] = malloc(len);
        if (!envp[k]) abort();
        snprintf(envp[k], len, "%s=%s", key, v->s);
        if (strcmp(key, "PATH") == 0) *path = strchr(envp[k], '=') + 1;
        has_home |= strcmp(key, "HOME") == 0;
        k++;
    }
    if (!has_home) {
        size_t len = strlen(home) + 6;
        envp[k] = malloc(len);
        if (!envp[k]) abort();
        snprintf(envp[k], len, "HOME=%s", home);
        k++;
    }
    envp[k] = NULL;
    return envp;
}

static void free_strv(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) free(*p);
    free(v);
}

void op_exec(int64_t rid, const JVal *req) {
    const JVal *argv_v = jget(req, "argv");
    if (!argv_v || argv_v->t != J_ARR || argv_v->n == 0) {
        reply_error(rid, "agent", "exec needs a non-empty argv list");
        return;
    }
    for (size_t k = 0; k < argv_v->n; k++) {
        const JVal *a = argv_v->items[k];
        if (a->t != J_STR || strlen(a->s) != a->slen) {
            reply_error(rid, "agent", "exec argv items must be strings without NUL bytes");
            return;
        }
    }
    const char *user = jstr(req, "user");
    User u;
    char msg[600];
    if (resolve_user(user && *user ? user : "root", &u, msg, sizeof msg) < 0) {
        reply_error(rid, "user", msg);
        return;
    }
    if (find_exec(rid)) {
        reply_error(rid, "agent", "a request with this id is already running");
        return;
    }
    char **argv = calloc(argv_v->n + 1, sizeof *argv);
    if (!argv) abort();
    for (size_t k = 0; k < argv_v->n; k++) argv[k] = argv_v->items[k]->s;
    const char *path;
    char **envp = make_env(jget(req, "env"), u.home, &path);
    int64_t cap = 1 << 20, nofile = 0;
    jint(req, "output_bytes", &cap);
    if (jtruthy(jget(req, "nofile"))) jint(req, "nofile", &nofile);
    double timeout = 0;
    const JVal *t = jget(req, "timeout");
    if (jtruthy(t) && t->t == J_NUM) timeout = t->d;
    const char *cwd = jstr(req, "cwd");
    const JVal *priv = jget(req, "private");
    int saved_root = -1, saved_ns = -1, collect_fd = -1;
    if (priv && test_mode) {
        /* on the host, kill(-1) and mounts would act on the host itself */
        reply_error(rid, "agent", "private execs are refused in --fd test mode");
        free(argv);
        free_strv(envp);
        return;
    }
    if (priv && priv->t == J_OBJ) {
        if (jtruthy(jget(priv, "kill_others"))) kill_others();
        const JVal *fresh = jget(priv, "fresh");
        if (fresh && fresh->t == J_ARR && fresh->n &&
            private_enter(priv, &saved_root, &saved_ns, &collect_fd) < 0) {
            int err = errno;
            private_leave(saved_root, saved_ns);
            if (collect_fd >= 0) close(collect_fd);
            Buf m = {0};
            buf_printf(&m, "private mounts: %s", strerror(err));
            buf_addc(&m, '\0');
            reply_error(rid, "agent", m.p);
            buf_free(&m);
            free(argv);
            free_strv(envp);
            return;
        }
    }
    int caps = full_command_caps ? CAPS_ALL : priv ? CAPS_VERIFIER : CAPS_WORKLOAD;
    Exec *e = exec_start(rid, K_EXEC, argv, envp, path, cwd, &u, nofile, cap, timeout, 1, caps);
    if (saved_ns >= 0) private_leave(saved_root, saved_ns);
    if (e) e->collect_fd = collect_fd;
    else if (collect_fd >= 0) close(collect_fd);
    if (!e) {
        Buf m = {0};
        oserr_msg(&m, errno, NULL);
        buf_addc(&m, '\0');
        reply_error(rid, "agent", m.p);
        buf_free(&m);
    } else {
        e->stdin_eof = !jtruthy(jget(req, "stdin"));
        if (e->stdin_eof) close_fd(&e->in_fd);
    }
    free(argv);
    free_strv(envp);
}

void op_kill(int64_t rid, const JVal *req) {
    int64_t target;
    if (!jint(req, "target", &target)) {
        reply_error(rid, "agent", "kill needs a target");
        return;
    }
    Exec *e = find_exec(target);
    if (e) exec_kill(e);
    reply_ok(rid);
}

int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

void setup_cgroups(void) {
    /* Like a container host: allocations succeed and the memory limit (the cgroup's
     * memory.max, not the guest's RAM size) decides, by OOM-killing inside the cgroup. */
    write_text("/proc/sys/vm/overcommit_memory", "1");
    /* the init mounted cgroup2 at CGROOT before starting us */
    if (write_text(CGROOT "/cgroup.subtree_control", "+memory +pids") < 0 ||
        (mkdir(WORKLOAD, 0755) < 0 && errno != EEXIST) ||
        write_text(WORKLOAD "/cgroup.subtree_control", "+memory +pids") < 0)
        fprintf(stderr, "rollbox-agent: cgroups unavailable: %s\n", strerror(errno));
    else
        cgroups_ok = 1;
    make_spare();
}
