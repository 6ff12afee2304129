/*
 * Tally's C SDK: write an aggregation plugin as a few functions over your
 * own event and state structs, build it with `tally plugin build <dir>`
 * into a component that imports nothing but `tally:plugin` (state, output,
 * log).
 *
 *   typedef struct { const tally_json *key; uint64_t n; } event;
 *
 *   static bool decode(const uint8_t *value, size_t len, void *out, tally_text *why) {
 *       event *e = out;
 *       tally_json json;
 *       if (!tally_json_decode(value, len, 0, &json, why)) return false;
 *       e->key = tally_json_get(&json, "key");
 *       if (!e->key || !tally_json_u64(tally_json_get(&json, "n"), &e->n)) return tally_reject(why, "want {\"key\":…,\"n\":…}");
 *       return true;
 *   }
 *   ...
 *   static const tally_aggregate counter = {
 *       .output = "counts", .event_size = sizeof(event), .state_size = sizeof(uint64_t),
 *       .decode = decode, .key = key, .initial = initial, .read_state = read_state,
 *       .write_state = write_state, .apply = apply, .emit = emit,
 *   };
 *   TALLY_EXPORT(counter)
 *
 * The semantics are the Rust SDK's (`sdk/rust/src/aggregate.rs`), so a
 * plugin ported between them computes the same bytes: one state read and
 * one write per batch, keys and states stored as JSON, an emitted record
 * keyed by its state key, rejections in event order. See docs/sdk-c.md.
 *
 * Memory: everything the SDK hands a callback (decoded JSON, the event and
 * state structs) lives until the batch ends; allocate what an event or
 * state points to with `tally_alloc`, which is freed with the batch.
 */
#ifndef TALLY_H
#define TALLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Text being written: keys, states, outputs, reasons ---------------- */

/** A growing byte buffer. */
typedef struct tally_text {
    uint8_t *bytes;
    size_t len;
    size_t cap;
} tally_text;

/** Appends `len` bytes. */
void tally_text_bytes(tally_text *text, const void *bytes, size_t len);
/** Appends a NUL-terminated string. */
void tally_text_str(tally_text *text, const char *str);
/** Appends an unsigned integer in decimal. */
void tally_text_u64(tally_text *text, uint64_t value);
/** Appends a signed integer in decimal. */
void tally_text_i64(tally_text *text, int64_t value);
/** Appends UTF-8 `utf8` as a JSON string, quoted and escaped as serde_json
 * writes it (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other controls as
 * `\u00XX`; everything else as is). */
void tally_text_json_string(tally_text *text, const uint8_t *utf8, size_t len);

/** Frees a text's bytes (the SDK frees the texts it hands callbacks). */
void tally_text_free(tally_text *text);

/** Sets `why` to `reason` and returns false: `return tally_reject(why, "…");`. */
bool tally_reject(tally_text *why, const char *reason);

/* ---- JSON values, decoded strictly ------------------------------------- */

/** What a JSON value is. */
typedef enum tally_json_kind {
    TALLY_JSON_NULL,
    TALLY_JSON_FALSE,
    TALLY_JSON_TRUE,
    TALLY_JSON_NUMBER,
    TALLY_JSON_STRING,
    TALLY_JSON_ARRAY,
    TALLY_JSON_OBJECT,
} tally_json_kind;

/** One decoded JSON value (it lives until the batch ends). */
typedef struct tally_json {
    tally_json_kind kind;
    /** A string's UTF-8 (escapes resolved), or a number's source text. */
    const uint8_t *text;
    size_t len;
    /** A string holding a lone surrogate escape (`"\ud800"`, kept as WTF-8;
     * only with TALLY_JSON_LONE_SURROGATES). */
    bool lone_surrogate;
    /** Items of an array, members of an object. */
    size_t count;
    /** An array's items, an object's values. */
    struct tally_json *items;
    /** An object's names (strings), one per value. */
    struct tally_json *names;
} tally_json;

/** Most nesting a decoded value may have (as serde_json's limit). */
#define TALLY_JSON_MAX_DEPTH 128
/** Keep strings with lone surrogate escapes instead of refusing them. */
#define TALLY_JSON_LONE_SURROGATES 1

/** Decodes one JSON value from `bytes` as strictly as serde_json: UTF-8
 * only, RFC 8259 (no comments, trailing commas, leading zeros, NaN), at
 * most TALLY_JSON_MAX_DEPTH levels. Numbers keep their source text (see
 * `tally_json_u64`). On failure returns false with `why` set to "event is
 * not UTF-8" or "event is not valid JSON" (the other SDKs' reasons). */
bool tally_json_decode(const uint8_t *bytes, size_t len, int flags, tally_json *out, tally_text *why);
/** The last value of member `name` of `object`; NULL when it has none or
 * `object` is NULL or not an object. */
const tally_json *tally_json_get(const tally_json *object, const char *name);
/** How many times `object` gives member `name`. */
size_t tally_json_count(const tally_json *object, const char *name);
/** Whether `value` is a string (NULL is not). */
bool tally_json_is_string(const tally_json *value);
/** Whether `value` is a number (NULL is not). */
bool tally_json_is_number(const tally_json *value);
/** `number` as a u64 when it is written as an integer without sign,
 * fraction or exponent, at most 2^64 - 1. */
bool tally_json_u64(const tally_json *number, uint64_t *out);
/** Whether `number` reads as a finite double (`1e400` does not). */
bool tally_json_finite(const tally_json *number);
/** Whether two strings hold the same text. */
bool tally_json_string_is(const tally_json *string, const char *text);

/* ---- Memory for the batch ---------------------------------------------- */

/** `size` bytes (8-aligned, zeroed) freed when the batch ends. */
void *tally_alloc(size_t size);

/* ---- Logging ----------------------------------------------------------- */

#define TALLY_TRACE TALLY_PLUGIN_TYPES_LEVEL_TRACE
#define TALLY_DEBUG TALLY_PLUGIN_TYPES_LEVEL_DEBUG
#define TALLY_INFO TALLY_PLUGIN_TYPES_LEVEL_INFO
#define TALLY_WARN TALLY_PLUGIN_TYPES_LEVEL_WARN
#define TALLY_ERROR TALLY_PLUGIN_TYPES_LEVEL_ERROR

/** Writes one line to the host's log (rate-limited, labelled with the job). */
void tally_log(tally_plugin_types_level_t level, const char *message);

/* ---- A keyed aggregation ----------------------------------------------- */

/** A keyed aggregation over the plugin's own `event` and `state` structs.
 * A callback returning false refuses the event, with the reason written to
 * `why`; the state and outputs stay as they were. */
typedef struct tally_aggregate {
    /** The output emitted records go to (the job declares it). */
    const char *output;
    /** sizeof the plugin's event struct. */
    size_t event_size;
    /** sizeof the plugin's state struct. */
    size_t state_size;
    /** Decodes a record's value into `event` (event_size zeroed bytes). */
    bool (*decode)(const uint8_t *value, size_t len, void *event, tally_text *why);
    /** Writes the event's state key, as JSON, to `key`. */
    bool (*key)(const void *event, tally_text *key, tally_text *why);
    /** The state of a key never written. */
    void (*initial)(void *state);
    /** Reads a stored state (the JSON `write_state` wrote); false traps. */
    bool (*read_state)(const tally_json *stored, void *state);
    /** Writes a state as JSON. */
    void (*write_state)(const void *state, tally_text *out);
    /** Applies the event to `state` (a copy: a refusal leaves the real one). */
    bool (*apply)(void *state, const void *event, tally_text *why);
    /** Writes what to emit after an update; NULL, or returning false, emits nothing. */
    bool (*emit)(const void *state, tally_text *out);
} tally_aggregate;

/** Runs one batch through `spec` (what TALLY_EXPORT's `process` does). */
void tally_process(const tally_aggregate *spec, exports_tally_plugin_aggregator_list_event_t *events,
                   exports_tally_plugin_aggregator_list_rejection_t *ret);

/** Exports `spec` (a `tally_aggregate`) as the plugin's `process`. */
#define TALLY_EXPORT(spec)                                                                               \
    void exports_tally_plugin_aggregator_process(exports_tally_plugin_aggregator_list_event_t *events,   \
                                                 exports_tally_plugin_aggregator_list_rejection_t *ret) { \
        tally_process(&(spec), events, ret);                                                             \
    }

/** For the raw interface (a plugin that defines
 * `exports_tally_plugin_aggregator_process` itself, with the bindings in
 * plugin.h): frees the batch's events, which `process` owns. */
void tally_free_events(exports_tally_plugin_aggregator_list_event_t *events);

#ifdef __cplusplus
}
#endif

#endif
