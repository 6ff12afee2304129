/*
 * Tally's C SDK for period plugins (`tally:plugin@0.2.0`, world
 * `periods-plugin`): the aggregation of a job that declares `[periods]`,
 * written as a few functions over the plugin's own addend and state structs.
 * A plugin source that includes this header (not tally.h) is built on the
 * period contract; `tally.h` keeps the `process` contract (0.1).
 *
 * The host owns event time, periods, de-duplication and the FINAL and
 * ADJUSTMENT records (docs/periods.md). The plugin says what the host
 * cannot know: what an event says about itself and adds to its period
 * (`describe`: its facts and an addend), how an addend changes a period's
 * state (`add`), and a period's value (`value`). The SDK does the WIT
 * plumbing, as the Rust SDK's `Periods` trait does (sdk/rust/src/periods.rs):
 * it decodes each record (UTF-8, then JSON at most 128 levels deep, refused
 * in that order as "event is not UTF-8" / "event is not valid JSON"), writes
 * each addend as JSON, decodes every period's state once per `add` call,
 * folds the additions in order, returns the first refusal, and writes each
 * state once.
 *
 *   typedef struct { uint64_t n; } calls;            // the addend and the state
 *
 *   static bool describe(const tally_json *event, tally_facts *facts, void *addend, tally_text *why) {
 *       const tally_json *id = tally_json_get(event, "id"), *customer = tally_json_get(event, "customer"),
 *                        *ts = tally_json_get(event, "ts");
 *       if (!tally_json_is_text(id) || !tally_json_is_text(customer) || !tally_json_is_text(ts))
 *           return tally_reject(why, "want {\"id\":…,\"customer\":…,\"ts\":…}");
 *       facts->id = tally_str_of(id);
 *       facts->time = tally_time_rfc3339(tally_str_of(ts));
 *       tally_facts_key(facts, "customer", tally_str_of(customer));
 *       facts->customer = tally_str_of(customer);
 *       ((calls *)addend)->n = 1;
 *       return true;
 *   }
 *   static bool add(void *state, bool first, tally_instant time, const void *addend, tally_text *why) {
 *       ((calls *)state)->n += ((const calls *)addend)->n;   // state is zeroed when `first`
 *       return true;
 *   }
 *   ...
 *   static const tally_periods calls_per_period = {
 *       .addend_size = sizeof(calls), .state_size = sizeof(calls), .describe = describe,
 *       .write_addend = write_n, .read_addend = read_n, .add = add,
 *       .read_state = read_n, .write_state = write_n, .value = value,
 *   };
 *   TALLY_EXPORT_PERIODS(calls_per_period)
 *
 * Memory: what the SDK hands a callback (decoded JSON, the addend and
 * state structs, `tally_alloc` blocks) lives until the export call ends.
 * What `configure` keeps for later calls it must copy with malloc.
 * Only libc's memory functions are used: the component imports no WASI.
 */
#ifndef TALLY_PERIODS_H
#define TALLY_PERIODS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "periods_plugin.h"
#include "tally_json.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Text, JSON and the arena (tally_json.h, shared with tally.h): a period
 * plugin's decoded JSON and `tally_alloc` blocks live until the export call
 * ends. The SDK decodes each event with TALLY_JSON_LONE_SURROGATES, as
 * serde_json reads a value it skips: `tally_json_is_text` tells a string
 * that is text. */

/* ---- Logging -------------------------------------------------------------- */

#define TALLY_TRACE TALLY_PLUGIN_TYPES_LEVEL_TRACE
#define TALLY_DEBUG TALLY_PLUGIN_TYPES_LEVEL_DEBUG
#define TALLY_INFO TALLY_PLUGIN_TYPES_LEVEL_INFO
#define TALLY_WARN TALLY_PLUGIN_TYPES_LEVEL_WARN
#define TALLY_ERROR TALLY_PLUGIN_TYPES_LEVEL_ERROR

/** Writes one line to the host's log (rate-limited, labelled with the job). */
void tally_log(tally_plugin_types_level_t level, const char *message);

/* ---- What an event says about itself -------------------------------------- */

/** Bytes the plugin points the SDK at (UTF-8 text); the SDK copies them. */
typedef struct tally_str {
    const uint8_t *bytes;
    size_t len;
} tally_str;

/** A string's text (`string` must be a string). */
tally_str tally_str_of(const tally_json *string);
/** A NUL-terminated string. */
tally_str tally_str_c(const char *text);

/** An instant as the host read an event's time. */
typedef struct tally_instant {
    /** Seconds since 1970-01-01T00:00:00Z. */
    int64_t seconds;
    /** Nanoseconds within the second (0 to 999,999,999). */
    uint32_t nanoseconds;
} tally_instant;

/** How an event's time is written. */
typedef enum tally_time_kind {
    /** An RFC 3339 instant with its offset; the host parses it. */
    TALLY_TIME_RFC3339,
    /** Milliseconds since the Unix epoch. */
    TALLY_TIME_UNIX_MILLIS,
} tally_time_kind;

/** When an event happened, as found in it. */
typedef struct tally_event_time {
    tally_time_kind kind;
    tally_str rfc3339;
    int64_t unix_millis;
} tally_event_time;

/** An RFC 3339 event time. */
tally_event_time tally_time_rfc3339(tally_str text);
/** An event time in milliseconds since the Unix epoch. */
tally_event_time tally_time_unix_millis(int64_t millis);

/** Most fields an aggregation key has (the host's limit). */
#define TALLY_MAX_KEY_FIELDS 16

/** One field of an aggregation key. */
typedef struct tally_key_field {
    tally_str name, value;
} tally_key_field;

/** What an event says about itself (its addend is written separately). */
typedef struct tally_facts {
    /** The producer's id of the event; a retry carries the same (at most 256 bytes). */
    tally_str id;
    /** When it happened. */
    tally_event_time time;
    /** The aggregation key's fields, in order (`customer`, `metric`): each
     * period is one key's, and its records carry these fields. */
    tally_key_field key[TALLY_MAX_KEY_FIELDS];
    size_t key_count;
    /** The customer whose time zone decides the event's period. */
    tally_str customer;
} tally_facts;

/** Appends a field to the facts' key (a key of more than
 * TALLY_MAX_KEY_FIELDS fields traps: a plugin bug). */
void tally_facts_key(tally_facts *facts, const char *name, tally_str value);

/* ---- A period aggregation -------------------------------------------------- */

/** The aggregation of a period job, over the plugin's own `addend` and
 * `state` structs. Addends and states travel as JSON (the host keeps
 * them): `write_*` writes one, `read_*` reads what `write_*` wrote. A
 * callback returning false refuses, with the reason written to `why`. */
typedef struct tally_periods {
    /** sizeof the plugin's addend struct. */
    size_t addend_size;
    /** sizeof the plugin's state struct. */
    size_t state_size;
    /** Reads the job's `[plugin_config]` (decoded; `{}` when the job has
     * none) once per instance, before anything else; false refuses the job
     * with `why`. NULL: any configuration is fine. (Called again, it reads
     * the new configuration: keep the last one accepted.) */
    bool (*configure)(const tally_json *config, tally_text *why);
    /** What `event` (a record's decoded JSON, any kind) says about itself
     * (`facts`, zeroed) and adds to its period (`addend`, addend_size
     * zeroed bytes); false dead-letters the event with `why`. */
    bool (*describe)(const tally_json *event, tally_facts *facts, void *addend, tally_text *why);
    /** Writes an addend as JSON. */
    void (*write_addend)(const void *addend, tally_text *out);
    /** Reads an addend `write_addend` wrote; false: it is not one. */
    bool (*read_addend)(const tally_json *json, void *addend);
    /** Adds `addend` (of an event at `time`, as the host read it) to
     * `state`: `first` when the period has no event yet (then `state` is
     * zeroed). False refuses the event (the whole call then counts for
     * nothing, so `state` may be left half-changed). */
    bool (*add)(void *state, bool first, tally_instant time, const void *addend, tally_text *why);
    /** Reads a state `write_state` wrote; false: it is not one. */
    bool (*read_state)(const tally_json *json, void *state);
    /** Writes a state as JSON. */
    void (*write_state)(const void *state, tally_text *out);
    /** The value of a period whose state is `state`: what its FINAL and
     * ADJUSTMENT records carry. */
    uint64_t (*value)(const void *state);
} tally_periods;

/** One addition of an `add` call, as the SDK folds it. */
typedef struct tally_addition {
    /** Index of the period's state. */
    uint32_t period;
    /** The event's time. */
    tally_instant time;
    /** The event's addend, as `write_addend` wrote it. */
    const uint8_t *addend;
    size_t addend_len;
} tally_addition;

/* The plumbing TALLY_EXPORT_PERIODS wires to the exports (also usable
 * directly, e.g. from a test of the plugin's pieces). */

/** `configure`: decodes `config` and hands it to `spec->configure`;
 * false with `why` when the job is refused. */
bool tally_periods_configure(const tally_periods *spec, const uint8_t *config, size_t len, tally_text *why);
/** `describe` of one record: false with `why` when it is refused; else
 * `facts` and the addend's JSON (`addend`). Call `tally_periods_done`
 * after reading them. */
bool tally_periods_describe_one(const tally_periods *spec, const uint8_t *record, size_t len, tally_facts *facts,
                                tally_text *addend, tally_text *why);
/** Folds `additions` into `states` (`states[i] == NULL`: a period without
 * an event yet): false with the first refused addition's index and why;
 * else each period's state written to `out[i]` (texts the caller frees). */
bool tally_periods_add_all(const tally_periods *spec, const uint8_t *const *states, const size_t *state_lens,
                           size_t state_count, const tally_addition *additions, size_t addition_count, tally_text *out,
                           uint32_t *refused, tally_text *why);
/** The value of the period whose state is `state` (a state that does not
 * decode traps, logging why). */
uint64_t tally_periods_value_of(const tally_periods *spec, const uint8_t *state, size_t len);
/** Frees what the SDK allocated for the current call (`tally_alloc`). */
void tally_periods_done(void);

void tally_periods_export_configure(const tally_periods *spec, periods_plugin_string_t *config, bool *ok,
                                    periods_plugin_string_t *err);
void tally_periods_export_describe(const tally_periods *spec, exports_tally_plugin_periods_list_event_t *events,
                                   exports_tally_plugin_periods_list_result_event_facts_string_t *ret);
bool tally_periods_export_add(const tally_periods *spec, periods_plugin_list_option_list_u8_t *states,
                              periods_plugin_list_list_u8_t *addends, exports_tally_plugin_periods_list_addition_t *additions,
                              periods_plugin_list_list_u8_t *ret, exports_tally_plugin_periods_refusal_t *err);
uint64_t tally_periods_export_value(const tally_periods *spec, periods_plugin_list_u8_t *state);

/** Exports `spec` (a `tally_periods`) as the plugin's `configure`,
 * `describe`, `add` and `value`. Use it once, at the top level. */
#define TALLY_EXPORT_PERIODS(spec)                                                                                   \
    bool exports_tally_plugin_config_configure(periods_plugin_string_t *config, periods_plugin_string_t *err) {    \
        bool ok;                                                                                                     \
        tally_periods_export_configure(&(spec), config, &ok, err);                                                   \
        return ok;                                                                                                   \
    }                                                                                                                \
    void exports_tally_plugin_periods_describe(exports_tally_plugin_periods_list_event_t *events,                    \
                                               exports_tally_plugin_periods_list_result_event_facts_string_t *ret) { \
        tally_periods_export_describe(&(spec), events, ret);                                                         \
    }                                                                                                                \
    bool exports_tally_plugin_periods_add(periods_plugin_list_option_list_u8_t *states,                              \
                                          periods_plugin_list_list_u8_t *addends,                                    \
                                          exports_tally_plugin_periods_list_addition_t *additions,                   \
                                          periods_plugin_list_list_u8_t *ret, exports_tally_plugin_periods_refusal_t *err) { \
        return tally_periods_export_add(&(spec), states, addends, additions, ret, err);                              \
    }                                                                                                                \
    uint64_t exports_tally_plugin_periods_value(periods_plugin_list_u8_t *state) {                                   \
        return tally_periods_export_value(&(spec), state);                                                           \
    }

#ifdef __cplusplus
}
#endif

#endif
