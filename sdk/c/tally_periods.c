/* Tally's C SDK for period plugins: see tally_periods.h. A period plugin
 * is built with this file instead of tally.c; both take the text writer,
 * the arena, UTF-8 and JSON from tally_json.c, compiled here as part of
 * this file. Uses only malloc, realloc, free and the mem* functions of
 * libc, so the component imports no WASI at all. */
#include "tally_periods.h"

#include <stdlib.h>
#include <string.h>

#define TALLY_JSON_IMPLEMENTATION
#include "tally_json.c"

/* Frees the call's arena blocks but keeps one ordinary chunk for the next
 * call (or event): a call of many small events allocates no chunk per
 * event. */
void tally_periods_done(void) { arena_release(true); }

/* ---- Logging ---------------------------------------------------------------- */

void tally_log(tally_plugin_types_level_t level, const char *message) {
    periods_plugin_string_t text = {(uint8_t *)message, strlen(message)};
    tally_plugin_log_log(level, &text);
}

/* Logs why, then traps: a bug of the plugin or of the host. */
static _Noreturn void fail(const char *why) {
    tally_log(TALLY_ERROR, why);
    TRAP();
}

/* ---- Facts -------------------------------------------------------------------- */

tally_str tally_str_of(const tally_json *string) { return (tally_str){string->text, string->len}; }

tally_str tally_str_c(const char *text) { return (tally_str){(const uint8_t *)text, strlen(text)}; }

tally_event_time tally_time_rfc3339(tally_str text) { return (tally_event_time){TALLY_TIME_RFC3339, text, 0}; }

tally_event_time tally_time_unix_millis(int64_t millis) { return (tally_event_time){TALLY_TIME_UNIX_MILLIS, {NULL, 0}, millis}; }

void tally_facts_key(tally_facts *facts, const char *name, tally_str value) {
    if (facts->key_count >= TALLY_MAX_KEY_FIELDS) fail("an aggregation key has more than 16 fields");
    facts->key[facts->key_count++] = (tally_key_field){tally_str_c(name), value};
}

/* ---- The plumbing --------------------------------------------------------------- */

/* Whether every number in `value` reads as a finite double (serde_json
 * refuses a document with one that does not). */
static bool all_finite(const tally_json *value) {
    if (value->kind == TALLY_JSON_NUMBER) return tally_json_finite(value);
    for (size_t i = 0; i < value->count; i++)
        if (!all_finite(&value->items[i])) return false;
    return true;
}

bool tally_periods_configure(const tally_periods *spec, const uint8_t *config, size_t len, tally_text *why) {
    tally_json json;
    why->len = 0;
    bool ok = tally_json_decode(config, len, 0, &json, why) && all_finite(&json);
    if (!ok) {
        tally_reject(why, "[plugin_config] does not fit this plugin: it is not JSON");
    } else if (spec->configure) {
        why->len = 0;
        ok = spec->configure(&json, why);
    }
    tally_periods_done();
    return ok;
}

bool tally_periods_describe_one(const tally_periods *spec, const uint8_t *record, size_t len, tally_facts *facts,
                                tally_text *addend, tally_text *why) {
    tally_json event;
    why->len = 0;
    addend->len = 0;
    *facts = (tally_facts){0};
    if (!tally_json_decode(record, len, TALLY_JSON_LONE_SURROGATES, &event, why)) return false;
    void *made = tally_alloc(spec->addend_size);
    if (!spec->describe(&event, facts, made, why)) return false;
    spec->write_addend(made, addend);
    return true;
}

static bool read_json(const uint8_t *bytes, size_t len, bool (*read)(const tally_json *, void *), void *into) {
    tally_json json;
    tally_text why = {0};
    bool ok = tally_json_decode(bytes, len, 0, &json, &why) && read(&json, into);
    tally_text_free(&why);
    return ok;
}

static bool refuse(uint32_t *refused, uint32_t index, tally_text *why, const char *reason) {
    *refused = index;
    return tally_reject(why, reason);
}

bool tally_periods_add_all(const tally_periods *spec, const uint8_t *const *states, const size_t *state_lens,
                           size_t state_count, const tally_addition *additions, size_t addition_count, tally_text *out,
                           uint32_t *refused, tally_text *why) {
    why->len = 0;
    /* Each state decoded once, then every addition folded in, in order. */
    uint8_t **decoded = tally_alloc(state_count * sizeof *decoded);
    bool *present = tally_alloc(state_count * sizeof *present);
    for (size_t s = 0; s < state_count; s++) {
        decoded[s] = tally_alloc(spec->state_size);
        if (!states[s]) continue;
        if (!read_json(states[s], state_lens[s], spec->read_state, decoded[s]))
            return refuse(refused, 0, why, "a period's state does not decode: it is not what this plugin writes");
        present[s] = true;
    }
    void *addend = tally_alloc(spec->addend_size);
    for (size_t a = 0; a < addition_count; a++) {
        const tally_addition *addition = &additions[a];
        if (addition->period >= state_count) {
            refuse(refused, (uint32_t)a, why, "the addition names period ");
            tally_text_u64(why, addition->period);
            tally_text_str(why, ", of ");
            tally_text_u64(why, state_count);
            return false;
        }
        memset(addend, 0, spec->addend_size);
        if (!read_json(addition->addend, addition->addend_len, spec->read_addend, addend))
            return refuse(refused, (uint32_t)a, why,
                          "the event's addend is not the JSON this plugin makes: it is not what this plugin writes");
        why->len = 0;
        if (!spec->add(decoded[addition->period], !present[addition->period], addition->time, addend, why)) {
            *refused = (uint32_t)a;
            return false;
        }
        present[addition->period] = true;
    }
    for (size_t s = 0; s < state_count; s++) {
        if (!present[s]) {
            refuse(refused, 0, why, "period ");
            tally_text_u64(why, s);
            tally_text_str(why, " has neither a state nor an addition");
            return false;
        }
    }
    for (size_t s = 0; s < state_count; s++) {
        out[s].len = 0;
        spec->write_state(decoded[s], &out[s]);
    }
    return true;
}

uint64_t tally_periods_value_of(const tally_periods *spec, const uint8_t *state, size_t len) {
    void *decoded = tally_alloc(spec->state_size);
    if (!read_json(state, len, spec->read_state, decoded)) fail("panic: a period's state does not decode");
    uint64_t value = spec->value(decoded);
    tally_periods_done();
    return value;
}

/* ---- The exports -------------------------------------------------------------- */

static bool configured;

static void require_configured(void) {
    if (!configured) fail("panic: the host configures a period plugin before calling it");
}

/* Frees a buffer the host handed over. The canonical ABI allocates nothing
 * for an empty one: its pointer is not malloc's, so it must not be freed. */
static void free_received(void *ptr, size_t len) {
    if (len) free(ptr);
}

/* A malloc'd copy for the host (which frees it after the call); nothing
 * for an empty one, as the bindings' post-return frees only non-empty. */
static uint8_t *handed_over(const void *bytes, size_t len) {
    if (!len) return NULL;
    uint8_t *copy = checked_realloc(NULL, len);
    memcpy(copy, bytes, len);
    return copy;
}

/* A fact as a component string: UTF-8 (a plugin bug otherwise). */
static periods_plugin_string_t fact(tally_str text) {
    if (text.len && !text.bytes) fail("a fact points nowhere");
    if (!is_utf8(text.bytes, text.len)) fail("a fact (id, key, customer or time) is not UTF-8");
    return (periods_plugin_string_t){handed_over(text.bytes, text.len), text.len};
}

void tally_periods_export_configure(const tally_periods *spec, periods_plugin_string_t *config, bool *ok,
                                    periods_plugin_string_t *err) {
    /* The host configures an instance once; should it call again, the
     * configuration is read again (an accepted one replaces the last). */
    tally_text why = {0};
    *ok = tally_periods_configure(spec, config->len ? config->ptr : (const uint8_t *)"", config->len, &why);
    free_received(config->ptr, config->len);
    if (*ok) configured = true;
    else *err = (periods_plugin_string_t){handed_over(why.bytes, why.len), why.len};
    tally_text_free(&why);
}

void tally_periods_export_describe(const tally_periods *spec, exports_tally_plugin_periods_list_event_t *events,
                                   exports_tally_plugin_periods_list_result_event_facts_string_t *ret) {
    require_configured();
    size_t n = events->len;
    exports_tally_plugin_periods_result_event_facts_string_t *results = n ? checked_array(n, sizeof *results) : NULL;
    tally_text addend = {0}, why = {0};
    tally_facts facts;
    for (size_t i = 0; i < n; i++) {
        exports_tally_plugin_periods_event_t *event = &events->ptr[i];
        exports_tally_plugin_periods_result_event_facts_string_t *result = &results[i];
        memset(result, 0, sizeof *result);
        if (!tally_periods_describe_one(spec, event->value.ptr, event->value.len, &facts, &addend, &why)) {
            result->is_err = true;
            result->val.err = (periods_plugin_string_t){handed_over(why.bytes, why.len), why.len};
        } else {
            exports_tally_plugin_periods_event_facts_t *out = &result->val.ok;
            out->id = fact(facts.id);
            if (facts.time.kind == TALLY_TIME_UNIX_MILLIS) {
                out->time.tag = TALLY_PLUGIN_TYPES_EVENT_TIME_UNIX_MILLIS;
                out->time.val.unix_millis = facts.time.unix_millis;
            } else {
                out->time.tag = TALLY_PLUGIN_TYPES_EVENT_TIME_RFC3339;
                out->time.val.rfc3339 = fact(facts.time.rfc3339);
            }
            if (facts.key_count > TALLY_MAX_KEY_FIELDS) fail("an aggregation key has more than 16 fields");
            out->key.len = facts.key_count;
            out->key.ptr = facts.key_count ? checked_array(facts.key_count, sizeof *out->key.ptr) : NULL;
            for (size_t k = 0; k < facts.key_count; k++)
                out->key.ptr[k] = (periods_plugin_tuple2_string_string_t){fact(facts.key[k].name), fact(facts.key[k].value)};
            out->customer = fact(facts.customer);
            out->addend = (periods_plugin_list_u8_t){handed_over(addend.bytes, addend.len), addend.len};
        }
        /* The event is read once: its buffers and decoded JSON go now. */
        free_received(event->value.ptr, event->value.len);
        if (event->key.is_some) free_received(event->key.val.ptr, event->key.val.len);
        tally_periods_done();
    }
    free_received(events->ptr, events->len);
    tally_text_free(&addend);
    tally_text_free(&why);
    ret->ptr = results;
    ret->len = n;
}

bool tally_periods_export_add(const tally_periods *spec, periods_plugin_list_option_list_u8_t *states,
                              periods_plugin_list_list_u8_t *addends, exports_tally_plugin_periods_list_addition_t *additions,
                              periods_plugin_list_list_u8_t *ret, exports_tally_plugin_periods_refusal_t *err) {
    require_configured();
    size_t state_count = states->len, addition_count = additions->len;
    tally_text why = {0};
    uint32_t refused = 0;
    bool ok = true;
    tally_addition *folded = addition_count ? checked_array(addition_count, sizeof *folded) : NULL;
    for (size_t a = 0; a < addition_count && ok; a++) {
        const exports_tally_plugin_periods_addition_t *addition = &additions->ptr[a];
        if (addition->addend >= addends->len) {
            ok = refuse(&refused, (uint32_t)a, &why, "the addition names addend ");
            tally_text_u64(&why, addition->addend);
            tally_text_str(&why, ", of ");
            tally_text_u64(&why, addends->len);
            break;
        }
        const periods_plugin_list_u8_t *addend = &addends->ptr[addition->addend];
        folded[a] = (tally_addition){addition->period, {addition->time.seconds, addition->time.nanoseconds}, addend->ptr, addend->len};
    }
    tally_text *out = NULL;
    if (ok) {
        const uint8_t **bytes = tally_alloc(state_count * sizeof *bytes);
        size_t *lens = tally_alloc(state_count * sizeof *lens);
        for (size_t s = 0; s < state_count; s++) {
            /* An empty state is no JSON, but still a state: point at something. */
            if (states->ptr[s].is_some) bytes[s] = states->ptr[s].val.len ? states->ptr[s].val.ptr : (const uint8_t *)"";
            lens[s] = states->ptr[s].is_some ? states->ptr[s].val.len : 0;
        }
        out = state_count ? checked_array(state_count, sizeof *out) : NULL;
        if (state_count) memset(out, 0, state_count * sizeof *out);
        ok = tally_periods_add_all(spec, bytes, lens, state_count, folded, addition_count, out, &refused, &why);
    }
    if (ok) {
        ret->len = state_count;
        ret->ptr = state_count ? checked_array(state_count, sizeof *ret->ptr) : NULL;
        for (size_t s = 0; s < state_count; s++) ret->ptr[s] = (periods_plugin_list_u8_t){handed_over(out[s].bytes, out[s].len), out[s].len};
    } else {
        err->addition = refused;
        err->reason = (periods_plugin_string_t){handed_over(why.bytes, why.len), why.len};
    }
    for (size_t s = 0; out && s < state_count; s++) tally_text_free(&out[s]);
    free(out);
    free(folded);
    tally_text_free(&why);
    tally_periods_done();
    for (size_t s = 0; s < state_count; s++)
        if (states->ptr[s].is_some) free_received(states->ptr[s].val.ptr, states->ptr[s].val.len);
    free_received(states->ptr, states->len);
    for (size_t a = 0; a < addends->len; a++) free_received(addends->ptr[a].ptr, addends->ptr[a].len);
    free_received(addends->ptr, addends->len);
    free_received(additions->ptr, additions->len);
    return ok;
}

uint64_t tally_periods_export_value(const tally_periods *spec, periods_plugin_list_u8_t *state) {
    require_configured();
    uint64_t value = tally_periods_value_of(spec, state->len ? state->ptr : (const uint8_t *)"", state->len);
    free_received(state->ptr, state->len);
    return value;
}
