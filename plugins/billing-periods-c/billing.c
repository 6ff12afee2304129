/* The period billing plugin in C: usage events metered per customer,
 * metric and calendar period in the customer's time zone. The host owns
 * the periods (docs/periods.md); this plugin says what each event is and
 * how its metric's meter counts it. It computes what
 * plugins/billing-periods (Rust) computes, byte for byte: facts, refusals,
 * addends, states and values are docs/billing.md's "The period billing
 * plugin", and its configuration errors are the Rust build's.
 *
 * Events: {"id":"e1","customer":"acme","metric":"calls","quantity":12,"ts":"2026-11-03T10:00:00Z"}
 * Job file:
 *   [plugin_config]
 *   meters = { calls = "sum", requests = "count", peak_gb = "max", storage_gb = "latest", seats = { unique_count = "user" } }
 */
#include <string.h>

#include "tally_periods.h"
#include "config.h"

/* ---- Addends and states ---------------------------------------------------- */

/* What an event adds to its period, as its metric's meter reads it. */
typedef struct addend {
    meter_kind kind;
    uint64_t quantity;  /* sum, max, latest */
    tally_str unique;   /* unique_count: the counted field's text */
} addend;

/* A period's state, tagged by the meter that built it. */
typedef struct state {
    meter_kind kind;
    uint64_t value; /* the sum, count, max, or the latest event's quantity */
    int64_t seconds; /* latest: the latest event's time */
    uint32_t nanoseconds;
    /* unique_count: distinct values in UTF-8 byte order, then values added
     * since (merged in when the state is written or valued). */
    tally_str *values;
    size_t count;
    tally_str *added;
    size_t added_count, added_cap;
} state;

static const char *const METER_NAMES[] = {"sum", "count", "max", "latest", "unique_count"};

static void write_addend(const void *in, tally_text *out) {
    const addend *a = in;
    switch (a->kind) {
        case METER_COUNT: tally_text_str(out, "\"count\""); return;
        case METER_UNIQUE:
            tally_text_str(out, "{\"unique\":");
            tally_text_json_string(out, a->unique.bytes, a->unique.len);
            break;
        default:
            tally_text_str(out, "{\"");
            tally_text_str(out, METER_NAMES[a->kind]);
            tally_text_str(out, "\":");
            tally_text_u64(out, a->quantity);
            break;
    }
    tally_text_str(out, "}");
}

/* The meter named `name` (of an externally tagged addend or state). */
static bool meter_named(const tally_json *name, meter_kind *kind) {
    for (int k = 0; k < 5; k++) {
        if (tally_json_string_is(name, k == METER_UNIQUE ? "unique" : METER_NAMES[k])) {
            *kind = (meter_kind)k;
            return true;
        }
    }
    return false;
}

static bool read_addend(const tally_json *json, void *out) {
    addend *a = out;
    if (tally_json_string_is(json, "count")) {
        a->kind = METER_COUNT;
        return true;
    }
    if (json->kind != TALLY_JSON_OBJECT || json->count != 1 || !meter_named(&json->names[0], &a->kind) || a->kind == METER_COUNT)
        return false;
    const tally_json *payload = &json->items[0];
    if (a->kind == METER_UNIQUE) {
        if (!tally_json_is_text(payload)) return false;
        a->unique = tally_str_of(payload);
        return true;
    }
    return tally_json_u64(payload, &a->quantity);
}

/* Byte order of two texts (as Rust orders Strings). */
static int compare(const tally_str *a, const tally_str *b) {
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->bytes, b->bytes, n) : 0;
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* Sorts `items` (stable merge sort; `scratch` holds as many). */
static void sort_texts(tally_str *items, tally_str *scratch, size_t n) {
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) scratch[k++] = compare(&items[j], &items[i]) < 0 ? items[j++] : items[i++];
            while (i < mid) scratch[k++] = items[i++];
            while (j < hi) scratch[k++] = items[j++];
        }
        memcpy(items, scratch, n * sizeof *items);
    }
}

/* Merges the values added into the state's distinct, ordered values. */
static void settle(state *s) {
    if (!s->added_count) return;
    size_t total = s->count + s->added_count;
    tally_str *scratch = tally_alloc(s->added_count * sizeof *scratch);
    sort_texts(s->added, scratch, s->added_count);
    tally_str *merged = tally_alloc(total * sizeof *merged);
    size_t i = 0, j = 0, m = 0;
    while (i < s->count || j < s->added_count) {
        tally_str next = j == s->added_count || (i < s->count && compare(&s->values[i], &s->added[j]) <= 0) ? s->values[i++]
                                                                                                              : s->added[j++];
        if (m == 0 || compare(&merged[m - 1], &next) != 0) merged[m++] = next;
    }
    s->values = merged;
    s->count = m;
    s->added_count = 0;
}

static void write_state(const void *in, tally_text *out) {
    state *s = (state *)in; /* settling changes how it is held, not what it is */
    tally_text_str(out, "{\"");
    tally_text_str(out, s->kind == METER_UNIQUE ? "unique" : METER_NAMES[s->kind]);
    tally_text_str(out, "\":");
    switch (s->kind) {
        case METER_LATEST:
            tally_text_str(out, "{\"seconds\":");
            tally_text_i64(out, s->seconds);
            tally_text_str(out, ",\"nanoseconds\":");
            tally_text_u64(out, s->nanoseconds);
            tally_text_str(out, ",\"value\":");
            tally_text_u64(out, s->value);
            tally_text_str(out, "}");
            break;
        case METER_UNIQUE:
            settle(s);
            tally_text_str(out, "[");
            for (size_t i = 0; i < s->count; i++) {
                if (i) tally_text_str(out, ",");
                tally_text_json_string(out, s->values[i].bytes, s->values[i].len);
            }
            tally_text_str(out, "]");
            break;
        default: tally_text_u64(out, s->value); break;
    }
    tally_text_str(out, "}");
}

/* The one member `name` of `object` (serde: each field at most once). */
static const tally_json *only(const tally_json *object, const char *name) {
    return tally_json_count(object, name) == 1 ? tally_json_get(object, name) : NULL;
}

static bool read_state(const tally_json *json, void *out) {
    state *s = out;
    if (json->kind != TALLY_JSON_OBJECT || json->count != 1 || !meter_named(&json->names[0], &s->kind)) return false;
    const tally_json *payload = &json->items[0];
    switch (s->kind) {
        case METER_LATEST: {
            const tally_json *seconds = only(payload, "seconds"), *nanoseconds = only(payload, "nanoseconds"),
                             *value = only(payload, "value");
            uint64_t ns;
            if (!tally_json_i64(seconds, &s->seconds) || !tally_json_u64(nanoseconds, &ns) || ns > UINT32_MAX ||
                !tally_json_u64(value, &s->value))
                return false;
            s->nanoseconds = (uint32_t)ns;
            return true;
        }
        case METER_UNIQUE: {
            if (payload->kind != TALLY_JSON_ARRAY) return false;
            s->values = tally_alloc(payload->count * sizeof *s->values);
            bool ordered = true;
            for (size_t i = 0; i < payload->count; i++) {
                if (!tally_json_is_text(&payload->items[i])) return false;
                s->values[i] = tally_str_of(&payload->items[i]);
                if (i && compare(&s->values[i - 1], &s->values[i]) >= 0) ordered = false;
            }
            if (ordered) {
                s->count = payload->count;
            } else { /* not as written by a build of this plugin: a set all the same */
                s->added = s->values;
                s->added_count = s->added_cap = payload->count;
                s->values = NULL;
                settle(s);
            }
            return true;
        }
        default: return tally_json_u64(payload, &s->value);
    }
}

static bool add(void *state_in, bool first, tally_instant time, const void *addend_in, tally_text *why) {
    state *s = state_in;
    const addend *a = addend_in;
    if (first) {
        s->kind = a->kind;
    } else if (s->kind != a->kind) {
        why->len = 0;
        tally_text_str(why, "the event's metric is metered by ");
        tally_text_str(why, METER_NAMES[a->kind]);
        tally_text_str(why, " but its period was opened by ");
        tally_text_str(why, METER_NAMES[s->kind]);
        tally_text_str(why, ": a metric's meter changed while its period was open; keep a metric's meter for its periods");
        return false;
    }
    switch (a->kind) {
        case METER_SUM:
            if (!first && s->value > UINT64_MAX - a->quantity)
                return tally_reject(why, "the period's sum would pass 2^64 - 1, the largest meterable");
            s->value = first ? a->quantity : s->value + a->quantity;
            break;
        case METER_COUNT:
            if (s->value < UINT64_MAX) s->value++;
            break;
        case METER_MAX:
            if (first || a->quantity > s->value) s->value = a->quantity;
            break;
        case METER_LATEST: /* ties go to the event added first */
            if (first || time.seconds > s->seconds || (time.seconds == s->seconds && time.nanoseconds > s->nanoseconds)) {
                s->seconds = time.seconds;
                s->nanoseconds = time.nanoseconds;
                s->value = a->quantity;
            }
            break;
        case METER_UNIQUE:
            if (s->added_count == s->added_cap) {
                size_t cap = s->added_cap ? s->added_cap * 2 : 8;
                tally_str *grown = tally_alloc(cap * sizeof *grown);
                if (s->added_count) memcpy(grown, s->added, s->added_count * sizeof *grown);
                s->added = grown;
                s->added_cap = cap;
            }
            s->added[s->added_count++] = a->unique;
            break;
    }
    return true;
}

static uint64_t value(const void *in) {
    const state *s = in;
    return s->kind == METER_UNIQUE ? s->count : s->value; /* read_state settles a set */
}

/* ---- Events ------------------------------------------------------------------- */

/* The fields every event has, in the order they are checked. */
static const char *const FIELDS[] = {"id", "customer", "metric", "quantity", "ts"};
enum { ID, CUSTOMER, METRIC, QUANTITY, TS, FIELD_COUNT };

static bool refuse_field(tally_text *why, const char *field, const char *what) {
    why->len = 0;
    tally_text_str(why, "field `");
    tally_text_str(why, field);
    tally_text_str(why, what);
    return false;
}

/* A quantity exactly as written: a non-negative integer up to 2^64 - 1. */
static bool quantity(const tally_json *raw, uint64_t *out, tally_text *why) {
    if (!raw) return tally_reject(why, "field `quantity` is missing");
    bool digits = raw->raw_len > 0;
    for (size_t i = 0; i < raw->raw_len && digits; i++) digits = raw->raw[i] >= '0' && raw->raw[i] <= '9';
    if (!digits || !tally_json_u64(raw, out)) {
        why->len = 0;
        tally_text_str(why, digits ? "quantity " : "quantity must be a non-negative integer, got ");
        tally_text_bytes(why, raw->raw, raw->raw_len);
        if (digits) tally_text_str(why, " is over the largest meterable, 2^64 - 1");
        return false;
    }
    return true;
}

static bool describe(const tally_json *event, tally_facts *facts, void *out, tally_text *why) {
    addend *a = out;
    /* What serde_json refuses to read as a value (a number past a double,
     * a lone surrogate in text) is no JSON, whatever else is wrong. */
    if ((event->kind == TALLY_JSON_NUMBER && !tally_json_finite(event)) || (event->kind == TALLY_JSON_STRING && event->lone_surrogate))
        return tally_reject(why, "event is not valid JSON");
    if (event->kind != TALLY_JSON_OBJECT) return tally_reject(why, "event must be a JSON object");
    const tally_json *seen[FIELD_COUNT] = {0};
    bool twice[FIELD_COUNT] = {0};
    for (size_t i = 0; i < event->count; i++) {
        const tally_json *name = &event->names[i];
        if (name->lone_surrogate) return tally_reject(why, "event is not valid JSON");
        for (int f = 0; f < FIELD_COUNT; f++) {
            if (tally_json_string_is(name, FIELDS[f])) {
                twice[f] |= seen[f] != NULL;
                seen[f] = &event->items[i];
                break;
            }
        }
    }
    for (int f = 0; f < FIELD_COUNT; f++) {
        if (twice[f]) return refuse_field(why, FIELDS[f], "` is given twice");
        if (!seen[f] && f != QUANTITY) return refuse_field(why, FIELDS[f], "` is missing");
    }
    static const int TEXTS[] = {ID, CUSTOMER, METRIC, TS};
    for (int t = 0; t < 4; t++) {
        const tally_json *field = seen[TEXTS[t]];
        if (!tally_json_is_string(field)) return refuse_field(why, FIELDS[TEXTS[t]], "` must be a string");
        if (field->lone_surrogate) return tally_reject(why, "event is not valid JSON");
    }
    const meter *m = find_meter(seen[METRIC]->text, seen[METRIC]->len);
    if (!m) {
        why->len = 0;
        tally_text_str(why, "metric ");
        tally_text_json_string(why, seen[METRIC]->text, seen[METRIC]->len);
        tally_text_str(why, " has no meter; name it in the job's [plugin_config] meters (it has: ");
        write_metrics(why);
        tally_text_str(why, ")");
        return false;
    }
    a->kind = m->kind;
    if (m->kind == METER_SUM || m->kind == METER_MAX || m->kind == METER_LATEST) {
        if (!quantity(seen[QUANTITY], &a->quantity, why)) return false;
    } else if (m->kind == METER_UNIQUE) {
        /* The counted field: one of the five, or the last one so named. */
        int five = -1;
        for (int f = 0; f < FIELD_COUNT; f++)
            if (m->field.len == strlen(FIELDS[f]) && memcmp(m->field.bytes, FIELDS[f], m->field.len) == 0) five = f;
        const tally_json *field = five >= 0 ? seen[five] : NULL;
        for (size_t i = event->count; five < 0 && i-- > 0 && !field;)
            if (tally_json_string_eq(&event->names[i], m->field.bytes, m->field.len)) field = &event->items[i];
        if (!field || field->kind != TALLY_JSON_STRING) {
            why->len = 0;
            tally_text_str(why, "field ");
            tally_text_json_string(why, m->field.bytes, m->field.len);
            if (!field) {
                tally_text_str(why, " (counted by unique_count) is missing");
            } else {
                tally_text_str(why, " must be a string for its unique_count meter, got ");
                tally_text_bytes(why, field->raw, field->raw_len);
            }
            return false;
        }
        if (field->lone_surrogate) return tally_reject(why, "event is not valid JSON");
        a->unique = tally_str_of(field);
    }
    facts->id = tally_str_of(seen[ID]);
    facts->time = tally_time_rfc3339(tally_str_of(seen[TS]));
    tally_facts_key(facts, "customer", tally_str_of(seen[CUSTOMER]));
    tally_facts_key(facts, "metric", tally_str_of(seen[METRIC]));
    facts->customer = tally_str_of(seen[CUSTOMER]);
    return true;
}

static const tally_periods billing = {
    .addend_size = sizeof(addend),
    .state_size = sizeof(state),
    .configure = configure_meters,
    .describe = describe,
    .write_addend = write_addend,
    .read_addend = read_addend,
    .add = add,
    .read_state = read_state,
    .write_state = write_state,
    .value = value,
};

TALLY_EXPORT_PERIODS(billing)
