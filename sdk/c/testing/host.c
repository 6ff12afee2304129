/* The in-memory host of tally_testing.h: it defines the `tally:plugin`
 * imports plugin.h declares, and calls the plugin's `process` directly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"
#include "tally_testing.h"

#include "host_common.c"

typedef struct entry {
    uint8_t *key, *value;
    size_t key_len, value_len;
} entry;

static entry *entries;
static size_t entry_count, entry_cap;
static const char *const *declared;
static size_t declared_count;
static uint64_t next_offset;
static tally_test_record *emitted;
static size_t emitted_count, emitted_cap;
static tally_test_dead_letter *dead;
static size_t dead_count;
static char **logs;
static size_t log_count;

static uint8_t *copy(const void *bytes, size_t len, int terminate) {
    uint8_t *out = grow(NULL, len + (terminate ? 1 : 0));
    if (len) memcpy(out, bytes, len);
    if (terminate) out[len] = 0;
    return out;
}

static entry *find(const uint8_t *key, size_t len) {
    for (size_t i = 0; i < entry_count; i++)
        if (entries[i].key_len == len && memcmp(entries[i].key, key, len) == 0) return &entries[i];
    return NULL;
}

static void put(const plugin_list_u8_t *key, const plugin_list_u8_t *value) {
    entry *existing = find(key->ptr, key->len);
    if (!existing) {
        if (entry_count == entry_cap) entries = grow(entries, (entry_cap = entry_cap ? entry_cap * 2 : 16) * sizeof *entries);
        existing = &entries[entry_count++];
        existing->key = copy(key->ptr, key->len, 1);
        existing->key_len = key->len;
    } else {
        free(existing->value);
    }
    existing->value = copy(value->ptr, value->len, 1);
    existing->value_len = value->len;
}

static void delete(const plugin_list_u8_t *key) {
    entry *existing = find(key->ptr, key->len);
    if (!existing) return;
    free(existing->key);
    free(existing->value);
    *existing = entries[--entry_count];
}

bool tally_plugin_state_get(plugin_list_u8_t *key, plugin_list_u8_t *ret) {
    entry *existing = find(key->ptr, key->len);
    if (!existing) return false;
    *ret = (plugin_list_u8_t){handed(existing->value, existing->value_len), existing->value_len};
    return true;
}

void tally_plugin_state_get_many(plugin_list_list_u8_t *keys, plugin_list_option_list_u8_t *ret) {
    ret->len = keys->len;
    ret->ptr = keys->len ? grow(NULL, keys->len * sizeof *ret->ptr) : (void *)EMPTY;
    for (size_t i = 0; i < keys->len; i++) ret->ptr[i].is_some = tally_plugin_state_get(&keys->ptr[i], &ret->ptr[i].val);
}

void tally_plugin_state_put(plugin_list_u8_t *key, plugin_list_u8_t *value) { put(key, value); }

void tally_plugin_state_put_many(plugin_list_tuple2_list_u8_list_u8_t *pairs) {
    for (size_t i = 0; i < pairs->len; i++) put(&pairs->ptr[i].f0, &pairs->ptr[i].f1);
}

void tally_plugin_state_delete(plugin_list_u8_t *key) { delete(key); }

void tally_plugin_state_delete_many(plugin_list_list_u8_t *keys) {
    for (size_t i = 0; i < keys->len; i++) delete(&keys->ptr[i]);
}

void tally_plugin_output_emit(plugin_string_t *output, tally_plugin_output_output_record_t *record) {
    const char *name = NULL;
    for (size_t i = 0; i < declared_count; i++)
        if (strlen(declared[i]) == output->len && memcmp(declared[i], output->ptr, output->len) == 0) name = declared[i];
    if (!name) {
        fprintf(stderr, "the plugin emitted to `%.*s`, which the job does not declare\n", (int)output->len, (const char *)output->ptr);
        abort();
    }
    if (emitted_count == emitted_cap) emitted = grow(emitted, (emitted_cap = emitted_cap ? emitted_cap * 2 : 16) * sizeof *emitted);
    emitted[emitted_count++] = (tally_test_record){
        name, record->event, record->key.is_some ? (const char *)copy(record->key.val.ptr, record->key.val.len, 1) : NULL,
        (const char *)copy(record->value.ptr, record->value.len, 1)};
}

void tally_plugin_output_emit_many(plugin_string_t *output, tally_plugin_output_list_output_record_t *records) {
    for (size_t i = 0; i < records->len; i++) tally_plugin_output_emit(output, &records->ptr[i]);
}

void tally_plugin_log_log(tally_plugin_log_level_t level, plugin_string_t *message) {
    static const char *const names[] = {"trace", "debug", "info", "warn", "error"};
    const char *name = level < 5 ? names[level] : "?";
    size_t len = strlen(name) + 2 + message->len;
    char *line = grow(NULL, len + 1);
    snprintf(line, len + 1, "%s: %.*s", name, (int)message->len, (const char *)message->ptr);
    logs = grow(logs, (log_count + 1) * sizeof *logs);
    logs[log_count++] = line;
}

static void forget_sent(void) {
    for (size_t i = 0; i < emitted_count; i++) {
        free((void *)emitted[i].key);
        free((void *)emitted[i].value);
    }
    emitted_count = 0;
    for (size_t i = 0; i < dead_count; i++) free((void *)dead[i].reason);
    free(dead);
    dead = NULL;
    dead_count = 0;
}

void tally_test_start(const char *const *outputs, size_t count) {
    forget_sent();
    while (entry_count) delete(&(plugin_list_u8_t){entries[0].key, entries[0].key_len});
    declared = outputs;
    declared_count = count;
    next_offset = 0;
}

tally_sent tally_test_send_bytes(const uint8_t *const *records, const size_t *lengths, size_t count) {
    forget_sent();
    /* The plugin owns the batch, as it does a component's. */
    exports_tally_plugin_aggregator_list_event_t events = {count ? grow(NULL, count * sizeof *events.ptr) : (void *)EMPTY, count};
    uint64_t first = next_offset;
    for (size_t i = 0; i < count; i++)
        events.ptr[i] = (exports_tally_plugin_aggregator_event_t){
            0, next_offset++, {false, 0}, {false, {NULL, 0}}, {handed(records[i], lengths[i]), lengths[i]}};
    exports_tally_plugin_aggregator_list_rejection_t rejections = {NULL, 0};
    exports_tally_plugin_aggregator_process(&events, &rejections);
    dead = grow(NULL, rejections.len * sizeof *dead);
    for (size_t i = 0; i < rejections.len; i++) {
        dead[i] = (tally_test_dead_letter){first + rejections.ptr[i].index,
                                          (const char *)copy(rejections.ptr[i].reason.ptr, rejections.ptr[i].reason.len, 1)};
        free(rejections.ptr[i].reason.ptr);
    }
    dead_count = rejections.len;
    free(rejections.ptr);
    return (tally_sent){emitted, emitted_count, dead, dead_count};
}

tally_sent tally_test_send(const char *const *records, size_t count) {
    const uint8_t **bytes = grow(NULL, count * sizeof *bytes);
    size_t *lengths = grow(NULL, count * sizeof *lengths);
    for (size_t i = 0; i < count; i++) {
        bytes[i] = (const uint8_t *)records[i];
        lengths[i] = strlen(records[i]);
    }
    tally_sent sent = tally_test_send_bytes(bytes, lengths, count);
    free(bytes);
    free(lengths);
    return sent;
}

const char *tally_test_state(const char *key) {
    entry *existing = find((const uint8_t *)key, strlen(key));
    return existing ? (const char *)existing->value : NULL;
}

size_t tally_test_state_count(void) { return entry_count; }

size_t tally_test_log_count(void) { return log_count; }

const char *tally_test_log(size_t index) { return index < log_count ? logs[index] : NULL; }
