/* rbx-agent, files unit: path safety (openat2 RESOLVE_IN_ROOT), stat, read_file,
 * write_file and the tar tool requests (get_tar, put_tar, fs_diff). See guest_agent.h. */

#include "guest_agent.h"

/* ------------------------------------------------------------------ path safety */

/* openat2(/, path, RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS): chroot semantics, as the host
 * gives the other backends (absolute links start at /, ".." stops there); -1 with errno. */
static int open_beneath(const char *path, int flags) {
    const char *rel = path;
    while (*rel == '/') rel++;
    if (!*rel) rel = ".";
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC);
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) return -1;
    int fd, tries = 0; /* EAGAIN: a rename raced a ".." lookup; the man page says retry */
    do fd = (int)syscall(SYS_openat2, root, rel, &how, sizeof how);
    while (fd < 0 && errno == EAGAIN && ++tries < 16);
    int e = errno;
    close(root);
    errno = e;
    return fd;
}

/* Create path's directories, never through an escaping symlink; an O_PATH fd of it.
 * On failure -1 with errno and *failed (a static buffer) naming the path that failed. */
static int makedirs_beneath(const char *path, const char **failed) {
    static char done[PATH_MAX + 2];
    static char nxt[PATH_MAX + 2];
    size_t dlen = 0;
    done[0] = '\0';
    const char *p = path;
    *failed = path;
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (dlen + 1 + n >= PATH_MAX) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(nxt, done, dlen);
        nxt[dlen] = '/';
        memcpy(nxt + dlen + 1, p, n);
        nxt[dlen + 1 + n] = '\0';
        int fd = open_beneath(nxt, O_PATH | O_DIRECTORY);
        if (fd < 0 && errno == ENOENT) {
            int parent = open_beneath(dlen ? done : "/", O_PATH | O_DIRECTORY);
            if (parent < 0) {
                *failed = dlen ? done : "/";
                return -1;
            }
            char name[NAME_MAX + 1];
            if (n > NAME_MAX) {
                close(parent);
                errno = ENAMETOOLONG;
                *failed = nxt;
                return -1;
            }
            memcpy(name, p, n);
            name[n] = '\0';
            if (mkdirat(parent, name, 0755) < 0 && errno != EEXIST) {
                static char failed_name[NAME_MAX + 1];
                int err = errno;
                close(parent);
                memcpy(failed_name, name, n + 1);
                errno = err;
                *failed = failed_name;
                return -1;
            }
            close(parent);
            fd = open_beneath(nxt, O_PATH | O_DIRECTORY);
        }
        if (fd < 0) {
            *failed = nxt;
            return -1;
        }
        close(fd);
        memcpy(done, nxt, dlen + 1 + n + 1);
        dlen += 1 + n;
        p += n;
    }
    return open_beneath(dlen ? done : "/", O_PATH | O_DIRECTORY);
}

/* os.path.realpath(path) (non-strict: missing parts are kept as they are). */
static void realpath_loose(const char *path, char *out, size_t outsz) {
    char todo[2 * PATH_MAX + 4];
    char res[PATH_MAX + 2] = "";
    size_t rlen = 0;
    int links = 0;
    snprintf(todo, sizeof todo, "%s", path);
    char *p = todo;
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 1 && p[0] == '.') {
            p += n;
            continue;
        }
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            char *slash = strrchr(res, '/');
            rlen = slash ? (size_t)(slash - res) : 0;
            res[rlen] = '\0';
            p += n;
            continue;
        }
        if (rlen + 1 + n > PATH_MAX) break;
        char cand[PATH_MAX + 2];
        memcpy(cand, res, rlen);
        cand[rlen] = '/';
        memcpy(cand + rlen + 1, p, n);
        cand[rlen + 1 + n] = '\0';
        p += n;
        struct stat st;
        if (links < 40 && lstat(cand, &st) == 0 && S_ISLNK(st.st_mode)) {
            char target[PATH_MAX + 1];
            ssize_t tl = readlink(cand, target, PATH_MAX);
            if (tl > 0) {
                target[tl] = '\0';
                links++;
                char rest[2 * PATH_MAX + 4];
                snprintf(rest, sizeof rest, "%s/%s", target, p);
                snprintf(todo, sizeof todo, "%s", rest);
                p = todo;
                if (target[0] == '/') rlen = 0;
                res[rlen] = '\0';
                continue;
            }
        }
        memcpy(res, cand, rlen + 1 + n + 1);
        rlen += 1 + n;
    }
    snprintf(out, outsz, "%s", rlen ? res : "/");
}

/* A tool finished: its T_EOF and reply, or the error it printed as its last stderr line. */
void finish_tool(Exec *e) {
    int code = WIFEXITED(e->status) ? WEXITSTATUS(e->status) : 128 + WTERMSIG(e->status);
    if (code == 0 && !e->start_error) {
        if (e->kind == K_TOOL_OUT) send_frame(T_EOF, e->rid, "", 0);
        reply_ok(e->rid);
        return;
    }
    buf_addc(&e->errbuf, '\0');
    char *text = buf_data(&e->errbuf);
    size_t len = strlen(text);
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = '\0';
    char *line = strrchr(text, '\n');
    line = line ? line + 1 : text;
    const char *err;
    JVal *v = jparse(line, strlen(line), &err);
    JVal *eobj = jget(v, "error");
    JOut o;
    jo_begin(&o, e->rid);
    if (eobj && eobj->t == J_OBJ) {
        jo_key(&o, "error");
        jdump(&o.b, eobj);
    } else {
        Buf m = {0};
        if (e->start_error) buf_adds(&m, strchr(e->start_error, ' ') + 1);
        else if (*line) buf_printf(&m, "%s", line);
        else buf_printf(&m, "the file-tree helper exited with status %d", code);
        buf_addc(&m, '\0');
        jo_error(&o, "os", m.p);
        buf_free(&m);
    }
    jfree(v);
    jo_send(&o);
}

void close_write(Write *w, int unlink_tmp) {
    if (w->fd >= 0) close(w->fd);
    if (unlink_tmp && w->tmp[0]) unlink(w->tmp);
    Write **pp = &writes;
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) *pp = w->next;
    free(w);
}

/* ------------------------------------------------------------------ requests */

static int have_python(void) { return access(PYTHON, X_OK) == 0; }

void op_stat(int64_t rid, const JVal *req) {
    const char *path = jstr(req, "path");
    if (!path) {
        reply_error(rid, "agent", "stat needs a path");
        return;
    }
    struct stat st;
    JOut o;
    if (lstat(path, &st) < 0) {
        if (errno == ENOENT) {
            jo_begin(&o, rid);
            jo_bool(&o, "exists", 0);
            jo_send(&o);
            return;
        }
        Buf m = {0};
        oserr_msg(&m, errno, path);
        buf_addc(&m, '\0');
        reply_error(rid, "agent", m.p);
        buf_free(&m);
        return;
    }
    char real[PATH_MAX + 1];
    realpath_loose(path, real, sizeof real);
    jo_begin(&o, rid);
    jo_bool(&o, "exists", 1);
    jo_bool(&o, "dir", S_ISDIR(st.st_mode));
    jo_bool(&o, "link", S_ISLNK(st.st_mode));
    jo_bool(&o, "reg", S_ISREG(st.st_mode));
    jo_int(&o, "mode", st.st_mode & 07777);
    jo_str(&o, "realpath", real);
    jo_send(&o);
}

void op_read_file(int64_t rid, const JVal *req) {
    const char *path = jstr(req, "path");
    if (!path) {
        reply_error(rid, "agent", "read_file needs a path");
        return;
    }
    int fd = open_beneath(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == EXDEV) reply_error(rid, "escape", path);
        else reply_oserror(rid, errno, path);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        JOut o;
        jo_begin(&o, rid);
        Buf m = {0};
        buf_printf(&m, "[Errno %d] not a regular file: '%s'", EISDIR, path);
        buf_addc(&m, '\0');
        jo_error(&o, "is_dir", m.p);
        buf_free(&m);
        jo_send(&o);
        return;
    }
    set_nonblock(fd, 0);
    Send *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->rid = rid;
    s->fd = fd;
    Send **pp = &sends; /* FIFO, like the Python list */
    while (*pp) pp = &(*pp)->next;
    *pp = s;
}

static Write *add_write(int64_t rid) {
    Write *w = calloc(1, sizeof *w);
    if (!w) abort();
    w->rid = rid;
    w->fd = -1;
    w->mode = -1;
    w->next = writes;
    writes = w;
    return w;
}

void op_write_file(int64_t rid, const JVal *req) {
    const char *path = jstr(req, "path");
    if (!path) {
        reply_error(rid, "agent", "write_file needs a path");
        return;
    }
    /* os.path.dirname / basename */
    char parent[PATH_MAX + 1];
    const char *slash = strrchr(path, '/');
    size_t plen = slash ? (size_t)(slash - path) + 1 : 0;
    if (plen > PATH_MAX) plen = PATH_MAX;
    memcpy(parent, path, plen);
    parent[plen] = '\0';
    while (plen > 1 && parent[plen - 1] == '/') parent[--plen] = '\0';
    if (!plen) snprintf(parent, sizeof parent, "/");
    const char *base = slash ? slash + 1 : path;
    const char *failed;
    int pfd = makedirs_beneath(parent, &failed);
    if (pfd < 0) {
        if (errno == EXDEV) reply_error(rid, "escape", path);
        else reply_oserror(rid, errno, failed);
        add_write(rid); /* swallow the data frames that follow */
        return;
    }
    char link[64], real[PATH_MAX + 1];
    snprintf(link, sizeof link, "/proc/self/fd/%d", pfd);
    ssize_t rl = readlink(link, real, PATH_MAX);
    close(pfd);
    if (rl < 0) {
        reply_oserror(rid, errno, link);
        add_write(rid);
        return;
    }
    while (rl > 0 && real[rl - 1] == '/') rl--;
    real[rl] = '\0';
    Write *w = add_write(rid);
    snprintf(w->tmp, sizeof w->tmp, "%s/.rbx-%lld-%d.tmp", real, (long long)rid, getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (w->fd < 0) {
        reply_oserror(rid, errno, w->tmp);
        w->tmp[0] = '\0';
        return;
    }
    snprintf(w->final, sizeof w->final, "%s/%s", real, base);
    int64_t mode = 0644;
    jint(req, "mode", &mode);
    w->mode = (int)(mode & 07777);
}

void finish_write(Write *w) {
    int64_t rid = w->rid;
    if (w->mode < 0) {
        close_write(w, 0);
        return;
    }
    close(w->fd);
    w->fd = -1;
    if (w->err) {
        reply_oserror(rid, w->err, w->tmp);
        close_write(w, 1);
        return;
    }
    if (chmod(w->tmp, (mode_t)w->mode) < 0) {
        reply_oserror(rid, errno, w->tmp);
        close_write(w, 1);
        return;
    }
    if (rename(w->tmp, w->final) < 0) {
        int err = errno;
        JOut o;
        jo_begin(&o, rid);
        Buf m = {0};
        buf_printf(&m, "[Errno %d] %s: '%s' -> '%s'", err, strerror(err), w->tmp, w->final);
        buf_addc(&m, '\0');
        jo_error(&o, err == ENOENT ? "not_found" : err == EISDIR ? "is_dir"
                     : err == ENOTDIR ? "not_dir" : "os", m.p);
        buf_free(&m);
        jo_send(&o);
        close_write(w, 1);
        return;
    }
    w->tmp[0] = '\0';
    close_write(w, 0);
    reply_ok(rid);
}

/* get_tar / put_tar / fs_diff: run guest_agent.py as a one-shot tool and relay its data. */
void op_tool(int64_t rid, const char *op, const JVal *req, int kind) {
    if (!have_python()) {
        reply_error(rid, "nopython",
                    "the baseline has no /usr/bin/python3, which the microvm guest agent "
                    "needs to copy file trees (directory upload, download) and for "
                    "filesystem snapshots; add python3 to the baseline or use the "
                    "namespace/gvisor backend");
        return;
    }
    if (find_exec(rid)) {
        reply_error(rid, "agent", "a request with this id is already running");
        return;
    }
    Buf js = {0};
    jdump(&js, req);
    buf_addc(&js, '\0');
    char *argv[] = {PYTHON, "-I", "-S", TOOL, "tool", (char *)op, js.p, NULL};
    char *envp[] = {"PATH=" DEFPATH, "HOME=/", "LC_ALL=C.UTF-8", NULL};
    Exec *e = exec_start(rid, kind, argv, envp, DEFPATH, "/", NULL, 0, 0, 0, 0, CAPS_ALL);
    buf_free(&js);
    if (!e) {
        reply_oserror(rid, errno, PYTHON);
        return;
    }
    if (kind != K_TOOL_IN) close_fd(&e->in_fd);
}
