/* Tally's C SDK: see tally.h. It takes the text writer, the arena, UTF-8
 * and JSON from tally_json.c (shared with tally_periods.c), compiled here
 * as part of this file. Uses only malloc, realloc, free and the mem*
 * functions of libc, so a plugin built on it imports no WASI at all. */
#include "tally.h"

#include <stdlib.h>
#include <string.h>

#define TALLY_JSON_IMPLEMENTATION
#include "tally_json.c"

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
    exports_tally_plugin_aggregator_rejection_t *rejections = checked_array(n, sizeof *rejections);
    size_t rejected = 0;
    accepted *taken = checked_array(n, sizeof *taken);
    size_t accepted_count = 0;
    slot *slots = checked_array(n, sizeof *slots);
    size_t slot_count = 0;
    size_t table_size = 16;
    while (table_size < 2 * n) table_size *= 2;
    uint32_t *table = checked_array(table_size, sizeof *table); /* slot + 1, 0 when empty */
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
        plugin_list_u8_t *keys = checked_array(slot_count, sizeof *keys);
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

        tally_plugin_types_output_record_t *records = checked_array(accepted_count, sizeof *records);
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

        plugin_tuple2_list_u8_list_u8_t *entries = checked_array(slot_count, sizeof *entries);
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
        merged = checked_array(rejected, sizeof *merged);
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
    arena_release(false);
}
