/* Tally's C SDK: see tally.h. Uses only malloc, free and the mem*
 * functions of libc, so a plugin built on it imports no WASI at all. */
#include "tally.h"

#include <stdlib.h>
#include <string.h>

/* An allocation failure, a broken invariant or a corrupt state is a bug:
 * trap, and the host dead-letters the event to blame. */
#define TRAP() __builtin_trap()

static void *checked_realloc(void *ptr, size_t size) {
    void *grown = realloc(ptr, size ? size : 1);
    if (!grown) TRAP();
    return grown;
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
    text_reserve(text, len + 2);
    tally_text_bytes(text, "\"", 1);
    size_t plain = 0; /* start of the run of bytes written as they are */
    for (size_t i = 0; i < len; i++) {
        uint8_t c = utf8[i];
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
            default:
                if (c >= 0x20) continue;
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

/* ---- The batch's arena --------------------------------------------------- */

typedef struct chunk {
    struct chunk *next;
    size_t used, size;
    _Alignas(8) uint8_t bytes[];
} chunk;

static chunk *arena;

void *tally_alloc(size_t size) {
    if (size > SIZE_MAX - 64) TRAP();
    size = (size + 7) & ~(size_t)7;
    if (!arena || arena->size - arena->used < size) {
        size_t chunk_size = size > 60000 ? size : 60000;
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

static void arena_reset(void) {
    while (arena) {
        chunk *next = arena->next;
        free(arena);
        arena = next;
    }
}

/* ---- UTF-8 --------------------------------------------------------------- */

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

/* ---- JSON ---------------------------------------------------------------- */

typedef struct parser {
    const uint8_t *at, *end;
    int flags;
    tally_text scratch; /* a string being unescaped */
} parser;

static void skip_space(parser *p) {
    while (p->at < p->end && (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r')) p->at++;
}

static bool literal(parser *p, const char *word) {
    size_t n = strlen(word);
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

/* Items (or members) gathered while an array or object is read. */
typedef struct gathered {
    tally_json *items, *names;
    size_t count, cap;
} gathered;

static void gather(gathered *g, const tally_json *item, const tally_json *name) {
    if (g->count == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 8;
        g->items = checked_realloc(g->items, g->cap * sizeof(tally_json));
        if (name) g->names = checked_realloc(g->names, g->cap * sizeof(tally_json));
    }
    g->items[g->count] = *item;
    if (name) g->names[g->count] = *name;
    g->count++;
}

static tally_json *settle(tally_json *gathered_items, size_t count) {
    if (!count) return NULL;
    tally_json *copy = tally_alloc(count * sizeof(tally_json));
    memcpy(copy, gathered_items, count * sizeof(tally_json));
    return copy;
}

static bool parse_value(parser *p, tally_json *out, int depth);

static bool parse_container(parser *p, tally_json *out, int depth, bool object) {
    if (depth > TALLY_JSON_MAX_DEPTH) return false;
    out->kind = object ? TALLY_JSON_OBJECT : TALLY_JSON_ARRAY;
    gathered g = {0};
    bool ok = false;
    uint8_t close = object ? '}' : ']';
    skip_space(p);
    if (p->at < p->end && *p->at == close) {
        p->at++;
        ok = true;
    } else {
        for (;;) {
            tally_json name = {0}, item = {0};
            if (object) {
                skip_space(p);
                if (!(p->at < p->end && *p->at == '"')) break;
                p->at++;
                if (!parse_string(p, &name)) break;
                skip_space(p);
                if (!(p->at < p->end && *p->at == ':')) break;
                p->at++;
            }
            if (!parse_value(p, &item, depth)) break;
            gather(&g, &item, object ? &name : NULL);
            skip_space(p);
            if (p->at < p->end && *p->at == ',') {
                p->at++;
                continue;
            }
            if (p->at < p->end && *p->at == close) {
                p->at++;
                ok = true;
            }
            break;
        }
    }
    if (ok) {
        out->count = g.count;
        out->items = settle(g.items, g.count);
        out->names = object ? settle(g.names, g.count) : NULL;
    }
    free(g.items);
    free(g.names);
    return ok;
}

static bool parse_value(parser *p, tally_json *out, int depth) {
    skip_space(p);
    if (p->at >= p->end) return false;
    switch (*p->at) {
        case '{': p->at++; return parse_container(p, out, depth + 1, true);
        case '[': p->at++; return parse_container(p, out, depth + 1, false);
        case '"': p->at++; return parse_string(p, out);
        case 't': out->kind = TALLY_JSON_TRUE; return literal(p, "true");
        case 'f': out->kind = TALLY_JSON_FALSE; return literal(p, "false");
        case 'n': out->kind = TALLY_JSON_NULL; return literal(p, "null");
        default: return parse_number(p, out);
    }
}

bool tally_json_decode(const uint8_t *bytes, size_t len, int flags, tally_json *out, tally_text *why) {
    *out = (tally_json){0};
    if (!is_utf8(bytes, len)) return tally_reject(why, "event is not UTF-8");
    parser p = {.at = bytes, .end = bytes + len, .flags = flags};
    bool ok = parse_value(&p, out, 0);
    skip_space(&p);
    tally_text_free(&p.scratch);
    if (!ok || p.at != p.end) {
        *out = (tally_json){0};
        return tally_reject(why, "event is not valid JSON");
    }
    return true;
}

bool tally_json_string_is(const tally_json *string, const char *text) {
    size_t n = strlen(text);
    return tally_json_is_string(string) && string->len == n && memcmp(string->text, text, n) == 0;
}

const tally_json *tally_json_get(const tally_json *object, const char *name) {
    if (!object || object->kind != TALLY_JSON_OBJECT) return NULL;
    for (size_t i = object->count; i-- > 0;)
        if (tally_json_string_is(&object->names[i], name)) return &object->items[i];
    return NULL;
}

size_t tally_json_count(const tally_json *object, const char *name) {
    size_t n = 0;
    if (object && object->kind == TALLY_JSON_OBJECT)
        for (size_t i = 0; i < object->count; i++) n += tally_json_string_is(&object->names[i], name);
    return n;
}

bool tally_json_is_string(const tally_json *value) { return value && value->kind == TALLY_JSON_STRING; }

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
            if (fraction) leading_fraction_zeros++;
            continue;
        }
        if (!seen) {
            seen = true;
            power = fraction ? -leading_fraction_zeros - 1 : 0;
        }
        if (!fraction) integer_digits++;
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

/* ---- Logging -------------------------------------------------------------- */

void tally_log(tally_plugin_types_level_t level, const char *message) {
    plugin_string_t text = {(uint8_t *)message, strlen(message)};
    tally_plugin_log_log(level, &text);
}

/* ---- The aggregation ------------------------------------------------------ */

typedef struct slot {
    uint8_t *key;
    size_t key_len;
    void *state;
    bool dirty;
} slot;

typedef struct accepted {
    uint32_t index, slot;
    void *event;
} accepted;

static uint64_t hash_bytes(const uint8_t *bytes, size_t len) {
    uint64_t hash = 0xcbf29ce484222325u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) hash = (hash ^ bytes[i]) * 0x100000001b3u;
    return hash;
}

static exports_tally_plugin_aggregator_rejection_t rejection(uint32_t index, const tally_text *why) {
    exports_tally_plugin_aggregator_rejection_t out = {index, {NULL, why->len}};
    if (why->len) {
        out.reason.ptr = checked_realloc(NULL, why->len);
        memcpy(out.reason.ptr, why->bytes, why->len);
    }
    return out;
}

static uint8_t *copy_out(const tally_text *text) {
    uint8_t *copy = checked_realloc(NULL, text->len);
    if (text->len) memcpy(copy, text->bytes, text->len);
    return copy;
}

/* Frees a buffer the host handed over. The canonical ABI allocates nothing
 * for an empty one: its pointer is not malloc's (cabi_realloc returns the
 * alignment), so it must not be freed. */
static void free_received(void *ptr, size_t len) {
    if (len) free(ptr);
}

void tally_free_events(exports_tally_plugin_aggregator_list_event_t *events) {
    for (size_t i = 0; i < events->len; i++) {
        free_received(events->ptr[i].value.ptr, events->ptr[i].value.len);
        if (events->ptr[i].key.is_some) free_received(events->ptr[i].key.val.ptr, events->ptr[i].key.val.len);
    }
    free_received(events->ptr, events->len);
    events->ptr = NULL;
    events->len = 0;
}

void tally_process(const tally_aggregate *spec, exports_tally_plugin_aggregator_list_event_t *events,
                   exports_tally_plugin_aggregator_list_rejection_t *ret) {
    size_t n = events->len;
    exports_tally_plugin_aggregator_rejection_t *rejections = checked_realloc(NULL, n * sizeof *rejections);
    size_t rejected = 0;
    accepted *taken = checked_realloc(NULL, n * sizeof *taken);
    size_t accepted_count = 0;
    slot *slots = checked_realloc(NULL, n * sizeof *slots);
    size_t slot_count = 0;
    size_t table_size = 16;
    while (table_size < 2 * n) table_size *= 2;
    uint32_t *table = checked_realloc(NULL, table_size * sizeof *table); /* slot + 1, 0 when empty */
    memset(table, 0, table_size * sizeof *table);
    tally_text why = {0}, key = {0}, out = {0};

    for (size_t i = 0; i < n; i++) {
        void *event = tally_alloc(spec->event_size);
        key.len = 0;
        why.len = 0;
        const plugin_list_u8_t *value = &events->ptr[i].value;
        if (!spec->decode(value->ptr, value->len, event, &why) || !spec->key(event, &key, &why)) {
            rejections[rejected++] = rejection((uint32_t)i, &why);
            continue;
        }
        size_t at = (size_t)hash_bytes(key.bytes, key.len) & (table_size - 1);
        while (table[at] && !(slots[table[at] - 1].key_len == key.len && memcmp(slots[table[at] - 1].key, key.bytes, key.len) == 0))
            at = (at + 1) & (table_size - 1);
        if (!table[at]) {
            slot *fresh = &slots[slot_count];
            fresh->key = tally_alloc(key.len);
            if (key.len) memcpy(fresh->key, key.bytes, key.len);
            fresh->key_len = key.len;
            fresh->state = tally_alloc(spec->state_size);
            fresh->dirty = false;
            table[at] = (uint32_t)++slot_count;
        }
        taken[accepted_count++] = (accepted){(uint32_t)i, table[at] - 1, event};
    }

    size_t decode_rejected = rejected;
    plugin_list_option_list_u8_t stored = {NULL, 0};
    if (accepted_count) {
        plugin_list_u8_t *keys = checked_realloc(NULL, slot_count * sizeof *keys);
        for (size_t s = 0; s < slot_count; s++) keys[s] = (plugin_list_u8_t){slots[s].key, slots[s].key_len};
        plugin_list_list_u8_t key_list = {keys, slot_count};
        tally_plugin_state_get_many(&key_list, &stored);
        if (stored.len != slot_count) TRAP();
        for (size_t s = 0; s < slot_count; s++) {
            if (stored.ptr[s].is_some) {
                tally_json json;
                if (!tally_json_decode(stored.ptr[s].val.ptr, stored.ptr[s].val.len, 0, &json, &why) ||
                    !spec->read_state(&json, slots[s].state))
                    TRAP();
            } else {
                spec->initial(slots[s].state);
            }
        }

        tally_plugin_types_output_record_t *records = checked_realloc(NULL, accepted_count * sizeof *records);
        size_t record_count = 0;
        void *scratch = tally_alloc(spec->state_size);
        for (size_t a = 0; a < accepted_count; a++) {
            slot *target = &slots[taken[a].slot];
            memcpy(scratch, target->state, spec->state_size);
            why.len = 0;
            if (!spec->apply(scratch, taken[a].event, &why)) {
                rejections[rejected++] = rejection(taken[a].index, &why);
                continue;
            }
            memcpy(target->state, scratch, spec->state_size);
            target->dirty = true;
            out.len = 0;
            if (spec->emit && spec->emit(target->state, &out)) {
                records[record_count++] = (tally_plugin_types_output_record_t){
                    taken[a].index, {true, {target->key, target->key_len}}, {copy_out(&out), out.len}};
            }
        }

        plugin_tuple2_list_u8_list_u8_t *entries = checked_realloc(NULL, slot_count * sizeof *entries);
        size_t entry_count = 0;
        for (size_t s = 0; s < slot_count; s++) {
            if (!slots[s].dirty) continue;
            out.len = 0;
            spec->write_state(slots[s].state, &out);
            entries[entry_count++] = (plugin_tuple2_list_u8_list_u8_t){{slots[s].key, slots[s].key_len}, {copy_out(&out), out.len}};
        }
        if (entry_count) {
            plugin_list_tuple2_list_u8_list_u8_t entry_list = {entries, entry_count};
            tally_plugin_state_put_many(&entry_list);
        }
        if (record_count) {
            plugin_string_t output = {(uint8_t *)spec->output, strlen(spec->output)};
            tally_plugin_output_list_output_record_t record_list = {records, record_count};
            tally_plugin_output_emit_many(&output, &record_list);
        }
        for (size_t e = 0; e < entry_count; e++) free(entries[e].f1.ptr);
        for (size_t r = 0; r < record_count; r++) free(records[r].value.ptr);
        free(entries);
        free(records);
        free(keys);
    }

    /* Rejections in event order: those of decoding, then those of
     * applying, each run in order already; merge the two. */
    exports_tally_plugin_aggregator_rejection_t *merged = NULL;
    if (rejected) {
        merged = checked_realloc(NULL, rejected * sizeof *merged);
        size_t left = 0, right = decode_rejected, m = 0;
        while (left < decode_rejected || right < rejected)
            merged[m++] = right == rejected || (left < decode_rejected && rejections[left].index < rejections[right].index)
                              ? rejections[left++]
                              : rejections[right++];
    }
    free(rejections);
    ret->ptr = merged;
    ret->len = rejected;
    /* Stored states were read in place: freed with the batch. */
    for (size_t s = 0; s < stored.len; s++)
        if (stored.ptr[s].is_some) free_received(stored.ptr[s].val.ptr, stored.ptr[s].val.len);
    free_received(stored.ptr, stored.len);
    free(taken);
    free(slots);
    free(table);
    tally_text_free(&why);
    tally_text_free(&key);
    tally_text_free(&out);
    tally_free_events(events);
    arena_reset();
}
