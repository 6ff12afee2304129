/* The period SDK's own tests (`make -C sdk/c test`): records are decoded
 * in the order of checks every SDK uses (UTF-8, then JSON at most 128
 * deep); values keep their text as written; `describe` hands each event's
 * facts and addend over; `add` checks its arguments as the Rust SDK does,
 * decodes each state once, folds in order, returns the first refusal and
 * writes each state once; `value` reads a state. A small plugin: events
 * `{"id":…,"who":…,"ts":…|millis,"n":…}` counted per `who`, an `n` over
 * 100 refused when added, a state written `{"n":…,"reads":…}`. */
#include <stdlib.h>

#include "tally_periods.h"
#include "tally_periods_testing.h"

#define ARRAY(...) ((const char *const[]){__VA_ARGS__})
#define COUNT(...) (sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))
#define DESCRIBE(...) tally_test_describe(ARRAY(__VA_ARGS__), COUNT(__VA_ARGS__))

typedef struct tally_counted {
    uint64_t n;
} tally_counted;

/* How many states `read_state` decoded, and the last `add` saw. */
static int state_reads;
static tally_instant last_time;
static bool last_first;
static char *required_field; /* kept from the configuration */

static bool configure(const tally_json *config, tally_text *why) {
    const tally_json *field = tally_json_get(config, "require");
    if (field && !tally_json_is_text(field)) return tally_reject(why, "require must be a string");
    free(required_field);
    required_field = NULL;
    if (field) {
        required_field = calloc(1, field->len + 1);
        memcpy(required_field, field->text, field->len);
    }
    return true;
}

static bool describe(const tally_json *event, tally_facts *facts, void *addend, tally_text *why) {
    const tally_json *id = tally_json_get(event, "id"), *who = tally_json_get(event, "who"), *ts = tally_json_get(event, "ts"),
                     *n = tally_json_get(event, "n");
    if (event->kind != TALLY_JSON_OBJECT) return tally_reject(why, "want an object");
    if (!tally_json_is_text(id) || !tally_json_is_text(who)) return tally_reject(why, "want text id and who");
    if (required_field && !tally_json_get(event, required_field)) return tally_reject(why, "a required field is missing");
    int64_t millis;
    if (tally_json_is_text(ts)) facts->time = tally_time_rfc3339(tally_str_of(ts));
    else if (tally_json_i64(ts, &millis)) facts->time = tally_time_unix_millis(millis);
    else return tally_reject(why, "want ts");
    if (!tally_json_u64(n, &((tally_counted *)addend)->n)) {
        why->len = 0;
        tally_text_str(why, "n as written: ");
        tally_text_bytes(why, n ? n->raw : (const uint8_t *)"", n ? n->raw_len : 0);
        return false;
    }
    facts->id = tally_str_of(id);
    tally_facts_key(facts, "who", tally_str_of(who));
    tally_facts_key(facts, "kind", tally_str_c("calls"));
    facts->customer = tally_str_of(who);
    return true;
}

static void write_n(const void *counted, tally_text *out) {
    tally_text_str(out, "{\"n\":");
    tally_text_u64(out, ((const tally_counted *)counted)->n);
    tally_text_str(out, "}");
}

static bool read_n(const tally_json *json, void *counted) {
    return json->kind == TALLY_JSON_OBJECT && json->count == 1 && tally_json_u64(tally_json_get(json, "n"), &((tally_counted *)counted)->n);
}

static bool read_state(const tally_json *json, void *counted) {
    state_reads++;
    return read_n(json, counted);
}

static bool add(void *state, bool first, tally_instant time, const void *addend, tally_text *why) {
    last_time = time;
    last_first = first;
    uint64_t n = ((const tally_counted *)addend)->n;
    if (n > 100) return tally_reject(why, "n over 100");
    if (first && ((tally_counted *)state)->n != 0) return tally_reject(why, "a first state is not zeroed");
    ((tally_counted *)state)->n += n;
    return true;
}

static uint64_t value(const void *state) { return ((const tally_counted *)state)->n; }

static const tally_periods calls = {
    .addend_size = sizeof(tally_counted),
    .state_size = sizeof(tally_counted),
    .configure = configure,
    .describe = describe,
    .write_addend = write_n,
    .read_addend = read_n,
    .add = add,
    .read_state = read_state,
    .write_state = write_n,
    .value = value,
};
TALLY_EXPORT_PERIODS(calls)

static void configure_hands_the_config_over_and_its_refusal_back(void) {
    TALLY_CHECK_STR(tally_test_configure("{\"require\":5}"), "require must be a string");
    TALLY_CHECK_STR(tally_test_configure("{\"require\":"), "[plugin_config] does not fit this plugin: it is not JSON");
    TALLY_CHECK_STR(tally_test_configure("{\"a\":1e400}"), "[plugin_config] does not fit this plugin: it is not JSON");
    TALLY_CHECK_STR(tally_test_configure("{\"a\":\"\\ud800\"}"), "[plugin_config] does not fit this plugin: it is not JSON");
    TALLY_CHECK(tally_test_configure("{\"require\":\"x\\u00e9\"}") == NULL);
    TALLY_CHECK_STR(DESCRIBE("{\"id\":\"1\",\"who\":\"a\",\"ts\":\"t\",\"n\":1}")[0].reason, "a required field is missing");
    TALLY_CHECK(DESCRIBE("{\"id\":\"1\",\"who\":\"a\",\"ts\":\"t\",\"n\":1,\"x\\u00e9\":0}")[0].ok);
    TALLY_CHECK(tally_test_configure("{}") == NULL);
}

static void records_are_checked_utf8_then_json_then_by_the_plugin(void) {
    TALLY_CHECK(tally_test_configure("{}") == NULL);
    static const struct {
        const char *record, *reason;
    } cases[] = {
        {"{\"id\":\"\xff\"", "event is not UTF-8"}, /* not UTF-8 before not JSON */
        {"\xed\xa0\x80", "event is not UTF-8"},
        {"\xc0\x80", "event is not UTF-8"},
        {"", "event is not valid JSON"},
        {"{\"a\":1,}", "event is not valid JSON"},
        {"[01]", "event is not valid JSON"},
        {"{\"a\":\"\\x\"}", "event is not valid JSON"},
        {"{\"a\":\"\\ud800\\u12\"}", "event is not valid JSON"},
        {"{} {}", "event is not valid JSON"},
        {"\xef\xbb\xbf{}", "event is not valid JSON"},
        {"[]", "want an object"},
        {"{\"id\":\"\\ud800\",\"who\":\"a\"}", "want text id and who"}, /* kept, marked: the plugin decides */
        {"{\"id\":\"1\",\"who\":\"a\",\"ts\":\"t\",\"n\":  -1.5e3 }", "n as written: -1.5e3"},
        {"{\"id\":\"1\",\"who\":\"a\",\"ts\":\"t\",\"n\":{ \"a\" : [ 1 , \"\\u0041\" ] }}", "n as written: { \"a\" : [ 1 , \"\\u0041\" ] }"},
        {"{\"id\":\"1\",\"who\":\"a\",\"ts\":\"t\",\"n\":\"\\\"q\\\"\"}", "n as written: \"\\\"q\\\"\""},
        {"{\"id\":\"1\",\"who\":\"a\",\"ts\":9223372036854775808,\"n\":1}", "want ts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const tally_test_facts *f = DESCRIBE(cases[i].record);
        if (f[0].ok) tally_test_fail(__FILE__, __LINE__, cases[i].record, "described", cases[i].reason);
        else TALLY_CHECK_STR(f[0].reason, cases[i].reason);
    }
    char deep[600];
    for (int depth = 127; depth <= 129; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        deep[2 * depth] = 0;
        TALLY_CHECK_STR(DESCRIBE(deep)[0].reason, depth <= 128 ? "want an object" : "event is not valid JSON");
    }
    /* An empty record, as the host hands it (no allocation). */
    const uint8_t *empty[] = {(const uint8_t *)""};
    TALLY_CHECK_STR(tally_test_describe_bytes(empty, (size_t[]){0}, 1)[0].reason, "event is not valid JSON");
    TALLY_CHECK(tally_test_describe(NULL, 0) != NULL);
}

static void describe_hands_facts_and_addends_over(void) {
    TALLY_CHECK(tally_test_configure("{}") == NULL);
    const tally_test_facts *f = DESCRIBE("{\"id\":\"e\\u00e9\",\"who\":\"\",\"ts\":\"2026-11-03T10:00:00Z\",\"n\":18446744073709551615}",
                                         "{\"id\":\"2\",\"who\":\"\\ud83d\\ude00\",\"ts\":-1700000000000,\"n\":0}", "nope");
    TALLY_CHECK(f[0].ok && f[1].ok && !f[2].ok);
    TALLY_CHECK_STR(f[0].id, "e\xc3\xa9");
    TALLY_CHECK(!f[0].unix_millis);
    TALLY_CHECK_STR(f[0].time, "2026-11-03T10:00:00Z");
    TALLY_CHECK(f[0].key_count == 2);
    TALLY_CHECK_STR(f[0].key_names[0], "who");
    TALLY_CHECK_STR(f[0].key_values[0], "");
    TALLY_CHECK_STR(f[0].key_names[1], "kind");
    TALLY_CHECK_STR(f[0].key_values[1], "calls");
    TALLY_CHECK_STR(f[0].customer, "");
    TALLY_CHECK_STR(f[0].addend, "{\"n\":18446744073709551615}");
    TALLY_CHECK(f[1].unix_millis && f[1].millis == -1700000000000);
    TALLY_CHECK_STR(f[1].customer, "\xf0\x9f\x98\x80");
    TALLY_CHECK_STR(f[2].reason, "event is not valid JSON");
}

static void add_folds_in_order_and_returns_the_first_refusal(void) {
    TALLY_CHECK(tally_test_configure("{}") == NULL);
    state_reads = 0;
    tally_test_folded folded = tally_test_add(ARRAY("{\"n\":5}", NULL, "{\"n\":1}"), 3, ARRAY("{\"n\":1}", "{\"n\":2}"), 2,
                                              (tally_test_addition[]){{1, 7, 9, 1}, {0, 1, 0, 0}, {1, 8, 0, 0}, {0, 1, 0, 1}}, 4);
    TALLY_CHECK(folded.ok && folded.count == 3 && state_reads == 2); /* each state decoded once */
    TALLY_CHECK_STR(folded.states[0], "{\"n\":8}");
    TALLY_CHECK_STR(folded.states[1], "{\"n\":3}");
    TALLY_CHECK_STR(folded.states[2], "{\"n\":1}"); /* no addition: written back as read */
    TALLY_CHECK(last_time.seconds == 1 && last_time.nanoseconds == 0 && !last_first);
    folded = tally_test_add(ARRAY(NULL), 1, ARRAY("{\"n\":1}"), 1, (tally_test_addition[]){{0, -5, 999999999, 0}}, 1);
    TALLY_CHECK(folded.ok && last_first && last_time.seconds == -5 && last_time.nanoseconds == 999999999);
    /* The first refused addition, by its index in the call. */
    folded = tally_test_add(ARRAY(NULL, "{\"n\":1}"), 2, ARRAY("{\"n\":1}", "{\"n\":101}"), 2,
                            (tally_test_addition[]){{0, 1, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 1}, {0, 1, 0, 1}}, 4);
    TALLY_CHECK(!folded.ok && folded.refused == 2);
    TALLY_CHECK_STR(folded.reason, "n over 100");
    /* Arguments the host never sends, checked as the Rust SDK checks them. */
    folded = tally_test_add(ARRAY(NULL), 1, ARRAY("{\"n\":101}"), 1, (tally_test_addition[]){{0, 1, 0, 0}, {0, 1, 0, 1}}, 2);
    TALLY_CHECK(!folded.ok && folded.refused == 1); /* addends are checked before anything is folded */
    TALLY_CHECK_STR(folded.reason, "the addition names addend 1, of 1");
    folded = tally_test_add(ARRAY(NULL), 1, ARRAY("{\"n\":1}"), 1, (tally_test_addition[]){{0, 1, 0, 0}, {3, 1, 0, 0}}, 2);
    TALLY_CHECK(!folded.ok && folded.refused == 1);
    TALLY_CHECK_STR(folded.reason, "the addition names period 3, of 1");
    folded = tally_test_add(ARRAY(NULL, "{\"n\":1}", "[]"), 3, ARRAY("{\"n\":1}"), 1, (tally_test_addition[]){{0, 1, 0, 0}}, 1);
    TALLY_CHECK(!folded.ok && folded.refused == 0);
    TALLY_CHECK_STR(folded.reason, "a period's state does not decode: it is not what this plugin writes");
    folded = tally_test_add(ARRAY(NULL), 1, ARRAY("{\"n\":1}", "{\"n\":-1}"), 2, (tally_test_addition[]){{0, 1, 0, 0}, {0, 1, 0, 1}}, 2);
    TALLY_CHECK(!folded.ok && folded.refused == 1);
    TALLY_CHECK_STR(folded.reason, "the event's addend is not the JSON this plugin makes: it is not what this plugin writes");
    folded = tally_test_add(ARRAY(NULL, NULL), 2, ARRAY("{\"n\":1}"), 1, (tally_test_addition[]){{0, 1, 0, 0}}, 1);
    TALLY_CHECK(!folded.ok && folded.refused == 0);
    TALLY_CHECK_STR(folded.reason, "period 1 has neither a state nor an addition");
    folded = tally_test_add(NULL, 0, NULL, 0, NULL, 0);
    TALLY_CHECK(folded.ok && folded.count == 0);
    /* A long fold: one decode, one write. */
    state_reads = 0;
    tally_test_addition many[1000];
    for (uint32_t i = 0; i < 1000; i++) many[i] = (tally_test_addition){0, i, 0, 0};
    folded = tally_test_add(ARRAY("{\"n\":18446744073709550615}"), 1, ARRAY("{\"n\":1}"), 1, many, 1000);
    TALLY_CHECK(folded.ok && state_reads == 1);
    TALLY_CHECK_STR(folded.states[0], "{\"n\":18446744073709551615}");
}

static void value_reads_a_state(void) {
    TALLY_CHECK(tally_test_configure("{}") == NULL);
    TALLY_CHECK(tally_test_value("{\"n\":18446744073709551615}") == UINT64_MAX);
    TALLY_CHECK(tally_test_value(" { \"n\" : 0 } ") == 0);
}

static void json_helpers_read_exactly(void) {
    tally_json json;
    tally_text why = {0}, text = {0};
    const char *doc = "{\"a\":-9223372036854775808,\"b\":9223372036854775807,\"c\":9223372036854775808,\"d\":-0,\"e\":\"\\ud800\","
                      "\"f\":[ true , null ],\"a\":1}";
    TALLY_CHECK(tally_json_decode((const uint8_t *)doc, strlen(doc), TALLY_JSON_LONE_SURROGATES, &json, &why));
    int64_t i = 0;
    TALLY_CHECK(tally_json_count(&json, "a") == 2 && tally_json_i64(tally_json_get(&json, "a"), &i) && i == 1);
    TALLY_CHECK(tally_json_i64(&json.items[0], &i) && i == INT64_MIN);
    TALLY_CHECK(tally_json_i64(tally_json_get(&json, "b"), &i) && i == INT64_MAX);
    TALLY_CHECK(!tally_json_i64(tally_json_get(&json, "c"), &i));
    TALLY_CHECK(tally_json_i64(tally_json_get(&json, "d"), &i) && i == 0);
    TALLY_CHECK(tally_json_is_string(tally_json_get(&json, "e")) && !tally_json_is_text(tally_json_get(&json, "e")));
    const tally_json *f = tally_json_get(&json, "f");
    TALLY_CHECK(f->raw_len == strlen("[ true , null ]") && memcmp(f->raw, "[ true , null ]", f->raw_len) == 0);
    TALLY_CHECK(json.raw == (const uint8_t *)doc && json.raw_len == strlen(doc));
    TALLY_CHECK(!tally_json_decode((const uint8_t *)doc, strlen(doc), 0, &json, &why));
    const char raw[] = "tab\t nl\n q\" bs\\ nul\0 us\x1f del\x7f \xc3\xa9 \b\f\r/";
    tally_text_json_string(&text, (const uint8_t *)raw, sizeof raw - 1);
    tally_text_bytes(&text, "", 1);
    TALLY_CHECK_STR((const char *)text.bytes, "\"tab\\t nl\\n q\\\" bs\\\\ nul\\u0000 us\\u001f del\x7f \xc3\xa9 \\b\\f\\r/\"");
    tally_text_free(&text);
    tally_text_free(&why);
    tally_periods_done();
}

int main(void) {
    configure_hands_the_config_over_and_its_refusal_back();
    records_are_checked_utf8_then_json_then_by_the_plugin();
    describe_hands_facts_and_addends_over();
    add_folds_in_order_and_returns_the_first_refusal();
    value_reads_a_state();
    json_helpers_read_exactly();
    free(required_field);
    return tally_test_failures() ? 1 : 0;
}
