/* The definitions of tally_json.h: the text writer, the arena, UTF-8 and
 * JSON that Tally's two C SDKs share. Compiled as part of tally.c and of
 * tally_periods.c, which #include it after defining
 * TALLY_JSON_IMPLEMENTATION (so a plugin's build, native or wasm, names
 * just one SDK source); compiled on its own it is empty. Uses only malloc,
 * realloc, free and the mem* functions of libc, so the component imports
 * no WASI at all.
 *
 * Besides tally_json.h's functions it gives the file that includes it:
 * TRAP(), checked_realloc, checked_array, is_utf8 and arena_release. */
#ifndef TALLY_JSON_IMPLEMENTATION
/* ISO C wants a translation unit to declare something. */
typedef int tally_json_is_compiled_within_tally_c_or_tally_periods_c;
#else

#include "tally_json.h"

#include <stdlib.h>
#include <string.h>

/* An allocation failure, a broken invariant or a corrupt state is a bug:
 * trap (the host then dead-letters the event to blame, or fails the call
 * and says so). */
#define TRAP() __builtin_trap()

static void *checked_realloc(void *ptr, size_t size) {
    void *grown = realloc(ptr, size ? size : 1);
    if (!grown) TRAP();
    return grown;
}

/* `count` items of `size` bytes, the product checked before allocating. */
static void *checked_array(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) TRAP();
    return checked_realloc(NULL, count * size);
}

/* ---- Text ---------------------------------------------------------------- */

static void text_reserve(tally_text *text, size_t more) {
    if (more > SIZE_MAX - text->len) TRAP();
    if (text->len + more <= text->cap) return;
    size_t cap = text->cap ? text->cap : 64;
    while (cap < text->len + more) cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    text->bytes = checked_realloc(text->bytes, cap);
    text->cap = cap;
}

void tally_text_bytes(tally_text *text, const void *bytes, size_t len) {
    if (len == 0) return;
    text_reserve(text, len);
    memcpy(text->bytes + text->len, bytes, len);
    text->len += len;
}

void tally_text_str(tally_text *text, const char *str) { tally_text_bytes(text, str, strlen(str)); }

void tally_text_u64(tally_text *text, uint64_t value) {
    char digits[20];
    size_t n = 0;
    do {
        digits[sizeof digits - ++n] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    tally_text_bytes(text, digits + sizeof digits - n, n);
}

void tally_text_i64(tally_text *text, int64_t value) {
    if (value < 0) {
        tally_text_bytes(text, "-", 1);
        tally_text_u64(text, (uint64_t)0 - (uint64_t)value);
    } else {
        tally_text_u64(text, (uint64_t)value);
    }
}

void tally_text_json_string(tally_text *text, const uint8_t *utf8, size_t len) {
    static const char hex[] = "0123456789abcdef";
    if (len > SIZE_MAX - 2) TRAP();
    text_reserve(text, len + 2);
    tally_text_bytes(text, "\"", 1);
    size_t plain = 0; /* start of the run of bytes written as they are */
    for (size_t i = 0; i < len; i++) {
        uint8_t c = utf8[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        const char *escape = NULL;
        char unicode[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        switch (c) {
            case '"': escape = "\\\""; break;
            case '\\': escape = "\\\\"; break;
            case '\b': escape = "\\b"; break;
            case '\f': escape = "\\f"; break;
            case '\n': escape = "\\n"; break;
            case '\r': escape = "\\r"; break;
            case '\t': escape = "\\t"; break;
            default: break;
        }
        tally_text_bytes(text, utf8 + plain, i - plain);
        if (escape) tally_text_str(text, escape);
        else tally_text_bytes(text, unicode, sizeof unicode);
        plain = i + 1;
    }
    tally_text_bytes(text, utf8 + plain, len - plain);
    tally_text_bytes(text, "\"", 1);
}

bool tally_reject(tally_text *why, const char *reason) {
    why->len = 0;
    tally_text_str(why, reason);
    return false;
}

void tally_text_free(tally_text *text) {
    free(text->bytes);
    *text = (tally_text){0};
}

/* ---- The arena, emptied when the batch or the export call ends --------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, size;
    _Alignas(8) uint8_t bytes[];
} chunk;

enum { CHUNK_SIZE = 60000 };

static chunk *arena;

void *tally_alloc(size_t size) {
    if (size > SIZE_MAX - sizeof(chunk) - 8) TRAP();
    size = (size + 7) & ~(size_t)7;
    if (!arena || arena->size - arena->used < size) {
        size_t chunk_size = size > CHUNK_SIZE ? size : CHUNK_SIZE;
        chunk *fresh = checked_realloc(NULL, sizeof(chunk) + chunk_size);
        fresh->next = arena;
        fresh->used = 0;
        fresh->size = chunk_size;
        arena = fresh;
    }
    void *out = arena->bytes + arena->used;
    arena->used += size;
    memset(out, 0, size);
    return out;
}

/* Empties the arena: frees its blocks, but with `keep_one` keeps one
 * ordinary chunk for the next call (or event), so a call of many small
 * events allocates no chunk per event. */
static void arena_release(bool keep_one) {
    chunk *kept = NULL;
    while (arena) {
        chunk *next = arena->next;
        if (keep_one && !kept && arena->size == CHUNK_SIZE) {
            kept = arena;
            kept->used = 0;
            kept->next = NULL;
        } else {
            free(arena);
        }
        arena = next;
    }
    arena = kept;
}

/* ---- UTF-8 ----------------------------------------------------------------- */

/* Whether `bytes` is UTF-8 as Rust's str::from_utf8 reads it: shortest
 * forms only, no surrogates, nothing past U+10FFFF. */
static bool is_utf8(const uint8_t *bytes, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = bytes[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint8_t low = 0x80, high = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) n = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            if (c == 0xe0) low = 0xa0;
            if (c == 0xed) high = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            if (c == 0xf0) low = 0x90;
            if (c == 0xf4) high = 0x8f;
        } else return false;
        if (len - i - 1 < n) return false;
        if (bytes[i + 1] < low || bytes[i + 1] > high) return false;
        for (size_t k = 2; k <= n; k++)
            if ((bytes[i + k] & 0xc0) != 0x80) return false;
        i += n + 1;
    }
    return true;
}

/* ---- JSON ------------------------------------------------------------------ */

typedef struct parser {
    const uint8_t *at, *end;
    int flags;
    tally_text scratch; /* a string being unescaped */
    /* Items (and an object's names) of the containers being read, the
     * innermost last: one buffer for the whole record. */
    tally_json *items, *names;
    size_t top, cap;
} parser;

static void skip_space(parser *p) {
    while (p->at < p->end && (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r')) p->at++;
}

static bool literal(parser *p, const char *word, size_t n) {
    if ((size_t)(p->end - p->at) < n || memcmp(p->at, word, n) != 0) return false;
    p->at += n;
    return true;
}

static bool digits(parser *p) {
    const uint8_t *start = p->at;
    while (p->at < p->end && *p->at >= '0' && *p->at <= '9') p->at++;
    return p->at > start;
}

static bool parse_number(parser *p, tally_json *out) {
    const uint8_t *start = p->at;
    if (p->at < p->end && *p->at == '-') p->at++;
    if (p->at < p->end && *p->at == '0') p->at++;
    else if (!(p->at < p->end && *p->at >= '1' && *p->at <= '9') || !digits(p)) return false;
    if (p->at < p->end && *p->at == '.') {
        p->at++;
        if (!digits(p)) return false;
    }
    if (p->at < p->end && (*p->at == 'e' || *p->at == 'E')) {
        p->at++;
        if (p->at < p->end && (*p->at == '+' || *p->at == '-')) p->at++;
        if (!digits(p)) return false;
    }
    out->kind = TALLY_JSON_NUMBER;
    out->text = start;
    out->len = (size_t)(p->at - start);
    return true;
}

static int hex_digit(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(parser *p, uint32_t *out) {
    if (p->end - p->at < 4) return false;
    uint32_t value = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(p->at[i]);
        if (d < 0) return false;
        value = value * 16 + (uint32_t)d;
    }
    p->at += 4;
    *out = value;
    return true;
}

static void put_code_point(tally_text *text, uint32_t c) {
    uint8_t bytes[4];
    size_t n;
    if (c < 0x80) bytes[0] = (uint8_t)c, n = 1;
    else if (c < 0x800) bytes[0] = (uint8_t)(0xc0 | c >> 6), bytes[1] = (uint8_t)(0x80 | (c & 0x3f)), n = 2;
    else if (c < 0x10000)
        bytes[0] = (uint8_t)(0xe0 | c >> 12), bytes[1] = (uint8_t)(0x80 | (c >> 6 & 0x3f)), bytes[2] = (uint8_t)(0x80 | (c & 0x3f)), n = 3;
    else
        bytes[0] = (uint8_t)(0xf0 | c >> 18), bytes[1] = (uint8_t)(0x80 | (c >> 12 & 0x3f)),
        bytes[2] = (uint8_t)(0x80 | (c >> 6 & 0x3f)), bytes[3] = (uint8_t)(0x80 | (c & 0x3f)), n = 4;
    tally_text_bytes(text, bytes, n);
}

/* A string, `p->at` past its opening quote. */
static bool parse_string(parser *p, tally_json *out) {
    const uint8_t *start = p->at;
    while (p->at < p->end && *p->at != '"' && *p->at != '\\' && *p->at >= 0x20) p->at++;
    out->kind = TALLY_JSON_STRING;
    if (p->at < p->end && *p->at == '"') { /* no escapes: point into the record */
        out->text = start;
        out->len = (size_t)(p->at++ - start);
        return true;
    }
    tally_text *s = &p->scratch;
    s->len = 0;
    tally_text_bytes(s, start, (size_t)(p->at - start));
    for (;;) {
        if (p->at >= p->end || *p->at < 0x20) return false;
        uint8_t c = *p->at++;
        if (c == '"') break;
        if (c != '\\') {
            tally_text_bytes(s, &c, 1);
            continue;
        }
        if (p->at >= p->end) return false;
        uint8_t e = *p->at++;
        uint8_t plain = 0;
        switch (e) {
            case '"': plain = '"'; break;
            case '\\': plain = '\\'; break;
            case '/': plain = '/'; break;
            case 'b': plain = '\b'; break;
            case 'f': plain = '\f'; break;
            case 'n': plain = '\n'; break;
            case 'r': plain = '\r'; break;
            case 't': plain = '\t'; break;
            case 'u': {
                uint32_t unit;
                if (!hex4(p, &unit)) return false;
                if (unit >= 0xd800 && unit <= 0xdbff && p->end - p->at >= 6 && p->at[0] == '\\' && p->at[1] == 'u') {
                    const uint8_t *back = p->at;
                    uint32_t low;
                    p->at += 2;
                    if (!hex4(p, &low)) return false;
                    if (low >= 0xdc00 && low <= 0xdfff) {
                        put_code_point(s, 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00));
                        continue;
                    }
                    p->at = back; /* a lone high surrogate, then another escape */
                }
                if (unit >= 0xd800 && unit <= 0xdfff) {
                    if (!(p->flags & TALLY_JSON_LONE_SURROGATES)) return false;
                    out->lone_surrogate = true;
                }
                put_code_point(s, unit);
                continue;
            }
            default: return false;
        }
        tally_text_bytes(s, &plain, 1);
    }
    uint8_t *copy = tally_alloc(s->len);
    if (s->len) memcpy(copy, s->bytes, s->len);
    out->text = copy;
    out->len = s->len;
    return true;
}

static void push(parser *p, const tally_json *item, const tally_json *name) {
    if (p->top == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 32;
        if (cap > SIZE_MAX / sizeof(tally_json)) TRAP();
        p->items = checked_realloc(p->items, cap * sizeof(tally_json));
        p->names = checked_realloc(p->names, cap * sizeof(tally_json));
        p->cap = cap;
    }
    p->items[p->top] = *item;
    if (name) p->names[p->top] = *name;
    p->top++;
}

static bool parse_value(parser *p, tally_json *out, int depth);

static bool parse_container(parser *p, tally_json *out, int depth, bool object) {
    if (depth > TALLY_JSON_MAX_DEPTH) return false;
    out->kind = object ? TALLY_JSON_OBJECT : TALLY_JSON_ARRAY;
    size_t base = p->top;
    uint8_t close = object ? '}' : ']';
    skip_space(p);
    if (p->at < p->end && *p->at == close) {
        p->at++;
        return true;
    }
    for (;;) {
        tally_json name = {0}, item = {0};
        if (object) {
            skip_space(p);
            if (!(p->at < p->end && *p->at == '"')) return false;
            name.raw = p->at++;
            if (!parse_string(p, &name)) return false;
            name.raw_len = (size_t)(p->at - name.raw);
            skip_space(p);
            if (!(p->at < p->end && *p->at == ':')) return false;
            p->at++;
        }
        if (!parse_value(p, &item, depth)) return false;
        push(p, &item, object ? &name : NULL);
        skip_space(p);
        if (p->at < p->end && *p->at == ',') {
            p->at++;
            continue;
        }
        if (!(p->at < p->end && *p->at == close)) return false;
        p->at++;
        break;
    }
    size_t count = p->top - base;
    out->count = count;
    out->items = tally_alloc(count * sizeof(tally_json));
    memcpy(out->items, p->items + base, count * sizeof(tally_json));
    if (object) {
        out->names = tally_alloc(count * sizeof(tally_json));
        memcpy(out->names, p->names + base, count * sizeof(tally_json));
    }
    p->top = base;
    return true;
}

static bool parse_value(parser *p, tally_json *out, int depth) {
    skip_space(p);
    if (p->at >= p->end) return false;
    const uint8_t *start = p->at;
    bool ok;
    switch (*p->at) {
        case '{': p->at++; ok = parse_container(p, out, depth + 1, true); break;
        case '[': p->at++; ok = parse_container(p, out, depth + 1, false); break;
        case '"': p->at++; ok = parse_string(p, out); break;
        case 't': out->kind = TALLY_JSON_TRUE; ok = literal(p, "true", 4); break;
        case 'f': out->kind = TALLY_JSON_FALSE; ok = literal(p, "false", 5); break;
        case 'n': out->kind = TALLY_JSON_NULL; ok = literal(p, "null", 4); break;
        default: ok = parse_number(p, out); break;
    }
    out->raw = start;
    out->raw_len = (size_t)(p->at - start);
    return ok;
}

bool tally_json_decode(const uint8_t *bytes, size_t len, int flags, tally_json *out, tally_text *why) {
    *out = (tally_json){0};
    if (!is_utf8(bytes, len)) return tally_reject(why, "event is not UTF-8");
    parser p = {.at = bytes, .end = bytes + len, .flags = flags};
    bool ok = parse_value(&p, out, 0);
    skip_space(&p);
    tally_text_free(&p.scratch);
    free(p.items);
    free(p.names);
    if (!ok || p.at != p.end) {
        *out = (tally_json){0};
        return tally_reject(why, "event is not valid JSON");
    }
    return true;
}

bool tally_json_string_eq(const tally_json *string, const uint8_t *bytes, size_t len) {
    return tally_json_is_string(string) && string->len == len && (len == 0 || memcmp(string->text, bytes, len) == 0);
}

bool tally_json_string_is(const tally_json *string, const char *text) {
    return tally_json_string_eq(string, (const uint8_t *)text, strlen(text));
}

const tally_json *tally_json_get(const tally_json *object, const char *name) {
    if (!object || object->kind != TALLY_JSON_OBJECT) return NULL;
    size_t n = strlen(name);
    for (size_t i = object->count; i-- > 0;)
        if (tally_json_string_eq(&object->names[i], (const uint8_t *)name, n)) return &object->items[i];
    return NULL;
}

size_t tally_json_count(const tally_json *object, const char *name) {
    size_t n = 0, len = strlen(name);
    if (object && object->kind == TALLY_JSON_OBJECT)
        for (size_t i = 0; i < object->count; i++) n += tally_json_string_eq(&object->names[i], (const uint8_t *)name, len);
    return n;
}

bool tally_json_is_string(const tally_json *value) { return value && value->kind == TALLY_JSON_STRING; }

bool tally_json_is_text(const tally_json *value) { return tally_json_is_string(value) && !value->lone_surrogate; }

bool tally_json_is_number(const tally_json *value) { return value && value->kind == TALLY_JSON_NUMBER; }

bool tally_json_u64(const tally_json *number, uint64_t *out) {
    if (!tally_json_is_number(number) || number->len == 0 || number->len > 20) return false;
    uint64_t value = 0;
    for (size_t i = 0; i < number->len; i++) {
        uint8_t c = number->text[i];
        if (c < '0' || c > '9') return false;
        uint64_t digit = c - '0';
        if (value > (UINT64_MAX - digit) / 10) return false;
        value = value * 10 + digit;
    }
    *out = value;
    return true;
}

bool tally_json_i64(const tally_json *number, int64_t *out) {
    if (!tally_json_is_number(number)) return false;
    bool negative = number->len > 0 && number->text[0] == '-';
    tally_json magnitude = *number;
    if (negative) magnitude.text++, magnitude.len--;
    uint64_t value;
    if (!tally_json_u64(&magnitude, &value)) return false;
    if (negative ? value > (uint64_t)INT64_MAX + 1 : value > (uint64_t)INT64_MAX) return false;
    *out = negative ? (int64_t)(0 - value) : (int64_t)value;
    return true;
}

/* 2^1024 - 2^970: the least number that rounds to infinity as a double. */
static const char DOUBLE_OVERFLOW[] =
    "17976931348623158079372897140530341507993413271003782693617377898044496829276475094664901797758720709633028641"
    "66928879109465555478519404026306574886715058206819089020007083836762738548458177115317644757302700698555713669"
    "59622842914819860834936475292719074168444365510704342711559699508093042880177904174497792";

bool tally_json_finite(const tally_json *number) {
    if (!tally_json_is_number(number)) return false;
    const uint8_t *at = number->text, *end = at + number->len;
    if (at < end && *at == '-') at++;
    /* The significant digits, and the power of ten of the first one. */
    char significant[sizeof DOUBLE_OVERFLOW];
    size_t kept = 0;
    int64_t power = -1; /* of the first significant digit */
    bool seen = false, fraction = false;
    int64_t integer_digits = 0, leading_fraction_zeros = 0;
    for (; at < end && *at != 'e' && *at != 'E'; at++) {
        if (*at == '.') {
            fraction = true;
            continue;
        }
        if (!seen && *at == '0') {
            if (fraction && leading_fraction_zeros < INT32_MAX) leading_fraction_zeros++;
            continue;
        }
        if (!seen) {
            seen = true;
            power = fraction ? -leading_fraction_zeros - 1 : 0;
        }
        if (!fraction && integer_digits < INT32_MAX) integer_digits++;
        if (kept < sizeof significant - 1) significant[kept++] = (char)*at;
    }
    if (!seen) return true; /* zero */
    if (!fraction || integer_digits) power = integer_digits - 1;
    int64_t exponent = 0;
    bool negative = false;
    if (at < end) {
        at++;
        if (at < end && (*at == '+' || *at == '-')) negative = *at++ == '-';
        for (; at < end; at++)
            if (exponent < 100000) exponent = exponent * 10 + (*at - '0');
    }
    power += negative ? -exponent : exponent;
    if (power != 308) return power < 308;
    significant[kept] = 0;
    for (size_t i = 0; i < sizeof DOUBLE_OVERFLOW - 1; i++) {
        char digit = i < kept ? significant[i] : '0';
        if (digit != DOUBLE_OVERFLOW[i]) return digit < DOUBLE_OVERFLOW[i];
    }
    return false; /* equal: rounds (to even) to infinity */
}

#endif
