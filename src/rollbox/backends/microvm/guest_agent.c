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

static void buf_reserve(Buf *b, size_t extra) {
    if (b->off && b->off == b->len) b->off = b->len = 0;
    if (b->len + extra <= b->cap) return;
    if (b->off) { /* compact before growing */
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->len + extra <= b->cap) return;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) abort(); /* out of memory in PID 1: nothing sensible left to do */
    b->p = p;
    b->cap = cap;
}

static void buf_add(Buf *b, const void *data, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_addc(Buf *b, char c) { buf_add(b, &c, 1); }
static void buf_adds(Buf *b, const char *s) { buf_add(b, s, strlen(s)); }
static size_t buf_size(const Buf *b) { return b->len - b->off; }
static char *buf_data(const Buf *b) { return b->p + b->off; }

static void buf_consume(Buf *b, size_t n) {
    b->off += n;
    if (b->off >= b->len) b->off = b->len = 0;
}

static void buf_free(Buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void buf_printf(Buf *b, const char *fmt, ...) {
    va_list ap;
    char tmp[512];
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        buf_add(b, tmp, (size_t)n);
        return;
    }
    buf_reserve(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

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

static void jfree(JVal *v) {
    if (!v) return;
    free(v->s);
    for (size_t k = 0; k < v->n; k++) {
        jfree(v->items[k]);
        if (v->keys) free(v->keys[k]);
    }
    free(v->items);
    free(v->keys);
    free(v);
}

static void jskip_ws(JParser *jp) {
    while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r'))
        jp->p++;
}

static JVal *jnew(JType t) {
    JVal *v = calloc(1, sizeof *v);
    if (!v) abort();
    v->t = t;
    return v;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static void utf8_put(Buf *b, unsigned cp) {
    if (cp < 0x80) {
        buf_addc(b, (char)cp);
    } else if (cp < 0x800) {
        buf_addc(b, (char)(0xC0 | (cp >> 6)));
        buf_addc(b, (char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        buf_addc(b, (char)(0xE0 | (cp >> 12)));
        buf_addc(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        buf_addc(b, (char)(0x80 | (cp & 0x3F)));
    } else {
        buf_addc(b, (char)(0xF0 | (cp >> 18)));
        buf_addc(b, (char)(0x80 | ((cp >> 12) & 0x3F)));
        buf_addc(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        buf_addc(b, (char)(0x80 | (cp & 0x3F)));
    }
}

/* Parse a JSON string at jp->p (the opening quote) into a malloc'd UTF-8 string. */
static char *jparse_str(JParser *jp, size_t *len) {
    Buf b = {0};
    jp->p++; /* opening quote */
    while (1) {
        if (jp->p >= jp->end) {
            jp->err = "unterminated string";
            goto fail;
        }
        unsigned char c = (unsigned char)*jp->p++;
        if (c == '"') break;
        if (c < 0x20) {
            jp->err = "control character in string";
            goto fail;
        }
        if (c != '\\') {
            buf_addc(&b, (char)c);
            continue;
        }
        if (jp->p >= jp->end) {
            jp->err = "unterminated escape";
            goto fail;
        }
        char e = *jp->p++;
        switch (e) {
        case '"': buf_addc(&b, '"'); break;
        case '\\': buf_addc(&b, '\\'); break;
        case '/': buf_addc(&b, '/'); break;
        case 'b': buf_addc(&b, '\b'); break;
        case 'f': buf_addc(&b, '\f'); break;
        case 'n': buf_addc(&b, '\n'); break;
        case 'r': buf_addc(&b, '\r'); break;
        case 't': buf_addc(&b, '\t'); break;
        case 'u': {
            unsigned cp;
            if (jp->end - jp->p < 4 || hex4(jp->p, &cp) < 0) {
                jp->err = "bad \\u escape";
                goto fail;
            }
            jp->p += 4;
            if (cp >= 0xD800 && cp < 0xDC00) { /* high surrogate: a low one may follow */
                unsigned lo;
                if (jp->end - jp->p >= 6 && jp->p[0] == '\\' && jp->p[1] == 'u' &&
                    hex4(jp->p + 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
                    jp->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
            }
            /* a lone surrogate (Python accepts it) is encoded as-is, like surrogatepass */
            utf8_put(&b, cp);
            break;
        }
        default:
            jp->err = "bad escape";
            goto fail;
        }
    }
    buf_addc(&b, '\0');
    *len = b.len - 1;
    return b.p;
fail:
    buf_free(&b);
    return NULL;
}

static JVal *jparse_val(JParser *jp);

static JVal *jparse_num(JParser *jp) {
    const char *s = jp->p;
    const char *q = s;
    int is_int = 1;
    if (q < jp->end && *q == '-') q++;
    if (q >= jp->end || !isdigit((unsigned char)*q)) goto bad;
    if (*q == '0') q++;
    else while (q < jp->end && isdigit((unsigned char)*q)) q++;
    if (q < jp->end && *q == '.') {
        is_int = 0;
        q++;
        if (q >= jp->end || !isdigit((unsigned char)*q)) goto bad;
        while (q < jp->end && isdigit((unsigned char)*q)) q++;
    }
    if (q < jp->end && (*q == 'e' || *q == 'E')) {
        is_int = 0;
        q++;
        if (q < jp->end && (*q == '+' || *q == '-')) q++;
        if (q >= jp->end || !isdigit((unsigned char)*q)) goto bad;
        while (q < jp->end && isdigit((unsigned char)*q)) q++;
    }
    char tmp[64];
    size_t n = (size_t)(q - s);
    if (n >= sizeof tmp) {
        if (is_int) { /* a huge integer: keep it as a (lossy) double, like a float */
            is_int = 0;
        }
        n = sizeof tmp - 1; /* strtod below sees a prefix: fine for our purposes */
    }
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    JVal *v = jnew(J_NUM);
    v->d = strtod(tmp, NULL);
    if (is_int) {
        errno = 0;
        long long ll = strtoll(tmp, NULL, 10);
        if (errno == 0) {
            v->is_int = 1;
            v->i = ll;
        }
    }
    jp->p = q;
    return v;
bad:
    jp->err = "bad number";
    return NULL;
}

static int jlit(JParser *jp, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(jp->end - jp->p) < n || memcmp(jp->p, lit, n) != 0) return 0;
    jp->p += n;
    return 1;
}

static void jpush(JVal *v, char *key, JVal *item) {
    v->items = realloc(v->items, (v->n + 1) * sizeof *v->items);
    if (!v->items) abort();
    if (v->t == J_OBJ) {
        v->keys = realloc(v->keys, (v->n + 1) * sizeof *v->keys);
        if (!v->keys) abort();
        v->keys[v->n] = key;
    }
    v->items[v->n++] = item;
}

static JVal *jparse_val(JParser *jp) {
    jskip_ws(jp);
    if (jp->p >= jp->end) {
        jp->err = "unexpected end of input";
        return NULL;
    }
    char c = *jp->p;
    if (c == '"') {
        size_t len;
        char *s = jparse_str(jp, &len);
        if (!s) return NULL;
        JVal *v = jnew(J_STR);
        v->s = s;
        v->slen = len;
        return v;
    }
    if (c == '-' || isdigit((unsigned char)c)) return jparse_num(jp);
    if (jlit(jp, "true")) return jnew(J_TRUE);
    if (jlit(jp, "false")) return jnew(J_FALSE);
    if (jlit(jp, "null")) return jnew(J_NULL);
    if (c != '[' && c != '{') {
        jp->err = "unexpected character";
        return NULL;
    }
    if (++jp->depth > 64) {
        jp->err = "nested too deeply";
        return NULL;
    }
    int obj = c == '{';
    char close = obj ? '}' : ']';
    JVal *v = jnew(obj ? J_OBJ : J_ARR);
    jp->p++;
    jskip_ws(jp);
    if (jp->p < jp->end && *jp->p == close) {
        jp->p++;
        jp->depth--;
        return v;
    }
    while (1) {
        char *key = NULL;
        if (obj) {
            jskip_ws(jp);
            size_t klen;
            if (jp->p >= jp->end || *jp->p != '"') {
                jp->err = "expected a string key";
                goto fail;
            }
            key = jparse_str(jp, &klen);
            if (!key) goto fail;
            jskip_ws(jp);
            if (jp->p >= jp->end || *jp->p != ':') {
                free(key);
                jp->err = "expected ':'";
                goto fail;
            }
            jp->p++;
        }
        JVal *item = jparse_val(jp);
        if (!item) {
            free(key);
            goto fail;
        }
        jpush(v, key, item);
        jskip_ws(jp);
        if (jp->p < jp->end && *jp->p == ',') {
            jp->p++;
            continue;
        }
        if (jp->p < jp->end && *jp->p == close) {
            jp->p++;
            break;
        }
        jp->err = obj ? "expected ',' or '}'" : "expected ',' or ']'";
        goto fail;
    }
    jp->depth--;
    return v;
fail:
    jfree(v);
    return NULL;
}

/* Parse a whole document; NULL with *err set when it is not exactly one JSON value. */
static JVal *jparse(const char *data, size_t len, const char **err) {
    JParser jp = {data, data + len, NULL, 0};
    JVal *v = jparse_val(&jp);
    if (v) {
        jskip_ws(&jp);
        if (jp.p != jp.end) {
            jfree(v);
            v = NULL;
            jp.err = "extra data after the JSON value";
        }
    }
    *err = jp.err;
    return v;
}

/* The last value of `key` (Python's json keeps the last duplicate). */
static JVal *jget(const JVal *obj, const char *key) {
    if (!obj || obj->t != J_OBJ) return NULL;
    for (size_t k = obj->n; k-- > 0;)
        if (strcmp(obj->keys[k], key) == 0) return obj->items[k];
    return NULL;
}

/* Python truthiness of a JSON value (absent = falsy). */
static int jtruthy(const JVal *v) {
    if (!v) return 0;
    switch (v->t) {
    case J_NULL: case J_FALSE: return 0;
    case J_TRUE: return 1;
    case J_NUM: return v->d != 0 || (v->is_int && v->i != 0);
    case J_STR: return v->slen > 0;
    default: return v->n > 0;
    }
}

/* A string field; NULL if absent, not a string, or holding a NUL (not a valid path/name). */
static const char *jstr(const JVal *obj, const char *key) {
    JVal *v = jget(obj, key);
    return v && v->t == J_STR && strlen(v->s) == v->slen ? v->s : NULL;
}

/* Integer field: 1 and *out set when present as an integer (bools count, like Python). */
static int jint(const JVal *obj, const char *key, int64_t *out) {
    JVal *v = jget(obj, key);
    if (!v) return 0;
    if (v->t == J_NUM && v->is_int) *out = v->i;
    else if (v->t == J_NUM) *out = (int64_t)v->d;
    else if (v->t == J_TRUE || v->t == J_FALSE) *out = v->t == J_TRUE;
    else return 0;
    return 1;
}

/* JSON string escaping (ASCII out, like Python's ensure_ascii; bad UTF-8 -> U+FFFD). */
static void jesc(Buf *b, const char *s, size_t len) {
    static const char hexd[] = "0123456789abcdef";
    buf_addc(b, '"');
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            buf_addc(b, '\\');
            buf_addc(b, (char)c);
            p++;
            continue;
        }
        if (c >= 0x20 && c < 0x7F) {
            buf_addc(b, (char)c);
            p++;
            continue;
        }
        unsigned cp = 0xFFFD;
        int n = 1;
        if (c < 0x80) {
            cp = c;
        } else if ((c & 0xE0) == 0xC0 && end - p >= 2 && (p[1] & 0xC0) == 0x80) {
            cp = ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
            n = 2;
            if (cp < 0x80) cp = 0xFFFD;
        } else if ((c & 0xF0) == 0xE0 && end - p >= 3 && (p[1] & 0xC0) == 0x80 &&
                   (p[2] & 0xC0) == 0x80) {
            cp = ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
            n = 3;
            if (cp < 0x800) cp = 0xFFFD;
        } else if ((c & 0xF8) == 0xF0 && end - p >= 4 && (p[1] & 0xC0) == 0x80 &&
                   (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80) {
            cp = ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
                 (p[3] & 0x3Fu);
            n = 4;
            if (cp < 0x10000 || cp > 0x10FFFF) cp = 0xFFFD;
        }
        p += n;
        const char *short_esc = NULL;
        switch (cp) {
        case '\n': short_esc = "\\n"; break;
        case '\r': short_esc = "\\r"; break;
        case '\t': short_esc = "\\t"; break;
        case '\b': short_esc = "\\b"; break;
        case '\f': short_esc = "\\f"; break;
        }
        if (short_esc) {
            buf_adds(b, short_esc);
            continue;
        }
        unsigned units[2];
        int nu = 1;
        units[0] = cp;
        if (cp >= 0x10000) {
            units[0] = 0xD800 + ((cp - 0x10000) >> 10);
            units[1] = 0xDC00 + ((cp - 0x10000) & 0x3FF);
            nu = 2;
        }
        for (int k = 0; k < nu; k++) {
            char e[6] = {'\\', 'u', hexd[(units[k] >> 12) & 15], hexd[(units[k] >> 8) & 15],
                         hexd[(units[k] >> 4) & 15], hexd[units[k] & 15]};
            buf_add(b, e, 6);
        }
    }
    buf_addc(b, '"');
}

static void jdump(Buf *b, const JVal *v) {
    switch (v->t) {
    case J_NULL: buf_adds(b, "null"); break;
    case J_FALSE: buf_adds(b, "false"); break;
    case J_TRUE: buf_adds(b, "true"); break;
    case J_NUM:
        if (v->is_int) buf_printf(b, "%lld", (long long)v->i);
        else buf_printf(b, "%.17g", v->d);
        break;
    case J_STR: jesc(b, v->s, v->slen); break;
    case J_ARR: case J_OBJ:
        buf_addc(b, v->t == J_OBJ ? '{' : '[');
        for (size_t k = 0; k < v->n; k++) {
            if (k) buf_adds(b, ", ");
            if (v->t == J_OBJ) {
                jesc(b, v->keys[k], strlen(v->keys[k]));
                buf_adds(b, ": ");
            }
            jdump(b, v->items[k]);
        }
        buf_addc(b, v->t == J_OBJ ? '}' : ']');
        break;
    }
}

/* A tiny JSON object writer for replies: {"id": N, ...}. */
typedef struct {
    Buf b;
} JOut;

static void jo_begin(JOut *o, int64_t id) {
    memset(o, 0, sizeof *o);
    buf_printf(&o->b, "{\"id\": %lld", (long long)id);
}
static void jo_key(JOut *o, const char *k) {
    buf_adds(&o->b, ", ");
    jesc(&o->b, k, strlen(k));
    buf_adds(&o->b, ": ");
}
static void jo_int(JOut *o, const char *k, int64_t v) {
    jo_key(o, k);
    buf_printf(&o->b, "%lld", (long long)v);
}
static void jo_bool(JOut *o, const char *k, int v) {
    jo_key(o, k);
    buf_adds(&o->b, v ? "true" : "false");
}
static void jo_str(JOut *o, const char *k, const char *s) {
    jo_key(o, k);
    jesc(&o->b, s, strlen(s));
}

/* ------------------------------------------------------------------ small helpers */

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int e = errno;
    close(fd);
    errno = e;
    return w == (ssize_t)n ? 0 : -1;
}

static void set_nonblock(int fd, int on) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/* Python's str(OSError(errno, strerror, filename)). */
static void oserr_msg(Buf *b, int err, const char *path) {
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

static void jo_error(JOut *o, const char *type, const char *msg) {
    jo_key(o, "error");
    buf_adds(&o->b, "{\"type\": ");
    jesc(&o->b, type, strlen(type));
    buf_adds(&o->b, ", \"message\": ");
    jesc(&o->b, msg, strlen(msg));
    buf_addc(&o->b, '}');
}

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

/* ------------------------------------------------------------------ users */

typedef struct {
    uid_t uid;
    gid_t gid;
    gid_t groups[NGROUPS_MAX > 256 ? 256 : NGROUPS_MAX];
    size_t ngroups;
    char name[256];
    char home[PATH_MAX];
} User;

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
static int full_command_caps; /* configure "full_command_caps": trusted nested workloads */

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

static int port = -1;
static int connected;
static Buf out, inbuf;
static Exec *execs;
static Write *writes;
static Send *sends;
static volatile sig_atomic_t got_signal;
static int test_mode; /* --fd: on the host, so never touch host-wide state */
static int cgroups_ok;
static char spare_cg[160]; /* see make_spare() */ /* the guest's cgroup2 tree is set up (never in --fd test mode) */

static void flush_out(void);

static void on_signal(int sig) {
    (void)sig;
    got_signal = 1;
}

static void send_frame(int kind, int64_t stream, const void *data, size_t len) {
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
static void jo_send(JOut *o) {
    buf_addc(&o->b, '}');
    const char *p = buf_data(&o->b);
    int64_t id = strtoll(p + 7, NULL, 10); /* {"id": N */
    send_frame(T_JSON, id, p, buf_size(&o->b));
    buf_free(&o->b);
}

static void reply_ok(int64_t rid) {
    JOut o;
    jo_begin(&o, rid);
    jo_send(&o);
}

static void reply_error(int64_t rid, const char *type, const char *msg) {
    JOut o;
    jo_begin(&o, rid);
    jo_error(&o, type, msg);
    jo_send(&o);
}

static void reply_oserror(int64_t rid, int err, const char *path) {
    JOut o;
    jo_begin(&o, rid);
    jo_oserror(&o, err, path);
    jo_send(&o);
}

static Exec *find_exec(int64_t rid) {
    for (Exec *e = execs; e; e = e->next)
        if (e->rid == rid) return e;
    return NULL;
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Kill the whole tree: everything in the command's cgroup (setsid daemons too). */
static void exec_kill(Exec *e) {
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

static int exec_oom_killed(const Exec *e) {
    if (!e->cg[0]) return 0;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/memory.events", e->cg);
    FILE *f = fopen(p, "re");
    if (!f) return 0;
    char line[128];
    int oom = 0;
    while (fgets(line, sizeof line, f)) {
        long long v;
        if (sscanf(line, "oom_kill %lld", &v) == 1 && v > 0) oom = 1;
    }
    fclose(f);
    return oom;
}

/* pids.events "max" of the exec's cgroup: forks that failed at the pids limit (the guest
 * kernel counts them in the forking task's cgroup). */
static int exec_pids_max_hit(const Exec *e) {
    if (!e->cg[0]) return 0;
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/pids.events", e->cg);
    FILE *f = fopen(p, "re");
    if (!f) return 0;
    char line[128];
    int hit = 0;
    while (fgets(line, sizeof line, f)) {
        long long v;
        if (sscanf(line, "max %lld", &v) == 1 && v > 0) hit = 1;
    }
    fclose(f);
    return hit;
}

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

static void flush_stdin(Exec *e) {
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

static void feed_stdin(Exec *e, const void *data, size_t len, int eof) {
    if (e->in_fd < 0) return;
    if (eof) e->stdin_eof = 1;
    else buf_add(&e->stdin_buf, data, len);
    flush_stdin(e);
}

/* Read what is there from a command's stdout/stderr; 0 at EOF (or error), 1 otherwise,
 * 2 when nothing was available. */
static int on_output(Exec *e, int fd, int kind) {
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

/* ------------------------------------------------------------------ warm set
 *
 * Memory snapshots are taken after dropping the guest's caches (a smaller image), but then
 * the first command after a restore reads the dynamic loader, libc and its own binary back
 * from the virtual disk, which under TCG costs more than the command itself. So quiesce
 * keeps the pages of those files that were cached (mincore) and drops everything else. */

#define NWARM 16
static char warm_paths[NWARM][PATH_MAX];
static int warm_next;
static const char *const warm_fixed[] = {
    "/etc/ld.so.cache", "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6",
    "/lib/ld-musl-x86_64.so.1", "/bin/sh",
};

/* Remember an executable that ran (a ring of the last NWARM distinct ones). */
static void warm_note(const char *path) {
    if (!*path || strlen(path) >= PATH_MAX) return;
    for (int k = 0; k < NWARM; k++)
        if (strcmp(warm_paths[k], path) == 0) return;
    snprintf(warm_paths[warm_next], PATH_MAX, "%s", path);
    warm_next = (warm_next + 1) % NWARM;
}

typedef struct {
    int fd;
    size_t pages;
    unsigned char *vec;
} Warm;

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

/* Start a command or tool. On success the Exec is linked into `execs`. */
static Exec *exec_start(int64_t rid, int kind, char *const *argv, char *const *envp,
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
static int spare_failed; /* no idle retries until the next exec ends */

static void make_spare(void) {
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

/* A tool finished: its T_EOF and reply, or the error it printed as its last stderr line. */
static void finish_tool(Exec *e) {
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

/* ------------------------------------------------------------ private (verifier) execs
 * An exec with "private": {"fresh": [dirs], "files": [[path, mode, base64]], "collect": dir,
 * "kill_others": bool}. PID 1 steps into a new mount namespace (/ rprivate, a fresh tmpfs on
 * each dir, the files written), spawns the command there, keeps an fd of the collect dir and
 * steps back; when the command ends, the collect dir's regular files go to the host as
 * T_DATA frames of the exec's stream (u32 LE mode, u32 LE full size, relative path NUL,
 * data), before the exit reply. Nothing outside that namespace sees those dirs. */
#define COLLECT_MAX (64u << 20)
#define COLLECT_FILE_MAX (MAX_FRAME - 4096)
static int b64val(int c);

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
static void check_exec(Exec *e) {
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

static void reap(void) {
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

static void close_write(Write *w, int unlink_tmp) {
    if (w->fd >= 0) close(w->fd);
    if (unlink_tmp && w->tmp[0]) unlink(w->tmp);
    Write **pp = &writes;
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) *pp = w->next;
    free(w);
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

/* ------------------------------------------------------------------ requests */

static int have_python(void) { return access(PYTHON, X_OK) == 0; }

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

static void op_exec(int64_t rid, const JVal *req) {
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

static void op_kill(int64_t rid, const JVal *req) {
    int64_t target;
    if (!jint(req, "target", &target)) {
        reply_error(rid, "agent", "kill needs a target");
        return;
    }
    Exec *e = find_exec(target);
    if (e) exec_kill(e);
    reply_ok(rid);
}

static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
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

static void op_stat(int64_t rid, const JVal *req) {
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

static void op_read_file(int64_t rid, const JVal *req) {
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

static void op_write_file(int64_t rid, const JVal *req) {
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

static void finish_write(Write *w) {
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
static void op_tool(int64_t rid, const char *op, const JVal *req, int kind) {
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

static void flush_out(void) {
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

static void setup_cgroups(void) {
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
