/* The billing plugin's configuration: see config.h. The Rust build reads
 * `[plugin_config]` with serde (`serde_json::from_value` into
 * `{ meters: BTreeMap<String, MeterSpec> }`, `deny_unknown_fields`, the
 * meter an untagged enum of a string, `{ unique_count }` and `{ meter,
 * field }`), so this reads it in the same order, with the same words. */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "unicode.h"

static meter *meters;
static size_t meter_count;

/* What serde's derive says before every error of reading the config. */
static const char USAGE[] = "write meters = { calls = \"sum\", seats = { unique_count = \"user\" } }: ";

static int compare_bytes(const uint8_t *a, size_t a_len, const uint8_t *b, size_t b_len) {
    size_t n = a_len < b_len ? a_len : b_len;
    int c = n ? memcmp(a, b, n) : 0;
    return c ? c : (a_len > b_len) - (a_len < b_len);
}

static int compare_names(const tally_json *a, const tally_json *b) { return compare_bytes(a->text, a->len, b->text, b->len); }

/* An object's members as serde_json's Map holds them: ordered by name,
 * each name once (its last value). Indexes into `object`, in the arena. */
static size_t map_order(const tally_json *object, size_t **out) {
    size_t n = object->count;
    size_t *order = tally_alloc(n * sizeof *order), *scratch = tally_alloc(n * sizeof *scratch);
    for (size_t i = 0; i < n; i++) order[i] = i;
    for (size_t width = 1; width < n; width *= 2) { /* stable merge sort */
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                scratch[k++] = compare_names(&object->names[order[j]], &object->names[order[i]]) < 0 ? order[j++] : order[i++];
            while (i < mid) scratch[k++] = order[i++];
            while (j < hi) scratch[k++] = order[j++];
        }
        memcpy(order, scratch, n * sizeof *order);
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 1 < n && compare_names(&object->names[order[i]], &object->names[order[i + 1]]) == 0) continue;
        order[kept++] = order[i];
    }
    *out = order;
    return kept;
}

/* ---- How serde names what it did not expect ------------------------------ */

/* Decodes the UTF-8 code point at `*at` (the text is UTF-8). */
static uint32_t next_code_point(const uint8_t **at) {
    const uint8_t *p = *at;
    uint32_t c = p[0];
    size_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (n == 2) c &= 0x1f;
    if (n == 3) c &= 0x0f;
    if (n == 4) c &= 0x07;
    for (size_t i = 1; i < n; i++) c = c << 6 | (p[i] & 0x3f);
    *at = p + n;
    return c;
}

void write_rust_debug(tally_text *out, const uint8_t *text, size_t len) {
    static const char hex[] = "0123456789abcdef";
    tally_text_str(out, "\"");
    const uint8_t *at = text, *end = text + len;
    while (at < end) {
        const uint8_t *start = at;
        uint32_t c = next_code_point(&at);
        switch (c) {
            case 0: tally_text_str(out, "\\0"); continue;
            case '\t': tally_text_str(out, "\\t"); continue;
            case '\r': tally_text_str(out, "\\r"); continue;
            case '\n': tally_text_str(out, "\\n"); continue;
            case '\\': tally_text_str(out, "\\\\"); continue;
            case '"': tally_text_str(out, "\\\""); continue;
            default: break;
        }
        if (rust_debug_escapes(c)) {
            char escape[12] = "\\u{";
            size_t n = 3, digits = 1;
            while (digits < 8 && c >> (4 * digits)) digits++;
            while (digits--) escape[n++] = hex[c >> (4 * digits) & 15];
            escape[n++] = '}';
            tally_text_bytes(out, escape, n);
        } else {
            tally_text_bytes(out, start, (size_t)(at - start));
        }
    }
    tally_text_str(out, "\"");
}

/* serde's `Unexpected` of a serde_json Value, as serde_json's errors write
 * it (its JsonUnexpected: `null` for null, a float as zmij formats it). A
 * float is echoed as written: the host wrote the config with serde_json,
 * whose floats are zmij's already. */
static void write_unexpected(tally_text *out, const tally_json *value) {
    switch (value->kind) {
        case TALLY_JSON_NULL: tally_text_str(out, "null"); return;
        case TALLY_JSON_TRUE: tally_text_str(out, "boolean `true`"); return;
        case TALLY_JSON_FALSE: tally_text_str(out, "boolean `false`"); return;
        case TALLY_JSON_STRING:
            tally_text_str(out, "string ");
            write_rust_debug(out, value->text, value->len);
            return;
        case TALLY_JSON_ARRAY: tally_text_str(out, "sequence"); return;
        case TALLY_JSON_OBJECT: tally_text_str(out, "map"); return;
        case TALLY_JSON_NUMBER: break;
    }
    bool integer = true;
    for (size_t i = 0; i < value->len; i++) integer &= value->text[i] != '.' && value->text[i] != 'e' && value->text[i] != 'E';
    uint64_t magnitude = 1;
    tally_json digits = *value;
    bool negative = value->len && value->text[0] == '-';
    if (negative) digits.text++, digits.len--;
    /* serde_json reads an integer as u64, or i64 when negative (-0 as the
     * float -0.0), else as a float. */
    if (integer && tally_json_u64(&digits, &magnitude) && (!negative || (magnitude && magnitude <= (uint64_t)INT64_MAX + 1))) {
        tally_text_str(out, "integer `");
        tally_text_bytes(out, value->text, value->len);
        tally_text_str(out, "`");
        return;
    }
    tally_text_str(out, "floating point `");
    if (negative && magnitude == 0 && integer) tally_text_str(out, "-0.0"); /* -0 reads as the float -0.0 */
    else tally_text_bytes(out, value->text, value->len);
    tally_text_str(out, "`");
}

/* ---- Reading the meters ---------------------------------------------------- */

/* One `meters` entry, as the untagged MeterSpec reads it: the meter's
 * name and its field (`has_field` false: none). */
typedef struct spec {
    tally_str name, field;
    bool has_field;
} spec;

/* MeterSpec: a string (`"sum"`, `"unique_count:user"`), `{ unique_count =
 * "user" }` or `{ meter = "…", field = "…" }` (other keys ignored). */
static bool read_spec(const tally_json *value, spec *out) {
    *out = (spec){0};
    if (value->kind == TALLY_JSON_STRING) {
        const uint8_t *colon = value->len ? memchr(value->text, ':', value->len) : NULL;
        if (!colon) {
            out->name = tally_str_of(value);
            return true;
        }
        out->name = (tally_str){value->text, (size_t)(colon - value->text)};
        out->field = (tally_str){colon + 1, value->len - (size_t)(colon - value->text) - 1};
        out->has_field = true;
        return true;
    }
    if (value->kind != TALLY_JSON_OBJECT) return false;
    const tally_json *unique = tally_json_get(value, "unique_count");
    if (tally_json_is_string(unique)) {
        *out = (spec){tally_str_c("unique_count"), tally_str_of(unique), true};
        return true;
    }
    const tally_json *name = tally_json_get(value, "meter"), *field = tally_json_get(value, "field");
    if (!tally_json_is_string(name)) return false;
    out->name = tally_str_of(name);
    if (!field || field->kind == TALLY_JSON_NULL) return true;
    if (!tally_json_is_string(field)) return false;
    out->field = tally_str_of(field);
    out->has_field = true;
    return true;
}

static bool is(tally_str text, const char *word) { return text.len == strlen(word) && memcmp(text.bytes, word, text.len) == 0; }

static tally_str kept(const uint8_t *bytes, size_t len) {
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) __builtin_trap();
    if (len) memcpy(copy, bytes, len);
    return (tally_str){copy, len};
}

static void forget_meters(void) {
    for (size_t i = 0; i < meter_count; i++) {
        free((void *)meters[i].metric.bytes);
        free((void *)meters[i].field.bytes);
    }
    free(meters);
    meters = NULL;
    meter_count = 0;
}

/* `meters` as serde reads it: a map of metric to MeterSpec, in the map's
 * order (by name), the first entry that fits no form refusing it all. */
typedef struct read_meters {
    const tally_json *metrics; /* the names */
    size_t *order;
    spec *specs;
    size_t count;
} read_meters;

static bool deserialize_meters(const tally_json *value, read_meters *out, tally_text *why) {
    if (value->kind != TALLY_JSON_OBJECT) {
        tally_text_str(why, USAGE);
        tally_text_str(why, "invalid type: ");
        write_unexpected(why, value);
        tally_text_str(why, ", expected a map");
        return false;
    }
    out->metrics = value->names;
    out->count = map_order(value, &out->order);
    out->specs = tally_alloc(out->count * sizeof *out->specs);
    for (size_t i = 0; i < out->count; i++) {
        if (!read_spec(&value->items[out->order[i]], &out->specs[i])) {
            tally_text_str(why, USAGE);
            tally_text_str(why, "data did not match any variant of untagged enum MeterSpec");
            return false;
        }
    }
    return true;
}

/* Each meter judged, by metric name, as BillingPeriods::new does; kept
 * (malloc'd, for the instance) when every one is a meter. */
static bool judge_meters(const read_meters *in, tally_text *why) {
    if (in->count == 0) return tally_reject(why, "meters is empty: name at least one metric's meter");
    meter *read = calloc(in->count, sizeof *read);
    if (!read) __builtin_trap();
    for (size_t i = 0; i < in->count; i++) {
        const tally_json *metric = &in->metrics[in->order[i]];
        const spec *s = &in->specs[i];
        meter_kind kind = METER_SUM;
        bool known = true;
        if (is(s->name, "sum")) kind = METER_SUM;
        else if (is(s->name, "count")) kind = METER_COUNT;
        else if (is(s->name, "max")) kind = METER_MAX;
        else if (is(s->name, "latest")) kind = METER_LATEST;
        else if (is(s->name, "unique_count")) kind = METER_UNIQUE;
        else known = false;
        if (known && kind == METER_UNIQUE && !(s->has_field && s->field.len)) {
            tally_text_str(why, "meters.");
            tally_text_bytes(why, metric->text, metric->len);
            tally_text_str(why, ": unique_count counts the values of a field; name it: { unique_count = \"user\" }");
        } else if (!known || (kind != METER_UNIQUE && s->has_field)) {
            tally_text_str(why, "meters.");
            tally_text_bytes(why, metric->text, metric->len);
            tally_text_str(why, " = ");
            write_rust_debug(why, s->name.bytes, s->name.len);
            tally_text_str(why, ": the meters are \"sum\", \"count\", \"max\", \"latest\" and { unique_count = \"<field>\" }");
        } else {
            read[i] = (meter){kept(metric->text, metric->len), kind, kind == METER_UNIQUE ? kept(s->field.bytes, s->field.len) : (tally_str){0}};
            continue;
        }
        for (size_t k = 0; k < i; k++) {
            free((void *)read[k].metric.bytes);
            free((void *)read[k].field.bytes);
        }
        free(read);
        return false;
    }
    forget_meters();
    meters = read;
    meter_count = in->count;
    return true;
}

bool configure_meters(const tally_json *config, tally_text *why) {
    why->len = 0;
    read_meters read = {0};
    if (config->kind == TALLY_JSON_OBJECT) { /* struct Config, deny_unknown_fields */
        size_t *order;
        size_t n = map_order(config, &order);
        bool found = false;
        for (size_t i = 0; i < n; i++) {
            const tally_json *name = &config->names[order[i]];
            if (!tally_json_string_is(name, "meters")) {
                tally_text_str(why, USAGE);
                tally_text_str(why, "unknown field `");
                tally_text_bytes(why, name->text, name->len);
                tally_text_str(why, "`, expected `meters`");
                return false;
            }
            if (!deserialize_meters(&config->items[order[i]], &read, why)) return false;
            found = true;
        }
        if (!found) {
            tally_text_str(why, USAGE);
            tally_text_str(why, "missing field `meters`");
            return false;
        }
        return judge_meters(&read, why);
    }
    if (config->kind == TALLY_JSON_ARRAY) { /* a struct may be read from a sequence */
        if (config->count == 0) {
            tally_text_str(why, USAGE);
            tally_text_str(why, "invalid length 0, expected struct Config with 1 element");
            return false;
        }
        if (!deserialize_meters(&config->items[0], &read, why)) return false;
        if (config->count > 1) {
            tally_text_str(why, USAGE);
            tally_text_str(why, "invalid length ");
            tally_text_u64(why, config->count);
            tally_text_str(why, ", expected fewer elements in array");
            return false;
        }
        return judge_meters(&read, why);
    }
    tally_text_str(why, USAGE);
    tally_text_str(why, "invalid type: ");
    write_unexpected(why, config);
    tally_text_str(why, ", expected struct Config");
    return false;
}

const meter *find_meter(const uint8_t *metric, size_t len) {
    size_t lo = 0, hi = meter_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = compare_bytes(meters[mid].metric.bytes, meters[mid].metric.len, metric, len);
        if (c == 0) return &meters[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

void write_metrics(tally_text *out) {
    for (size_t i = 0; i < meter_count; i++) {
        if (i) tally_text_str(out, ", ");
        tally_text_bytes(out, meters[i].metric.bytes, meters[i].metric.len);
    }
}
