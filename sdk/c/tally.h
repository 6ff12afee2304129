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
#include "tally_json.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Text, JSON and the arena (tally_json.h, shared with tally_periods.h):
 * decoded JSON and `tally_alloc` blocks live until the batch ends. */

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
