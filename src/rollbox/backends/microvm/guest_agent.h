/*
 * rbx-agent: the rollbox microVM guest agent in C (PID 1 inside the guest).
 *
 * Speaks exactly the wire protocol of guest_agent.py (which stays the reference and the
 * host's source of constants):
 *
 *     frame = MAGIC "RB"(2) type(1) stream(4, BE) length(4, BE) payload(length)
 *
 * T_JSON frames carry one request or reply (a JSON object with an "id"); T_OUT/T_ERR/T_IN/
 * T_DATA carry raw bytes of stream "id"; T_EOF ends one. One host client at a time on the
 * virtio-serial port named "rollbox.agent"; when it goes away the agent kills what it ran.
 *
 * Why C: under TCG every guest instruction is translated, and after a memory restore the
 * translation cache is cold. A small static binary with a tiny hot path, spawning with
 * clone(CLONE_VM|CLONE_VFORK) (no address-space copy), makes the first exec after a restore
 * cheap and frees the guest from needing python3. Tar ops (get_tar, put_tar, fs_diff) are
 * not reimplemented: the agent runs `python3 -I -S /run/rollbox/agent.py tool OP JSON` and
 * relays its stdin/stdout as T_DATA frames.
 *
 * Single process, no threads, one ppoll loop. PID 1 must never exit: every error becomes
 * an error reply.
 */
/* The agent is four C units compiled together into one static binary (the build lists
 * them: rollbox.backends.microvm.initramfs.AGENT_SOURCES):
 *   guest_agent.c           protocol: frames, dispatch, lifecycle requests, main loop
 *   guest_agent_json.c      byte buffers, JSON parser and writer
 *   guest_agent_exec.c      users, spawning, exec/kill, private execs, reaping
 *   guest_agent_files.c     path safety, stat/read/write, tar tools
 * This header holds every type, constant and cross-unit declaration. */

#ifndef RBX_GUEST_AGENT_H
#define RBX_GUEST_AGENT_H

#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <linux/random.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define AGENT_VERSION 2
#define PORT_NAME "rollbox.agent"
#define MAX_FRAME (1u << 20)
#define CHUNK (64 * 1024)
#define HDR 11
enum { T_JSON = 1, T_OUT, T_ERR, T_IN, T_DATA, T_EOF };

#define RUN "/run/rollbox"
#define UPPER RUN "/rw/upper"
#define CGROOT "/sys/fs/cgroup"
#define WORKLOAD CGROOT "/rbx"
#define PYTHON "/usr/bin/python3"
#define TOOL RUN "/agent.py"
#define DEFPATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* ------------------------------------------------------------------ byte buffers */

typedef struct {
    char *p;
    size_t len, cap, off; /* live bytes are p[off..len) */
} Buf;

/* ------------------------------------------------------------------ JSON */

typedef enum { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ } JType;

typedef struct JVal JVal;
struct JVal {
    JType t;
    int is_int;     /* J_NUM: an integer that fits in int64 */
    int64_t i;      /* J_NUM integer value */
    double d;       /* J_NUM value as a double */
    char *s;        /* J_STR: UTF-8, NUL-terminated (may contain NULs: see slen) */
    size_t slen;
    JVal **items;   /* J_ARR values / J_OBJ values */
    char **keys;    /* J_OBJ keys */
    size_t n;
};

typedef struct {
    const char *p, *end;
    const char *err;
    int depth;
} JParser;

/* A tiny JSON object writer for replies: {"id": N, ...}. */
typedef struct {
    Buf b;
} JOut;

/* ------------------------------------------------------------------ users */

typedef struct {
    uid_t uid;
    gid_t gid;
    gid_t groups[NGROUPS_MAX > 256 ? 256 : NGROUPS_MAX];
    size_t ngroups;
    char name[256];
    char home[PATH_MAX];
} User;

/* ------------------------------------------------------------------ spawning */

enum { ST_OK = 0, ST_SETSID, ST_CGROUP, ST_RLIMIT, ST_SETID, ST_CHDIR, ST_EXEC, ST_CAPS };

/* The capabilities a command keeps. Workload commands get Docker's default set without
 * CAP_MKNOD (backends/common/bundle.py DEFAULT_CAPS, as on namespace and gVisor): no
 * CAP_SYS_ADMIN (no setns/mount into the verifier's namespace), no CAP_SYS_PTRACE.
 * A private (verifier) command also keeps CAP_WAKE_ALARM, a harmless marker: with a
 * capability the others lack, their processes fail the kernel's ptrace access check
 * against it (no /proc/PID/root, cwd, fd, ns or mem of a verifier process for what the
 * agent left running). Tools (rollbox's own tar helper) keep everything. */
enum { CAPS_ALL = 0, CAPS_WORKLOAD, CAPS_VERIFIER };
#define CAPBIT(c) (1ull << (c))
#define WORKLOAD_CAPS                                                                          \
    (CAPBIT(CAP_CHOWN) | CAPBIT(CAP_DAC_OVERRIDE) | CAPBIT(CAP_FSETID) | CAPBIT(CAP_FOWNER) | \
     CAPBIT(CAP_NET_RAW) | CAPBIT(CAP_SETGID) | CAPBIT(CAP_SETUID) | CAPBIT(CAP_SETFCAP) |     \
     CAPBIT(CAP_SETPCAP) | CAPBIT(CAP_NET_BIND_SERVICE) | CAPBIT(CAP_SYS_CHROOT) |             \
     CAPBIT(CAP_KILL) | CAPBIT(CAP_AUDIT_WRITE))

typedef struct {
    char *const *argv;
    char *const *envp;
    const char *cwd;
    const char *path; /* PATH to search, from envp (Python: os.defpath when absent) */
    int in_fd, out_fd, err_fd, cg_fd;
    int64_t nofile;
    int caps; /* CAPS_* */
    int setids;
    uid_t uid;
    gid_t gid;
    const gid_t *groups;
    size_t ngroups;
    /* written by the child (shared memory: CLONE_VM) when it fails before exec */
    volatile int stage;
    volatile int err;
    char failpath[PATH_MAX + 1];
} Spawn;

/* ------------------------------------------------------------------ agent state */

enum { K_EXEC, K_TOOL_OUT, K_TOOL_IN }; /* a command, or a tar tool streaming out / in */

typedef struct Exec Exec;
struct Exec {
    Exec *next;
    int64_t rid;
    int kind;
    pid_t pid;
    int reaped, status; /* status: waitpid's */
    int in_fd, out_fd, err_fd;
    int pidx_in, pidx_out, pidx_err; /* indices into this step's pollfds, -1 if absent */
    Buf stdin_buf;
    int stdin_eof;
    int64_t cap, sent_out, sent_err;
    int truncated, timed_out;
    double deadline; /* 0: none */
    char cg[160];
    char *start_error; /* "CODE message" as in guest_agent.py, or NULL */
    Buf errbuf;        /* the tool's stderr (its result line) */
    int collect_fd;    /* private exec: the fresh dir whose files go back (T_DATA), or -1 */
};

typedef struct Write Write;
struct Write { /* write_file in progress (fd -1: discard the data, reply nothing) */
    Write *next;
    int64_t rid;
    int fd, err;
    int mode;
    char tmp[PATH_MAX + 64];
    char final[PATH_MAX + 64];
};

typedef struct Send Send;
struct Send { /* read_file being streamed */
    Send *next;
    int64_t rid;
    int fd;
};

/* ------------------------------------------------------------------ warm set
 *
 * Memory snapshots are taken after dropping the guest's caches (a smaller image), but then
 * the first command after a restore reads the dynamic loader, libc and its own binary back
 * from the virtual disk, which under TCG costs more than the command itself. So quiesce
 * keeps the pages of those files that were cached (mincore) and drops everything else. */

#define NWARM 16

typedef struct {
    int fd;
    size_t pages;
    unsigned char *vec;
} Warm;

/* ------------------------------------------------------------ private (verifier) execs
 * An exec with "private": {"fresh": [dirs], "files": [[path, mode, base64]], "collect": dir,
 * "kill_others": bool}. PID 1 steps into a new mount namespace (/ rprivate, a fresh tmpfs on
 * each dir, the files written), spawns the command there, keeps an fd of the collect dir and
 * steps back; when the command ends, the collect dir's regular files go to the host as
 * T_DATA frames of the exec's stream (u32 LE mode, u32 LE full size, relative path NUL,
 * data), before the exit reply. Nothing outside that namespace sees those dirs. */
#define COLLECT_MAX (64u << 20)
#define COLLECT_FILE_MAX (MAX_FRAME - 4096)

/* ------------------------------------------------------------------ guest_agent.c */

extern int connected;
extern Buf out, inbuf;
extern Exec *execs;
extern Write *writes;
extern Send *sends;
extern int test_mode;
extern int cgroups_ok;
extern char spare_cg[160];

double mono(void);
int64_t mono_ns(void);
int write_text(const char *path, const char *text);
void set_nonblock(int fd, int on);
void oserr_msg(Buf *b, int err, const char *path);
void jo_error(JOut *o, const char *type, const char *msg);
void send_frame(int kind, int64_t stream, const void *data, size_t len);
void jo_send(JOut *o);
void reply_ok(int64_t rid);
void reply_error(int64_t rid, const char *type, const char *msg);
void reply_oserror(int64_t rid, int err, const char *path);
void warm_note(const char *path);
void flush_out(void);

/* ------------------------------------------------------------------ guest_agent_json.c */

void buf_add(Buf *b, const void *data, size_t n);
void buf_addc(Buf *b, char c);
void buf_adds(Buf *b, const char *s);
size_t buf_size(const Buf *b);
char *buf_data(const Buf *b);
void buf_consume(Buf *b, size_t n);
void buf_free(Buf *b);
void buf_printf(Buf *b, const char *fmt, ...);
void jfree(JVal *v);
JVal *jparse(const char *data, size_t len, const char **err);
JVal *jget(const JVal *obj, const char *key);
int jtruthy(const JVal *v);
const char *jstr(const JVal *obj, const char *key);
int jint(const JVal *obj, const char *key, int64_t *out);
void jesc(Buf *b, const char *s, size_t len);
void jdump(Buf *b, const JVal *v);
void jo_begin(JOut *o, int64_t id);
void jo_key(JOut *o, const char *k);
void jo_int(JOut *o, const char *k, int64_t v);
void jo_bool(JOut *o, const char *k, int v);
void jo_str(JOut *o, const char *k, const char *s);

/* ------------------------------------------------------------------ guest_agent_exec.c */

extern int full_command_caps;
extern int spare_failed;

Exec *find_exec(int64_t rid);
void close_fd(int *fd);
void exec_kill(Exec *e);
void flush_stdin(Exec *e);
void feed_stdin(Exec *e, const void *data, size_t len, int eof);
int on_output(Exec *e, int fd, int kind);
Exec *exec_start(int64_t rid, int kind, char *const *argv, char *const *envp, const char *path,
           const char *cwd, const User *u, int64_t nofile, int64_t cap, double timeout,
           int want_cgroup, int caps);
void make_spare(void);
void check_exec(Exec *e);
void reap(void);
void op_exec(int64_t rid, const JVal *req);
void op_kill(int64_t rid, const JVal *req);
int b64val(int c);
void setup_cgroups(void);

/* ------------------------------------------------------------------ guest_agent_files.c */

void finish_tool(Exec *e);
void close_write(Write *w, int unlink_tmp);
void op_stat(int64_t rid, const JVal *req);
void op_read_file(int64_t rid, const JVal *req);
void op_write_file(int64_t rid, const JVal *req);
void finish_write(Write *w);
void op_tool(int64_t rid, const char *op, const JVal *req, int kind);

#endif
