/*
 * rollbox-agent: the in-sandbox init and command runner of the namespace (and gVisor)
 * backends. Static, tiny, no allocations on the hot path that matter.
 *
 * Modes:
 *   rollbox-agent launch PROCS[,PROCS...] NETNS|- -- PROG ARGS...
 *       fork (the parent exits at once), setsid, fork again (the middle process only
 *       waits to reap bwrap), write our pid into each cgroup.procs file, enter the network namespace NETNS if given, then exec PROG (used on the
 *       host so bwrap and everything below it start inside the sandbox's cgroups).
 *   rollbox-agent serve FD [READYFD|- [SECCOMPFD]]
 *       PID 1 of the sandbox (writes one byte to READYFD once running): accept connections on the listening unix socket FD; every
 *       connection is one exec handled by a forked session process. Reaps orphans.
 *       With SECCOMPFD (a compiled BPF program), the agent itself runs without that filter
 *       and with CAP_SYS_ADMIN (to build private mount namespaces, flag 8) and
 *       CAP_WAKE_ALARM (a marker only private commands keep); every command drops
 *       CAP_SYS_ADMIN and loads the filter before it execs, so commands run exactly as
 *       before.
 *
 * Wire format (both directions): u8 type, u32 little-endian length, payload.
 *   host -> agent  'E' exec request: u32 uid, gid, nofile, flags, argc, envc, then
 *                      NUL-terminated cwd, argv[argc], env[envc]; with flag 4 it carries
 *                      (SCM_RIGHTS) open cgroup.procs files of the exec's own cgroups: the
 *                      command joins them itself and there is no 'P'/'G' handshake.
 *                      Flag 8 (private mounts) appends: u32 ndirs, u32 nfiles, dirs[ndirs]
 *                      NUL-terminated, files[nfiles] as (u32 mode, u32 size, path NUL,
 *                      data[size]), collect-dir NUL: the session unshares a mount
 *                      namespace (/ rprivate), mounts a fresh tmpfs on each dir, writes the
 *                      files, runs the command there and, once it exits, returns the regular
 *                      files under collect-dir as 'L' frames. Flag 16 kills every other
 *                      process of the sandbox first (PID 1 excepted).
 *                  'G' go (the host has placed the child in its exec cgroup)
 *                  'I' stdin data (empty payload: close stdin)
 *                  'Q' ping
 *   agent -> host  'P' u32 pid of the command inside the sandbox's pid namespace
 *                  'O' stdout chunk   'R' stderr chunk
 *                  'F' u8 stage ('C' chdir, 'U' user, 'E' exec, 'G' cgroup,
 *                      'S' session fork, 'M' private mounts, 'K' seccomp/capabilities),
 *                      i32 errno
 *                  'L' u32 mode, u32 full size, relative path NUL, data (a collected file)
 *                  'T' the private exec's own deadline (u32 ms after the collect dir) passed:
 *                      every process of its mount namespace was killed
 *                  'X' i32 exit code (128+N when killed by signal N)
 *                  'A' pong
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FLAG_STDIN 1u
#define FLAG_USER 2u
#define FLAG_CGFDS 4u /* cgroup.procs fds came with the request: no pid/go handshake */
#define FLAG_PRIVATE 8u /* private mount namespace with fresh dirs (see the header) */
#define FLAG_KILLALL 16u /* kill every other process of the sandbox first */
#define MAX_REQ (64u << 20) /* a private exec carries its files (a task's tests/) */
#define COLLECT_MAX (64u << 20) /* bytes of collected files returned per exec */

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int send_frame(int fd, char type, const void *data, uint32_t len) {
    char hdr[5];
    hdr[0] = type;
    memcpy(hdr + 1, &len, 4);
    if (write_all(fd, hdr, 5) < 0) return -1;
    if (len && write_all(fd, data, len) < 0) return -1;
    return 0;
}

/* Reads a frame header with recvmsg, collecting up to MAX_FDS passed descriptors. */
#define MAX_FDS 4
static int recv_header(int fd, char hdr[5], int *fds, int *nfds) {
    struct iovec iov = {hdr, 5};
    char cbuf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    ssize_t n;
    do n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    if (n <= 0) return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *src = (int *)CMSG_DATA(c);
        for (int i = 0; i < k; i++) {
            if (*nfds < MAX_FDS) fds[(*nfds)++] = src[i];
            else close(src[i]);
        }
    }
    if (n < 5 && read_all(fd, hdr + n, (size_t)(5 - n)) < 0) return -1;
    return 0;
}

/* Reads one frame; *data is malloc'd (caller frees). Returns type or -1.
 * With fds != NULL, descriptors passed along with the header are stored there. */
static int recv_frame_fds(int fd, char **data, uint32_t *len, int *fds, int *nfds) {
    char hdr[5];
    if (fds) {
        if (recv_header(fd, hdr, fds, nfds) < 0) return -1;
    } else if (read_all(fd, hdr, 5) < 0) {
        return -1;
    }
    memcpy(len, hdr + 1, 4);
    if (*len > MAX_REQ) return -1;
    *data = malloc(*len + 1);
    if (!*data) return -1;
    if (*len && read_all(fd, *data, *len) < 0) {
        free(*data);
        return -1;
    }
    (*data)[*len] = 0;
    return (unsigned char)hdr[0];
}

static int recv_frame(int fd, char **data, uint32_t *len) {
    return recv_frame_fds(fd, data, len, NULL, NULL);
}

static void report_fail(int errfd, char stage, int err) {
    char buf[5];
    buf[0] = stage;
    memcpy(buf + 1, &err, 4);
    (void)write_all(errfd, buf, 5);
}

static void do_exec(char **argv, char **envp) {
    const char *path = NULL;
    for (char **e = envp; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    if (!path) path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    if (strchr(argv[0], '/')) {
        execve(argv[0], argv, envp);
        return;
    }
    int saved = ENOENT;
    char buf[4096];
    const char *p = path;
    while (*p) {
        const char *end = strchrnul(p, ':');
        size_t dl = (size_t)(end - p);
        if (dl == 0) { dl = 1; p = "."; }
        if (dl + 1 + strlen(argv[0]) + 1 < sizeof buf) {
            memcpy(buf, p, dl);
            buf[dl] = '/';
            strcpy(buf + dl + 1, argv[0]);
            execve(buf, argv, envp);
            if (errno == EACCES) saved = EACCES;
            else if (errno != ENOENT && errno != ENOTDIR) saved = errno;
        }
        if (!*end) break;
        p = end + 1;
    }
    errno = saved;
}

static volatile sig_atomic_t chld_fd = -1;
static void on_chld(int sig) {
    (void)sig;
    int e = errno;
    if (chld_fd >= 0) {
        char c = 1;
        (void)!write(chld_fd, &c, 1);
    }
    errno = e;
}

static uint32_t rd32(const char **p) {
    uint32_t v;
    memcpy(&v, *p, 4);
    *p += 4;
    return v;
}

/* The sandbox's seccomp program when the agent applies it per command (serve SECCOMPFD). */
static struct sock_fprog seccomp_prog;

static int load_seccomp(int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) ||
        st.st_size / sizeof(struct sock_filter) > 65535)
        return -1;
    struct sock_filter *f = malloc((size_t)st.st_size);
    if (!f || read_all(fd, f, (size_t)st.st_size) < 0) return -1;
    seccomp_prog.len = (unsigned short)(st.st_size / sizeof(struct sock_filter));
    seccomp_prog.filter = f;
    return 0;
}

static int drop_cap(int cap) {
    if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
        return -1;
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) < 0) return -1;
    uint32_t bit = 1u << (cap % 32);
    d[cap / 32].effective &= ~bit;
    d[cap / 32].permitted &= ~bit;
    d[cap / 32].inheritable &= ~bit;
    return syscall(SYS_capset, &h, d) < 0 ? -1 : 0;
}

/* In the command, before exec: give up CAP_SYS_ADMIN (all sets) and load the filter, so the
 * command has exactly what it would have had under bwrap's own --seccomp. Only a private
 * (verifier) command keeps CAP_WAKE_ALARM, a harmless marker: with a capability the others
 * lack, their processes fail the kernel's ptrace access check against it (no
 * /proc/PID/root, cwd, fd or mem of a verifier process for what the agent left running). */
static int restrict_command(int private_exec) {
    if (!seccomp_prog.filter) return 0;
    if (drop_cap(CAP_SYS_ADMIN) < 0) return -1;
    if (!private_exec && drop_cap(CAP_WAKE_ALARM) < 0) return -1;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &seccomp_prog) < 0 ? -1 : 0;
}

/* Is any process besides PID 1 and us still alive (not a zombie)? */
static int others_alive(void) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    pid_t self = getpid();
    int alive = 0;
    struct dirent *e;
    while (!alive && (e = readdir(d))) {
        char *endp;
        long pid = strtol(e->d_name, &endp, 10);
        if (*endp || pid <= 1 || pid == self) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        char *rp = strrchr(buf, ')');
        if (rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X') alive = 1;
    }
    closedir(d);
    return alive;
}

/* Flag 16: SIGKILL everything but PID 1 and us, again while forks race the kill (<= 5 s). */
static void kill_others(void) {
    for (int round = 0; round < 1000; round++) {
        kill(-1, SIGKILL);
        if (!others_alive()) return;
        usleep(5000);
    }
}

static long elapsed_ms(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long)(now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

/* SIGKILL every process of this session's (private) mount namespace but the session. */
static void kill_mount_ns(void) {
    struct stat me;
    if (stat("/proc/self/ns/mnt", &me) < 0) return;
    pid_t self = getpid();
    for (int round = 0; round < 400; round++) {
        int found = 0;
        DIR *d = opendir("/proc");
        if (!d) return;
        struct dirent *e;
        while ((e = readdir(d))) {
            char *endp;
            long pid = strtol(e->d_name, &endp, 10);
            if (*endp || pid <= 1 || pid == self) continue;
            char path[64];
            struct stat st;
            snprintf(path, sizeof path, "/proc/%ld/ns/mnt", pid);
            if (stat(path, &st) < 0 || st.st_ino != me.st_ino || st.st_dev != me.st_dev) continue;
            kill((pid_t)pid, SIGKILL);
            found = 1;
        }
        closedir(d);
        if (!found) return;
        usleep(5000);
    }
}

static int mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, path, n + 1);
    for (char *q = buf + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
        *q = '/';
    }
    return mkdir(buf, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* Flag 8: this session's own mount namespace, fresh tmpfs dirs, the host's files in them. */
static int private_setup(char **dirs, uint32_t ndirs, const char *files, const char *fend,
                         uint32_t nfiles) {
    if (unshare(CLONE_NEWNS) < 0) return -1;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -1;
    for (uint32_t i = 0; i < ndirs; i++) {
        if (mkdirs(dirs[i]) < 0) return -1;
        if (mount("tmpfs", dirs[i], "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=256m") < 0)
            return -1;
    }
    const char *q = files;
    for (uint32_t i = 0; i < nfiles; i++) {
        if (fend - q < 8) { errno = EINVAL; return -1; }
        uint32_t mode = rd32(&q), size = rd32(&q);
        const char *path = q;
        size_t pl = strnlen(q, (size_t)(fend - q));
        q += pl + 1;
        if (q > fend || (size_t)(fend - q) < size || path[0] != '/' || strstr(path, "/../") ||
            strstr(path, "/./")) {
            errno = EINVAL;
            return -1;
        }
        char parent[4096];
        const char *slash = strrchr(path, '/');
        if ((size_t)(slash - path) >= sizeof parent) { errno = ENAMETOOLONG; return -1; }
        memcpy(parent, path, (size_t)(slash - path));
        parent[slash - path] = 0;
        if (parent[0] && mkdirs(parent) < 0) return -1;
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode & 07777);
        if (fd < 0) return -1;
        if (write_all(fd, q, size) < 0 || fchmod(fd, mode & 07777) < 0) { close(fd); return -1; }
        close(fd);
        q += size;
    }
    return 0;
}

/* Sends the regular files under DIR (relative names, no symlinks followed) as 'L' frames. */
static void collect_dir(int conn, const char *dir, const char *rel, size_t *budget, int depth) {
    if (depth > 32) return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char full[4096], name[4096];
        if (snprintf(full, sizeof full, "%s/%s", dir, e->d_name) >= (int)sizeof full) continue;
        if (snprintf(name, sizeof name, "%s%s%s", rel, *rel ? "/" : "", e->d_name) >=
            (int)sizeof name)
            continue;
        struct stat st;
        if (lstat(full, &st) < 0) continue;
        if (S_ISDIR(st.st_mode)) {
            collect_dir(conn, full, name, budget, depth + 1);
            continue;
        }
        if (!S_ISREG(st.st_mode)) continue;
        int fd = open(full, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        size_t want = (size_t)st.st_size < *budget ? (size_t)st.st_size : *budget;
        size_t nl = strlen(name) + 1, got = 0;
        char *msg = malloc(8 + nl + want);
        if (msg) {
            uint32_t mode = st.st_mode & 07777, full_size = (uint32_t)st.st_size;
            memcpy(msg, &mode, 4);
            memcpy(msg + 4, &full_size, 4);
            memcpy(msg + 8, name, nl);
            while (got < want) {
                ssize_t n = read(fd, msg + 8 + nl + got, want - got);
                if (n <= 0) break;
                got += (size_t)n;
            }
            *budget -= got;
            send_frame(conn, 'L', msg, (uint32_t)(8 + nl + got));
            free(msg);
        }
        close(fd);
    }
    closedir(d);
}

static void session(int conn) {
    char *req = NULL;
    uint32_t len = 0;
    int cgfds[MAX_FDS];
    int ncg = 0;
    int type = recv_frame_fds(conn, &req, &len, cgfds, &ncg);
    if (type == 'Q') {
        send_frame(conn, 'A', NULL, 0);
        _exit(0);
    }
    if (type != 'E' || len < 24) _exit(1);
    const char *p = req, *end = req + len;
    uint32_t uid = rd32(&p), gid = rd32(&p), nofile = rd32(&p), flags = rd32(&p);
    uint32_t argc = rd32(&p), envc = rd32(&p);
    if (argc == 0 || argc > 65536 || envc > 65536) _exit(1);
    char **argv = calloc(argc + 1, sizeof(char *));
    char **envp = calloc(envc + 1, sizeof(char *));
    const char *cwd = p;
    p += strnlen(p, (size_t)(end - p)) + 1;
    for (uint32_t i = 0; i < argc && p < end; i++) {
        argv[i] = (char *)p;
        p += strnlen(p, (size_t)(end - p)) + 1;
    }
    for (uint32_t i = 0; i < envc && p < end; i++) {
        envp[i] = (char *)p;
        p += strnlen(p, (size_t)(end - p)) + 1;
    }
    if (p > end || !argv[argc - 1]) _exit(1);
    char **pdirs = NULL;
    uint32_t ndirs = 0, nfiles = 0;
    const char *pfiles = NULL, *collect = NULL;
    uint32_t deadline_ms = 0; /* private exec: kill its namespace after this, keep its files */
    if (flags & FLAG_PRIVATE) {
        if (end - p < 8) _exit(1);
        ndirs = rd32(&p);
        nfiles = rd32(&p);
        if (ndirs > 64) _exit(1);
        pdirs = calloc(ndirs + 1, sizeof(char *));
        for (uint32_t i = 0; i < ndirs; i++) {
            if (p >= end) _exit(1);
            pdirs[i] = (char *)p;
            p += strnlen(p, (size_t)(end - p)) + 1;
        }
        pfiles = p;
        /* Skip over the files to find the collect dir (checked again while writing). */
        for (uint32_t i = 0; i < nfiles; i++) {
            if (end - p < 8) _exit(1);
            const char *h = p + 4;
            uint32_t size = rd32(&h);
            p += 8;
            p += strnlen(p, (size_t)(end - p)) + 1;
            if (p > end || (size_t)(end - p) < size) _exit(1);
            p += size;
        }
        if (p >= end) _exit(1);
        collect = p;
        p += strnlen(p, (size_t)(end - p)) + 1;
        if (p > end) _exit(1);
        if (end - p >= 4) deadline_ms = rd32(&p);
    }
    if (flags & FLAG_KILLALL) kill_others();
    if ((flags & FLAG_PRIVATE) && private_setup(pdirs, ndirs, pfiles, collect, nfiles) < 0) {
        char fb[5];
        int e = errno;
        fb[0] = 'M';
        memcpy(fb + 1, &e, 4);
        send_frame(conn, 'F', fb, 5);
        int32_t code = 125;
        send_frame(conn, 'X', &code, 4);
        _exit(0);
    }

    int out[2], err[2], in[2] = {-1, -1}, go[2], ef[2], sc[2];
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(go, O_CLOEXEC) ||
        pipe2(ef, O_CLOEXEC) || pipe2(sc, O_CLOEXEC | O_NONBLOCK))
        _exit(1);
    if ((flags & FLAG_STDIN) && pipe2(in, O_CLOEXEC)) _exit(1);
    chld_fd = sc[1];
    struct sigaction sa = {0};
    sa.sa_handler = on_chld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);

    pid_t child = fork();
    if (child < 0) _exit(1);
    if (child == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        setsid();
        if (flags & FLAG_CGFDS) {
            /* Join this exec's own cgroups through the descriptors the host passed. */
            for (int i = 0; i < ncg; i++) {
                if (write(cgfds[i], "0", 1) != 1) {
                    report_fail(ef[1], 'G', errno);
                    _exit(125);
                }
                close(cgfds[i]);
            }
        } else {
            char c;
            if (read(go[0], &c, 1) != 1) _exit(255);
        }
        int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
        dup2(flags & FLAG_STDIN ? in[0] : nul, 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        if (nofile) {
            struct rlimit rl = {nofile, nofile};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        if (restrict_command((flags & FLAG_PRIVATE) != 0) < 0) {
            report_fail(ef[1], 'K', errno);
            _exit(125);
        }
        if (flags & FLAG_USER) {
            if (setgroups(0, NULL) || setgid(gid) || setuid(uid)) {
                report_fail(ef[1], 'U', errno);
                _exit(126);
            }
        }
        if (cwd[0] && chdir(cwd)) {
            report_fail(ef[1], 'C', errno);
            _exit(127);
        }
        do_exec(argv, envp);
        int e = errno;
        report_fail(ef[1], 'E', e);
        _exit(e == EACCES ? 126 : 127);
    }
    close(out[1]);
    close(err[1]);
    close(go[0]);
    close(ef[1]);
    if (in[0] >= 0) close(in[0]);
    for (int i = 0; i < ncg; i++) close(cgfds[i]);
    if (!(flags & FLAG_CGFDS)) {
        uint32_t cpid = (uint32_t)child;
        if (send_frame(conn, 'P', &cpid, 4) < 0) { kill(child, SIGKILL); _exit(1); }
        char *msg = NULL;
        type = recv_frame(conn, &msg, &len);
        if (type != 'G') { kill(child, SIGKILL); _exit(1); }
        free(msg);
        if (write_all(go[1], "g", 1) < 0) _exit(1);
    }
    free(req);
    close(go[1]);

    int out_open = 1, err_open = 1, conn_open = 1, exited = 0, status = 0, timed_out = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char buf[65536];
    for (;;) {
        if (deadline_ms && !timed_out && elapsed_ms(&t0) >= deadline_ms) {
            /* The verifier ran out of time: end its whole namespace (daemons included),
             * then its files still go back. */
            timed_out = 1;
            kill_mount_ns();
        }
        if (!exited) {
            pid_t r = waitpid(child, &status, WNOHANG);
            if (r == child) exited = 1;
        }
        if (exited) {
            /* Drain whatever is already buffered; daemons may hold the pipes open. */
            for (int k = 0; k < 2; k++) {
                int fd = k == 0 ? out[0] : err[0];
                if (k == 0 ? !out_open : !err_open) continue;
                fcntl(fd, F_SETFL, O_NONBLOCK);
                /* Bounded: a daemon that keeps writing must not hold the exec open. */
                for (size_t total = 0; total < (4u << 20);) {
                    ssize_t n = read(fd, buf, sizeof buf);
                    if (n <= 0) break;
                    total += (size_t)n;
                    if (send_frame(conn, k == 0 ? 'O' : 'R', buf, (uint32_t)n) < 0) _exit(1);
                }
            }
            break;
        }
        struct pollfd fds[4];
        int nf = 0, io = -1, ie = -1, ic = -1;
        fds[nf].fd = sc[0]; fds[nf].events = POLLIN; nf++;
        if (out_open) { io = nf; fds[nf].fd = out[0]; fds[nf].events = POLLIN; nf++; }
        if (err_open) { ie = nf; fds[nf].fd = err[0]; fds[nf].events = POLLIN; nf++; }
        if (conn_open) { ic = nf; fds[nf].fd = conn; fds[nf].events = POLLIN; nf++; }
        int wait_ms = out_open || err_open ? -1 : 100;
        if (deadline_ms && !timed_out) {
            long left = (long)deadline_ms - elapsed_ms(&t0);
            if (left < 0) left = 0;
            if (wait_ms < 0 || left < wait_ms) wait_ms = (int)left;
        }
        int pr = poll(fds, (nfds_t)nf, wait_ms);
        if (pr < 0 && errno != EINTR) _exit(1);
        if (pr <= 0) continue;
        if (fds[0].revents) {
            char d[64];
            while (read(sc[0], d, sizeof d) > 0) {}
        }
        if (io >= 0 && fds[io].revents) {
            ssize_t n = read(out[0], buf, sizeof buf);
            if (n <= 0) { out_open = 0; close(out[0]); }
            else if (send_frame(conn, 'O', buf, (uint32_t)n) < 0) _exit(1);
        }
        if (ie >= 0 && fds[ie].revents) {
            ssize_t n = read(err[0], buf, sizeof buf);
            if (n <= 0) { err_open = 0; close(err[0]); }
            else if (send_frame(conn, 'R', buf, (uint32_t)n) < 0) _exit(1);
        }
        if (ic >= 0 && fds[ic].revents) {
            char *d = NULL;
            uint32_t dl = 0;
            int t = recv_frame(conn, &d, &dl);
            if (t < 0) {
                /* Host went away: the command is killed by the host via its cgroup. */
                conn_open = 0;
                if (in[1] >= 0) { close(in[1]); in[1] = -1; }
            } else if (t == 'I') {
                if (dl == 0 && in[1] >= 0) { close(in[1]); in[1] = -1; }
                else if (in[1] >= 0 && write_all(in[1], d, dl) < 0) { close(in[1]); in[1] = -1; }
            }
            free(d);
        }
    }
    char fb[5];
    if (read(ef[0], fb, 5) == 5) send_frame(conn, 'F', fb, 5);
    if (collect && collect[0]) {
        size_t budget = COLLECT_MAX;
        collect_dir(conn, collect, "", &budget, 0);
    }
    if (timed_out) send_frame(conn, 'T', NULL, 0);
    int32_t code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    send_frame(conn, 'X', &code, 4);
    _exit(0);
}

static int has_cap(int cap) {
    /* CapPrm from /proc/self/status: the permitted set bwrap left us. */
    static unsigned long long prm = 0;
    static int loaded = 0;
    if (!loaded) {
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        while (f && fgets(line, sizeof line, f))
            if (strncmp(line, "CapPrm:", 7) == 0) prm = strtoull(line + 7, NULL, 16);
        if (f) fclose(f);
        loaded = 1;
    }
    return (prm >> cap) & 1;
}

static void on_chld_pid1(int sig) { (void)sig; }

static int serve(int lfd) {
    signal(SIGPIPE, SIG_IGN);
    /* SIGCHLD interrupts poll (no SA_RESTART) so orphans are reaped at once. */
    struct sigaction sa = {0};
    sa.sa_handler = on_chld_pid1;
    sigaction(SIGCHLD, &sa, NULL);
    /* Shrink the bounding set to what we were given, so nothing inside can regain more. */
    for (int cap = 0; cap <= 63; cap++) {
        if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 && !has_cap(cap))
            prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    }
    /* As PID 1 we reap every orphan; SIGCHLD is left default and reaped in the loop. */
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        struct pollfd pfd = {lfd, POLLIN, 0};
        int pr = poll(&pfd, 1, 200);
        if (pr <= 0) continue;
        int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue;
        pid_t s = fork();
        if (s < 0) {
            /* e.g. the pids limit is reached: tell the host instead of hanging up. */
            char fb[5];
            fb[0] = 'S';
            int e = errno;
            memcpy(fb + 1, &e, 4);
            send_frame(c, 'F', fb, 5);
        }
        if (s == 0) {
            close(lfd);
            session(c);
            _exit(0);
        }
        close(c);
    }
}

static int launch(char *procs, const char *netns, char **argv) {
    /* Detach: the caller waits for us only; the sandbox is re-parented to init so no
     * process of the creator ever holds it as a zombie. */
    pid_t f = fork();
    if (f < 0) return 125;
    if (f > 0) return 0;
    setsid();
    /* Stay as bwrap's parent (outside the sandbox's cgroups) only to reap it the moment
     * it dies: the host's init may reap orphans late, and a zombie keeps charges. */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    pid_t g = fork();
    if (g < 0) _exit(125);
    if (g > 0) {
        for (int fd = 0; fd < 1024; fd++) close(fd);
        /* Reap bwrap and, as subreaper, whatever of the sandbox gets orphaned. */
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {}
        _exit(0);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    for (char *tok = strtok(procs, ","); tok; tok = strtok(NULL, ",")) {
        int fd = open(tok, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write_all(fd, pid, (size_t)n) < 0) {
            fprintf(stderr, "rollbox-agent: cannot join cgroup %s: %s\n", tok, strerror(errno));
            _exit(125);
        }
        close(fd);
    }
    if (strcmp(netns, "-") != 0) {
        int fd = open(netns, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
            fprintf(stderr, "rollbox-agent: cannot enter netns %s: %s\n", netns, strerror(errno));
            _exit(125);
        }
        close(fd);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "rollbox-agent: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "serve") == 0) {
        if (argc >= 4 && strcmp(argv[3], "-") != 0) {
            /* Tell the host we are up (cheaper than a ping connection), then let go. */
            int rfd = atoi(argv[3]);
            (void)!write(rfd, "r", 1);
            close(rfd);
        }
        /* Nothing else the launcher passed (e.g. the memfd this agent was started from)
         * may reach the commands it runs. */
        int lfd = atoi(argv[2]);
        if (argc >= 5) {
            int sfd = atoi(argv[4]);
            if (load_seccomp(sfd) < 0) {
                fprintf(stderr, "rollbox-agent: cannot read the seccomp program\n");
                return 125;
            }
            close(sfd);
        }
        for (int fd = 3; fd < 1024; fd++)
            if (fd != lfd) close(fd);
        return serve(lfd);
    }
    if (argc >= 6 && strcmp(argv[1], "launch") == 0 && strcmp(argv[4], "--") == 0)
        return launch(argv[2], argv[3], argv + 5);
    fprintf(stderr, "usage: rollbox-agent serve FD | launch PROCS NETNS|- -- PROG ARGS...\n");
    return 2;
}
