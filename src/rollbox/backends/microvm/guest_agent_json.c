/* rbx-agent, JSON unit: growable byte buffers, the JSON parser (JVal trees) and the
 * JSON writer (JOut) the replies are built with. See guest_agent.h. */

#include "guest_agent.h"

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

void buf_add(Buf *b, const void *data, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

void buf_addc(Buf *b, char c) { buf_add(b, &c, 1); }
void buf_adds(Buf *b, const char *s) { buf_add(b, s, strlen(s)); }
size_t buf_size(const Buf *b) { return b->len - b->off; }
char *buf_data(const Buf *b) { return b->p + b->off; }

void buf_consume(Buf *b, size_t n) {
    b->off += n;
    if (b->off >= b->len) b->off = b->len = 0;
}

void buf_free(Buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void buf_printf(Buf *b, const char *fmt, ...) {
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

void jfree(JVal *v) {
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
JVal *jparse(const char *data, size_t len, const char **err) {
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
JVal *jget(const JVal *obj, const char *key) {
    if (!obj || obj->t != J_OBJ) return NULL;
    for (size_t k = obj->n; k-- > 0;)
        if (strcmp(obj->keys[k], key) == 0) return obj->items[k];
    return NULL;
}

/* Python truthiness of a JSON value (absent = falsy). */
int jtruthy(const JVal *v) {
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
const char *jstr(const JVal *obj, const char *key) {
    JVal *v = jget(obj, key);
    return v && v->t == J_STR && strlen(v->s) == v->slen ? v->s : NULL;
}

/* Integer field: 1 and *out set when present as an integer (bools count, like Python). */
int jint(const JVal *obj, const char *key, int64_t *out) {
    JVal *v = jget(obj, key);
    if (!v) return 0;
    if (v->t == J_NUM && v->is_int) *out = v->i;
    else if (v->t == J_NUM) *out = (int64_t)v->d;
    else if (v->t == J_TRUE || v->t == J_FALSE) *out = v->t == J_TRUE;
    else return 0;
    return 1;
}

/* JSON string escaping (ASCII out, like Python's ensure_ascii; bad UTF-8 -> U+FFFD). */
void jesc(Buf *b, const char *s, size_t len) {
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

void jdump(Buf *b, const JVal *v) {
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

void jo_begin(JOut *o, int64_t id) {
    memset(o, 0, sizeof *o);
    buf_printf(&o->b, "{\"id\": %lld", (long long)id);
}
void jo_key(JOut *o, const char *k) {
    buf_adds(&o->b, ", ");
    jesc(&o->b, k, strlen(k));
    buf_adds(&o->b, ": ");
}
void jo_int(JOut *o, const char *k, int64_t v) {
    jo_key(o, k);
    buf_printf(&o->b, "%lld", (long long)v);
}
void jo_bool(JOut *o, const char *k, int v) {
    jo_key(o, k);
    buf_adds(&o->b, v ? "true" : "false");
}
void jo_str(JOut *o, const char *k, const char *s) {
    jo_key(o, k);
    jesc(&o->b, s, strlen(s));
}
