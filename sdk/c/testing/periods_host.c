/* The in-memory host of tally_periods_testing.h: it defines the `log`
 * import periods_plugin.h declares and calls the plugin's exports directly,
 * handing buffers over and freeing results as the component model does
 * (an empty buffer as a pointer that is not malloc's, results freed only
 * when non-empty, as the bindings' post-return does), so the sanitizers
 * catch a plugin or SDK that frees, leaks or overruns what it should not. */
#include <stdlib.h>
#include <string.h>

#include "periods_plugin.h"
#include "tally_periods_testing.h"

#include "host_common.c"

static char *text(const void *bytes, size_t len) {
    char *out = grow(NULL, len + 1);
    if (len) memcpy(out, bytes, len);
    out[len] = 0;
    return out;
}

/* Frees a result as the bindings' post-return does: only when non-empty. */
static void release(void *ptr, size_t len) {
    if (len) free(ptr);
}

/* Every text the driver handed out since the last call of a kind. */
typedef struct pool {
    char **texts;
    size_t count;
} pool;

static char *pooled(pool *p, char *t) {
    p->texts = grow(p->texts, (p->count + 1) * sizeof *p->texts);
    p->texts[p->count++] = t;
    return t;
}

static void drain(pool *p) {
    for (size_t i = 0; i < p->count; i++) free(p->texts[i]);
    free(p->texts);
    *p = (pool){0};
}

static pool configure_pool, describe_pool, add_pool;
static tally_test_facts *described;
static const char **folded_states;

/* Frees what the driver holds when the test program ends (LeakSanitizer). */
static void forget_all(void) {
    drain(&configure_pool);
    drain(&describe_pool);
    drain(&add_pool);
    free(described);
    free(folded_states);
}

static void remember_exit(void) {
    static bool registered;
    if (!registered) atexit(forget_all);
    registered = true;
}

void tally_plugin_log_log(tally_plugin_log_level_t level, periods_plugin_string_t *message) {
    static const char *const names[] = {"trace", "debug", "info", "warn", "error"};
    fprintf(stderr, "plugin log %s: %.*s\n", level < 5 ? names[level] : "?", (int)message->len, (const char *)message->ptr);
}

const char *tally_test_configure(const char *config) {
    remember_exit();
    drain(&configure_pool);
    size_t len = strlen(config);
    periods_plugin_string_t arg = {handed(config, len), len}, err = {NULL, 0};
    if (exports_tally_plugin_config_configure(&arg, &err)) return NULL;
    char *reason = pooled(&configure_pool, text(err.ptr, err.len));
    release(err.ptr, err.len);
    return reason;
}

static const char *string_of(periods_plugin_string_t *s) {
    char *t = pooled(&describe_pool, text(s->ptr, s->len));
    release(s->ptr, s->len);
    return t;
}

const tally_test_facts *tally_test_describe_bytes(const uint8_t *const *records, const size_t *lengths, size_t count) {
    remember_exit();
    drain(&describe_pool);
    exports_tally_plugin_periods_list_event_t events = {count ? grow(NULL, count * sizeof *events.ptr) : (void *)EMPTY, count};
    for (size_t i = 0; i < count; i++)
        events.ptr[i] = (exports_tally_plugin_periods_event_t){0, i, {false, 0}, {false, {NULL, 0}}, {handed(records[i], lengths[i]), lengths[i]}};
    exports_tally_plugin_periods_list_result_event_facts_string_t results = {NULL, 0};
    exports_tally_plugin_periods_describe(&events, &results);
    if (results.len != count) {
        fprintf(stderr, "describe gave %zu results for %zu events\n", results.len, count);
        abort();
    }
    described = grow(described, (count ? count : 1) * sizeof *described);
    for (size_t i = 0; i < count; i++) {
        tally_test_facts *f = &described[i];
        *f = (tally_test_facts){0};
        exports_tally_plugin_periods_result_event_facts_string_t *r = &results.ptr[i];
        if (r->is_err) {
            f->reason = string_of(&r->val.err);
            continue;
        }
        exports_tally_plugin_periods_event_facts_t *ok = &r->val.ok;
        f->ok = true;
        f->id = string_of(&ok->id);
        if (ok->time.tag == TALLY_PLUGIN_TYPES_EVENT_TIME_UNIX_MILLIS) {
            f->unix_millis = true;
            f->millis = ok->time.val.unix_millis;
        } else {
            f->time = string_of(&ok->time.val.rfc3339);
        }
        f->key_count = ok->key.len;
        for (size_t k = 0; k < ok->key.len; k++) {
            if (k < 16) {
                f->key_names[k] = string_of(&ok->key.ptr[k].f0);
                f->key_values[k] = string_of(&ok->key.ptr[k].f1);
            } else {
                release(ok->key.ptr[k].f0.ptr, ok->key.ptr[k].f0.len);
                release(ok->key.ptr[k].f1.ptr, ok->key.ptr[k].f1.len);
            }
        }
        release(ok->key.ptr, ok->key.len);
        f->customer = string_of(&ok->customer);
        f->addend = pooled(&describe_pool, text(ok->addend.ptr, ok->addend.len));
        release(ok->addend.ptr, ok->addend.len);
    }
    release(results.ptr, results.len);
    return described;
}

const tally_test_facts *tally_test_describe(const char *const *records, size_t count) {
    const uint8_t **bytes = grow(NULL, (count ? count : 1) * sizeof *bytes);
    size_t *lengths = grow(NULL, (count ? count : 1) * sizeof *lengths);
    for (size_t i = 0; i < count; i++) {
        bytes[i] = (const uint8_t *)records[i];
        lengths[i] = strlen(records[i]);
    }
    const tally_test_facts *facts = tally_test_describe_bytes(bytes, lengths, count);
    free(bytes);
    free(lengths);
    return facts;
}

tally_test_folded tally_test_add(const char *const *states, size_t state_count, const char *const *addends, size_t addend_count,
                                 const tally_test_addition *additions, size_t addition_count) {
    remember_exit();
    drain(&add_pool);
    periods_plugin_list_option_list_u8_t state_list = {state_count ? grow(NULL, state_count * sizeof *state_list.ptr) : (void *)EMPTY,
                                                       state_count};
    for (size_t i = 0; i < state_count; i++) {
        size_t len = states[i] ? strlen(states[i]) : 0;
        state_list.ptr[i] = (periods_plugin_option_list_u8_t){states[i] != NULL, {states[i] ? handed(states[i], len) : NULL, len}};
    }
    periods_plugin_list_list_u8_t addend_list = {addend_count ? grow(NULL, addend_count * sizeof *addend_list.ptr) : (void *)EMPTY,
                                                 addend_count};
    for (size_t i = 0; i < addend_count; i++) {
        size_t len = strlen(addends[i]);
        addend_list.ptr[i] = (periods_plugin_list_u8_t){handed(addends[i], len), len};
    }
    exports_tally_plugin_periods_list_addition_t addition_list = {
        addition_count ? grow(NULL, addition_count * sizeof *addition_list.ptr) : (void *)EMPTY, addition_count};
    for (size_t i = 0; i < addition_count; i++)
        addition_list.ptr[i] = (exports_tally_plugin_periods_addition_t){
            additions[i].period, {additions[i].seconds, additions[i].nanoseconds}, additions[i].addend};
    periods_plugin_list_list_u8_t ok = {NULL, 0};
    exports_tally_plugin_periods_refusal_t err = {0, {NULL, 0}};
    tally_test_folded folded = {0};
    if (exports_tally_plugin_periods_add(&state_list, &addend_list, &addition_list, &ok, &err)) {
        folded_states = grow(folded_states, (ok.len ? ok.len : 1) * sizeof *folded_states);
        for (size_t i = 0; i < ok.len; i++) {
            folded_states[i] = pooled(&add_pool, text(ok.ptr[i].ptr, ok.ptr[i].len));
            release(ok.ptr[i].ptr, ok.ptr[i].len);
        }
        release(ok.ptr, ok.len);
        folded = (tally_test_folded){true, ok.len, folded_states, 0, NULL};
    } else {
        folded.refused = err.addition;
        folded.reason = pooled(&add_pool, text(err.reason.ptr, err.reason.len));
        release(err.reason.ptr, err.reason.len);
    }
    return folded;
}

tally_test_folded tally_test_fold(const char *state, const char *const *addends, const int64_t *seconds, size_t count) {
    tally_test_addition *additions = grow(NULL, (count ? count : 1) * sizeof *additions);
    for (size_t i = 0; i < count; i++) additions[i] = (tally_test_addition){0, seconds[i], 0, (uint32_t)i};
    tally_test_folded folded = tally_test_add((const char *const[]){state}, 1, addends, count, additions, count);
    free(additions);
    return folded;
}

uint64_t tally_test_value(const char *state) {
    size_t len = strlen(state);
    periods_plugin_list_u8_t arg = {handed(state, len), len};
    return exports_tally_plugin_periods_value(&arg);
}
