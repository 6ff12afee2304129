/* The period billing plugin under a plain C test (`make test`), through
 * Tally's period test driver: docs/billing.md's "The period billing
 * plugin", row by row, and the Rust build's configuration errors. */
#include "tally_periods_testing.h"

#define ARRAY(...) ((const char *const[]){__VA_ARGS__})
#define COUNT(...) (sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))
#define DESCRIBE(...) tally_test_describe(ARRAY(__VA_ARGS__), COUNT(__VA_ARGS__))

static const char CONFIG[] = "{\"meters\":{\"calls\":\"sum\",\"requests\":\"count\",\"peak\":\"max\",\"gb\":\"latest\","
                             "\"seats\":{\"unique_count\":\"user\"},\"desks\":\"unique_count:user\","
                             "\"rooms\":{\"meter\":\"unique_count\",\"field\":\"room\"},\"ids\":\"unique_count:id\","
                             "\"qs\":\"unique_count:quantity\"}}";

/* The addend of one event (NULL when refused, and its reason checked). */
static const char *addend_of(const char *event) {
    const tally_test_facts *facts = DESCRIBE(event);
    if (!facts[0].ok) {
        tally_test_fail(__FILE__, __LINE__, event, facts[0].reason, "described");
        return NULL;
    }
    return facts[0].addend;
}

static void configured(void) { TALLY_CHECK(tally_test_configure(CONFIG) == NULL); }

static void facts_are_the_id_ts_customer_and_metric(void) {
    configured();
    const tally_test_facts *f =
        DESCRIBE("{\"ts\":\"2026-11-03T05:00:00-05:00\",\"quantity\":12,\"metric\":\"calls\",\"customer\":\"Zo\\u00eb \\\"co\\\"\",\"id\":\"e-1\",\"extra\":[1,{}]}");
    TALLY_CHECK(f[0].ok && !f[0].unix_millis && f[0].key_count == 2);
    TALLY_CHECK_STR(f[0].id, "e-1");
    TALLY_CHECK_STR(f[0].time, "2026-11-03T05:00:00-05:00");
    TALLY_CHECK_STR(f[0].key_names[0], "customer");
    TALLY_CHECK_STR(f[0].key_values[0], "Zo\xc3\xab \"co\"");
    TALLY_CHECK_STR(f[0].key_names[1], "metric");
    TALLY_CHECK_STR(f[0].key_values[1], "calls");
    TALLY_CHECK_STR(f[0].customer, "Zo\xc3\xab \"co\"");
    TALLY_CHECK_STR(f[0].addend, "{\"sum\":12}");
}

/* Every row of the first refusal table, in its order of checks. */
static void malformed_events_get_the_reasons_of_docs_billing_md(void) {
    configured();
    static const struct {
        const char *event, *reason;
    } cases[] = {
        {"{\"id\":\"x\xff\"}", "event is not UTF-8"},
        {"{\"id\":\"x\",}", "event is not valid JSON"},
        {"{\"id\":\"x\"} {}", "event is not valid JSON"},
        {"", "event is not valid JSON"},
        {"1e400", "event is not valid JSON"},
        {"-1e400", "event is not valid JSON"},
        {"\"\\ud800\"", "event is not valid JSON"},
        {"{\"\\udc00\":1}", "event is not valid JSON"},
        {"{\"a\":\"\\u00zz\"}", "event is not valid JSON"},
        {"{\"a\":\"tab\there\"}", "event is not valid JSON"},
        {"[1]", "event must be a JSON object"},
        {"[1e400, \"\\ud800\"]", "event must be a JSON object"},
        {"\"text\"", "event must be a JSON object"},
        {"null", "event must be a JSON object"},
        {"12", "event must be a JSON object"},
        {"18446744073709551616", "event must be a JSON object"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"id\":\"y\",\"metric\":\"calls\",\"quantity\":1,\"ts\":\"t\"}", "field `id` is given twice"},
        {"{\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":1,\"ts\":\"t\",\"customer\":\"b\"}", "field `id` is missing"},
        {"{\"id\":1,\"metric\":\"calls\",\"ts\":\"t\"}", "field `customer` is missing"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":1,\"quantity\":2,\"ts\":\"t\"}", "field `quantity` is given twice"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":1}", "field `ts` is missing"},
        {"{\"ts\":1,\"ts\":2,\"id\":\"x\"}", "field `customer` is missing"},
        {"{\"id\":7,\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":1,\"ts\":\"t\"}", "field `id` must be a string"},
        {"{\"id\":\"x\",\"customer\":null,\"metric\":\"calls\",\"ts\":5}", "field `customer` must be a string"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":1,\"ts\":5}", "field `ts` must be a string"},
        {"{\"id\":\"x\",\"customer\":\"\\ud800\",\"metric\":\"calls\",\"quantity\":1,\"ts\":\"t\"}", "event is not valid JSON"},
        {"{\"id\":\"x\",\"customer\":\"\\ud800\",\"metric\":7,\"ts\":\"t\"}", "event is not valid JSON"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":1,\"ts\":\"\\udbff\\u0041\"}", "event is not valid JSON"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"disk\\n\",\"quantity\":1,\"ts\":\"t\"}",
         "metric \"disk\\n\" has no meter; name it in the job's [plugin_config] meters (it has: calls, desks, gb, ids, peak, qs, requests, rooms, seats)"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"\\u0001\\\"\\\\\\/\\u00e9\\u2028\",\"ts\":\"t\"}",
         "metric \"\\u0001\\\"\\\\/\xc3\xa9\xe2\x80\xa8\" has no meter; name it in the job's [plugin_config] meters (it has: calls, desks, gb, ids, peak, qs, requests, rooms, seats)"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"ts\":\"t\"}", "field `quantity` is missing"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"peak\",\"ts\":\"t\"}", "field `quantity` is missing"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"gb\",\"ts\":\"t\"}", "field `quantity` is missing"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":-3,\"ts\":\"t\"}", "quantity must be a non-negative integer, got -3"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":-0,\"ts\":\"t\"}", "quantity must be a non-negative integer, got -0"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"peak\",\"quantity\":1.5e0,\"ts\":\"t\"}", "quantity must be a non-negative integer, got 1.5e0"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"peak\",\"quantity\":1E400,\"ts\":\"t\"}", "quantity must be a non-negative integer, got 1E400"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"peak\",\"quantity\":  2.0  ,\"ts\":\"t\"}", "quantity must be a non-negative integer, got 2.0"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"gb\",\"quantity\":\"5\",\"ts\":\"t\"}", "quantity must be a non-negative integer, got \"5\""},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"gb\",\"quantity\":{ \"n\" : 5 },\"ts\":\"t\"}",
         "quantity must be a non-negative integer, got { \"n\" : 5 }"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"gb\",\"quantity\":null,\"ts\":\"t\"}", "quantity must be a non-negative integer, got null"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":18446744073709551616,\"ts\":\"t\"}",
         "quantity 18446744073709551616 is over the largest meterable, 2^64 - 1"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":99999999999999999999999,\"ts\":\"t\"}",
         "quantity 99999999999999999999999 is over the largest meterable, 2^64 - 1"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\"}", "field \"user\" (counted by unique_count) is missing"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"rooms\",\"ts\":\"t\",\"user\":\"u\"}", "field \"room\" (counted by unique_count) is missing"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"qs\",\"ts\":\"t\"}", "field \"quantity\" (counted by unique_count) is missing"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":[ 3 ]}",
         "field \"user\" must be a string for its unique_count meter, got [ 3 ]"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"a\",\"user\":-1.5E+3}",
         "field \"user\" must be a string for its unique_count meter, got -1.5E+3"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"qs\",\"ts\":\"t\",\"quantity\":7}",
         "field \"quantity\" must be a string for its unique_count meter, got 7"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"\\udc00\"}", "event is not valid JSON"},
        {"{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"ok\",\"user\":\"\\ud800x\"}", "event is not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const tally_test_facts *f = DESCRIBE(cases[i].event);
        if (f[0].ok) tally_test_fail(__FILE__, __LINE__, cases[i].event, "described", cases[i].reason);
        else TALLY_CHECK_STR(f[0].reason, cases[i].reason);
    }
    /* A whole batch: each event judged alone, in order. */
    const tally_test_facts *f = DESCRIBE("[]", "{\"id\":\"a\",\"customer\":\"c\",\"metric\":\"requests\",\"ts\":\"t\"}", "{");
    TALLY_CHECK(!f[0].ok && f[1].ok && !f[2].ok);
    TALLY_CHECK_STR(f[2].reason, "event is not valid JSON");
    /* 128 levels deep is JSON, 129 is not. */
    char deep[400];
    for (int depth = 128; depth <= 129; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        deep[2 * depth] = 0;
        TALLY_CHECK_STR(DESCRIBE(deep)[0].reason, depth == 128 ? "event must be a JSON object" : "event is not valid JSON");
    }
}

/* What a count meter and other fields do not care about. */
static void count_reads_no_quantity_and_other_fields_may_hold_anything(void) {
    configured();
    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"requests\",\"ts\":\"t\"}"), "\"count\"");
    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"requests\",\"quantity\":\"many\",\"ts\":\"t\"}"), "\"count\"");
    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"requests\",\"quantity\":-1e999,\"ts\":\"t\"}"), "\"count\"");
    /* ... but a lone surrogate in a name of the event itself is no JSON. */
    TALLY_CHECK_STR(DESCRIBE("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"requests\",\"ts\":\"t\",\"\\ud800\":0}")[0].reason,
                    "event is not valid JSON");
    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"requests\",\"ts\":\"t\",\"note\":\"\\ud800\",\"q\":{\"\\ud800\":1e999}}"),
                    "\"count\"");
}

static void each_meter_writes_its_addend_state_and_value(void) {
    configured();
    const char *sum = addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"calls\",\"quantity\":18446744073709551615,\"ts\":\"t\"}");
    TALLY_CHECK_STR(sum, "{\"sum\":18446744073709551615}");
    tally_test_folded folded = tally_test_fold(NULL, ARRAY(sum), (int64_t[]){1}, 1);
    TALLY_CHECK(folded.ok && folded.count == 1);
    TALLY_CHECK_STR(folded.states[0], "{\"sum\":18446744073709551615}");
    TALLY_CHECK(tally_test_value("{\"sum\":18446744073709551615}") == UINT64_MAX);
    folded = tally_test_fold("{\"sum\":5}", ARRAY("{\"sum\":2}", "{\"sum\":0}", "{\"sum\":3}"), (int64_t[]){1, 2, 3}, 3);
    TALLY_CHECK_STR(folded.states[0], "{\"sum\":10}");

    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"peak\",\"quantity\":7,\"ts\":\"t\"}"), "{\"max\":7}");
    folded = tally_test_fold(NULL, ARRAY("{\"max\":7}", "{\"max\":3}", "{\"max\":18446744073709551615}", "{\"max\":0}"),
                             (int64_t[]){1, 2, 3, 4}, 4);
    TALLY_CHECK_STR(folded.states[0], "{\"max\":18446744073709551615}");
    folded = tally_test_fold(NULL, ARRAY("{\"max\":0}"), (int64_t[]){1}, 1);
    TALLY_CHECK_STR(folded.states[0], "{\"max\":0}");
    TALLY_CHECK(tally_test_value("{\"max\":7}") == 7);

    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"requests\",\"quantity\":7,\"ts\":\"t\"}"), "\"count\"");
    folded = tally_test_fold(NULL, ARRAY("\"count\"", "\"count\"", "\"count\""), (int64_t[]){1, 2, 3}, 3);
    TALLY_CHECK_STR(folded.states[0], "{\"count\":3}");
    TALLY_CHECK(tally_test_value("{\"count\":3}") == 3);
    /* count stops at 2^64 - 1 */
    folded = tally_test_fold("{\"count\":18446744073709551614}", ARRAY("\"count\"", "\"count\""), (int64_t[]){1, 2}, 2);
    TALLY_CHECK_STR(folded.states[0], "{\"count\":18446744073709551615}");

    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"gb\",\"quantity\":0,\"ts\":\"t\"}"), "{\"latest\":0}");
    folded = tally_test_add(ARRAY(NULL), 1, ARRAY("{\"latest\":5}"), 1, (tally_test_addition[]){{0, -62135596800, 999999999, 0}}, 1);
    TALLY_CHECK_STR(folded.states[0], "{\"latest\":{\"seconds\":-62135596800,\"nanoseconds\":999999999,\"value\":5}}");
    TALLY_CHECK(tally_test_value("{\"latest\":{\"seconds\":1,\"nanoseconds\":2,\"value\":18446744073709551615}}") == UINT64_MAX);

    TALLY_CHECK_STR(addend_of("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"Zo\\u00eb \\\"the\\\" one\"}"),
                    "{\"unique\":\"Zo\xc3\xab \\\"the\\\" one\"}");
    folded = tally_test_fold(NULL, ARRAY("{\"unique\":\"b\"}"), (int64_t[]){1}, 1);
    TALLY_CHECK_STR(folded.states[0], "{\"unique\":[\"b\"]}");
    TALLY_CHECK(tally_test_value("{\"unique\":[\"a\",\"b\",\"c\"]}") == 3);
    TALLY_CHECK(tally_test_value("{\"unique\":[]}") == 0);
}

/* Of events with the same time, the one added first; later time wins;
 * earlier loses; nanoseconds count. */
static void latest_goes_by_event_time_and_ties_keep_the_first(void) {
    configured();
    static const char *const addends[] = {"{\"latest\":7}", "{\"latest\":3}", "{\"latest\":9}", "{\"latest\":4}", "{\"latest\":1}"};
    tally_test_addition additions[] = {{0, 5, 0, 0}, {0, 2, 0, 1}, {0, 5, 0, 2}, {0, 5, 1, 3}, {0, 5, 1, 4}};
    tally_test_folded folded = tally_test_add(ARRAY(NULL), 1, addends, 5, additions, 2);
    TALLY_CHECK_STR(folded.states[0], "{\"latest\":{\"seconds\":5,\"nanoseconds\":0,\"value\":7}}");
    folded = tally_test_add(ARRAY(NULL), 1, addends, 5, additions, 3);
    TALLY_CHECK_STR(folded.states[0], "{\"latest\":{\"seconds\":5,\"nanoseconds\":0,\"value\":7}}");
    folded = tally_test_add(ARRAY(NULL), 1, addends, 5, additions, 5);
    TALLY_CHECK_STR(folded.states[0], "{\"latest\":{\"seconds\":5,\"nanoseconds\":1,\"value\":4}}");
    /* A stored state ties with a new event: the stored one was first. */
    folded = tally_test_add(ARRAY("{\"latest\":{\"seconds\":5,\"nanoseconds\":1,\"value\":8}}"), 1, addends, 5, additions + 3, 2);
    TALLY_CHECK_STR(folded.states[0], "{\"latest\":{\"seconds\":5,\"nanoseconds\":1,\"value\":8}}");
    folded = tally_test_add(ARRAY("{\"latest\":{\"seconds\":-1,\"nanoseconds\":0,\"value\":8}}"), 1, addends, 5, additions, 1);
    TALLY_CHECK_STR(folded.states[0], "{\"latest\":{\"seconds\":5,\"nanoseconds\":0,\"value\":7}}");
    TALLY_CHECK(tally_test_value(folded.states[0]) == 7);
}

/* unique_count: each value once, by UTF-8 bytes, written as serde_json
 * writes strings; an escaped value is the value. */
static void unique_count_keeps_distinct_values_by_utf8_bytes(void) {
    configured();
    const tally_test_facts *f = DESCRIBE(
        "{\"id\":\"1\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"Zo\xc3\xab\"}",
        "{\"id\":\"2\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"Zo\\u00eb\"}",
        "{\"id\":\"3\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"zoe\"}",
        "{\"id\":\"4\",\"customer\":\"a\",\"metric\":\"desks\",\"ts\":\"t\",\"user\":\"\\ud834\\udd1e \\u0000\\u001f\\t\\/\\b\\f\\r\"}",
        "{\"id\":\"5\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"\"}",
        "{\"id\":\"6\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"\xef\xbf\xbf\x7f\"}",
        "{\"id\":\"7\",\"customer\":\"a\",\"metric\":\"seats\",\"ts\":\"t\",\"user\":\"Z\"}",
        "{\"id\":\"8\",\"customer\":\"a\",\"metric\":\"seats\",\"user\":\"first\",\"ts\":\"t\",\"user\":\"last\"}",
        "{\"id\":\"9\",\"customer\":\"a\",\"metric\":\"ids\",\"ts\":\"t\"}",
        "{\"id\":\"10\",\"customer\":\"a\",\"metric\":\"qs\",\"ts\":\"t\",\"quantity\":\"\\\"q\\\"\"}");
    static const char *const addends[] = {
        "{\"unique\":\"Zo\xc3\xab\"}", "{\"unique\":\"Zo\xc3\xab\"}", "{\"unique\":\"zoe\"}",
        "{\"unique\":\"\xf0\x9d\x84\x9e \\u0000\\u001f\\t/\\b\\f\\r\"}", "{\"unique\":\"\"}", "{\"unique\":\"\xef\xbf\xbf\x7f\"}",
        "{\"unique\":\"Z\"}", "{\"unique\":\"last\"}", "{\"unique\":\"9\"}", "{\"unique\":\"\\\"q\\\"\"}"};
    for (size_t i = 0; i < 10; i++) {
        TALLY_CHECK(f[i].ok);
        TALLY_CHECK_STR(f[i].addend, addends[i]);
    }
    /* Folded into one period (the meter is the addend's, not the metric's). */
    tally_test_folded folded = tally_test_fold(NULL, addends, (int64_t[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10);
    TALLY_CHECK_STR(folded.states[0], "{\"unique\":[\"\",\"\\\"q\\\"\",\"9\",\"Z\",\"Zo\xc3\xab\",\"last\",\"zoe\",\"\xef\xbf\xbf\x7f\","
                                      "\"\xf0\x9d\x84\x9e \\u0000\\u001f\\t/\\b\\f\\r\"]}");
    TALLY_CHECK(tally_test_value(folded.states[0]) == 9);
    /* A stored set, added to: merged, each once. */
    folded = tally_test_fold("{\"unique\":[\"b\",\"d\"]}", ARRAY("{\"unique\":\"d\"}", "{\"unique\":\"a\"}", "{\"unique\":\"c\"}", "{\"unique\":\"a\"}"),
                             (int64_t[]){1, 2, 3, 4}, 4);
    TALLY_CHECK_STR(folded.states[0], "{\"unique\":[\"a\",\"b\",\"c\",\"d\"]}");
    /* A stored set read with escapes and out of order is the same set. */
    folded = tally_test_fold("{\"unique\":[\"\\u0062\",\"a\",\"b\"]}", ARRAY("{\"unique\":\"c\"}"), (int64_t[]){1}, 1);
    TALLY_CHECK_STR(folded.states[0], "{\"unique\":[\"a\",\"b\",\"c\"]}");
    TALLY_CHECK(tally_test_value("{\"unique\":[\"b\",\"a\",\"b\"]}") == 2);
    /* Many values, in reverse order and twice: sorted, each once. */
    static char texts[600][24];
    const char *many[600];
    int64_t at[600];
    for (int i = 0; i < 600; i++) {
        snprintf(texts[i], sizeof texts[i], "{\"unique\":\"%03d\"}", 299 - i % 300);
        many[i] = texts[i];
        at[i] = i;
    }
    folded = tally_test_fold(NULL, many, at, 600);
    TALLY_CHECK(folded.ok && tally_test_value(folded.states[0]) == 300);
    TALLY_CHECK(folded.ok && strncmp(folded.states[0], "{\"unique\":[\"000\",\"001\",\"002\",\"003\"", 33) == 0);
    TALLY_CHECK(folded.ok && strlen(folded.states[0]) == strlen("{\"unique\":[]}") + 300 * 6 - 1);
}

/* The second refusal table: add refuses, and nothing of the call counts. */
static void add_refuses_sum_overflow_and_a_changed_meter(void) {
    configured();
    tally_test_folded folded = tally_test_fold("{\"sum\":18446744073709551615}", ARRAY("{\"sum\":0}", "{\"sum\":1}"), (int64_t[]){1, 2}, 2);
    TALLY_CHECK(!folded.ok && folded.refused == 1);
    TALLY_CHECK_STR(folded.reason, "the period's sum would pass 2^64 - 1, the largest meterable");
    folded = tally_test_fold(NULL, ARRAY("{\"sum\":18446744073709551615}", "{\"sum\":1}"), (int64_t[]){1, 2}, 2);
    TALLY_CHECK(!folded.ok && folded.refused == 1);
    static const char *const meters[] = {"sum", "count", "max", "latest", "unique_count"};
    static const char *const states[] = {"{\"sum\":1}", "{\"count\":1}", "{\"max\":1}", "{\"latest\":{\"seconds\":1,\"nanoseconds\":0,\"value\":1}}",
                                         "{\"unique\":[\"a\"]}"};
    static const char *const addends[] = {"{\"sum\":1}", "\"count\"", "{\"max\":1}", "{\"latest\":1}", "{\"unique\":\"a\"}"};
    for (int s = 0; s < 5; s++) {
        for (int a = 0; a < 5; a++) {
            folded = tally_test_fold(states[s], ARRAY(addends[a]), (int64_t[]){1}, 1);
            if (s == a) {
                TALLY_CHECK(folded.ok);
                continue;
            }
            char expected[300];
            snprintf(expected, sizeof expected,
                     "the event's metric is metered by %s but its period was opened by %s: a metric's meter changed while its period "
                     "was open; keep a metric's meter for its periods",
                     meters[a], meters[s]);
            TALLY_CHECK(!folded.ok && folded.refused == 0);
            TALLY_CHECK_STR(folded.reason, expected);
        }
    }
    /* The refused addition is the first one, of several periods. */
    folded = tally_test_add(ARRAY("{\"count\":1}", NULL), 2, ARRAY("\"count\"", "{\"sum\":1}"), 2,
                            (tally_test_addition[]){{1, 1, 0, 1}, {0, 1, 0, 0}, {0, 1, 0, 1}, {1, 1, 0, 0}}, 4);
    TALLY_CHECK(!folded.ok && folded.refused == 2);
    folded = tally_test_add(ARRAY("{\"count\":1}", NULL), 2, ARRAY("\"count\"", "{\"sum\":1}"), 2,
                            (tally_test_addition[]){{1, 1, 0, 1}, {0, 1, 0, 0}, {1, 1, 0, 1}}, 3);
    TALLY_CHECK(folded.ok && folded.count == 2);
    TALLY_CHECK_STR(folded.states[0], "{\"count\":2}");
    TALLY_CHECK_STR(folded.states[1], "{\"sum\":2}");
}

/* The configuration: the three ways to write unique_count, and every
 * refusal in the Rust build's words. */
static void the_configuration_is_read_as_the_rust_build_reads_it(void) {
    TALLY_CHECK(tally_test_configure("{\"meters\":{\"a\":{\"meter\":\"sum\"},\"b\":{\"meter\":\"count\",\"field\":null,\"x\":1},"
                                     "\"c\":{\"unique_count\":\"u:v\",\"meter\":\"sum\"},\"d\":\"unique_count:u:v\"}}") == NULL);
    TALLY_CHECK_STR(DESCRIBE("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"c\",\"ts\":\"t\",\"u:v\":\"w\"}")[0].addend, "{\"unique\":\"w\"}");
    TALLY_CHECK_STR(DESCRIBE("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"d\",\"ts\":\"t\",\"u:v\":\"w\"}")[0].addend, "{\"unique\":\"w\"}");
    TALLY_CHECK_STR(DESCRIBE("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"b\",\"ts\":\"t\"}")[0].addend, "\"count\"");
    TALLY_CHECK_STR(DESCRIBE("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"e\",\"ts\":\"t\"}")[0].reason,
                    "metric \"e\" has no meter; name it in the job's [plugin_config] meters (it has: a, b, c, d)");
#define USAGE "write meters = { calls = \"sum\", seats = { unique_count = \"user\" } }: "
#define METERS ": the meters are \"sum\", \"count\", \"max\", \"latest\" and { unique_count = \"<field>\" }"
#define NAME_IT ": unique_count counts the values of a field; name it: { unique_count = \"user\" }"
    static const struct {
        const char *config, *error;
    } cases[] = {
        {"{\"meters\":{\"calls\":\"avg\"}}", "meters.calls = \"avg\"" METERS},
        {"{\"meters\":{\"seats\":\"unique_count\"}}", "meters.seats" NAME_IT},
        {"{\"meters\":{\"seats\":\"unique_count:\"}}", "meters.seats" NAME_IT},
        {"{\"meters\":{\"seats\":{\"meter\":\"unique_count\"}}}", "meters.seats" NAME_IT},
        {"{\"meters\":{\"seats\":{\"meter\":\"unique_count\",\"field\":\"\"}}}", "meters.seats" NAME_IT},
        {"{\"meters\":{\"seats\":{\"unique_count\":\"\"}}}", "meters.seats" NAME_IT},
        {"{\"meters\":{\"a\":\"sum:x\"}}", "meters.a = \"sum\"" METERS},
        {"{\"meters\":{\"a\":{\"meter\":\"max\",\"field\":\"x\"}}}", "meters.a = \"max\"" METERS},
        {"{\"meters\":{\"a\":\":x\"}}", "meters.a = \"\"" METERS},
        {"{\"meters\":{\"b\":\"avg\",\"a\":\"bad\",\"c\":\"unique_count\"}}", "meters.a = \"bad\"" METERS},
        {"{\"meters\":{\"x.y\":\"Sum\"}}", "meters.x.y = \"Sum\"" METERS},
        {"{\"meters\":{\"a\":\"q\\\"\\\\\\n\\t\\r\\u0000\\u0007\\u007f'\xc3\xa9\\u0301\\u200b\xf0\x9f\x98\x80\"}}",
         "meters.a = \"q\\\"\\\\\\n\\t\\r\\0\\u{7}\\u{7f}'\xc3\xa9\\u{301}\\u{200b}\xf0\x9f\x98\x80\"" METERS},
        {"{\"meters\":{}}", "meters is empty: name at least one metric's meter"},
        {"{}", USAGE "missing field `meters`"},
        {"{\"meter\":{\"a\":\"sum\"}}", USAGE "unknown field `meter`, expected `meters`"},
        {"{\"meters\":{\"a\":\"sum\"},\"z\":1}", USAGE "unknown field `z`, expected `meters`"},
        {"{\"meters\":{\"a\":\"bad\"},\"z\":1}", USAGE "unknown field `z`, expected `meters`"},
        {"{\"a\":1,\"meters\":{\"a\":5}}", USAGE "unknown field `a`, expected `meters`"},
        {"{\"meters\":{\"a\":5},\"z\":1}", USAGE "data did not match any variant of untagged enum MeterSpec"},
        {"{\"meters\":{\"a\":\"bad\",\"b\":[\"sum\"]}}", USAGE "data did not match any variant of untagged enum MeterSpec"},
        {"{\"meters\":{\"a\":{\"unique_count\":5}}}", USAGE "data did not match any variant of untagged enum MeterSpec"},
        {"{\"meters\":{\"a\":{\"meter\":\"sum\",\"field\":5}}}", USAGE "data did not match any variant of untagged enum MeterSpec"},
        {"{\"meters\":{\"a\":{\"field\":\"x\"}}}", USAGE "data did not match any variant of untagged enum MeterSpec"},
        {"{\"meters\":{\"a\":true}}", USAGE "data did not match any variant of untagged enum MeterSpec"},
        {"{\"meters\":\"sum\"}", USAGE "invalid type: string \"sum\", expected a map"},
        {"{\"meters\":\"a\\u0000\\\"\"}", USAGE "invalid type: string \"a\\0\\\"\", expected a map"},
        {"{\"meters\":[]}", USAGE "invalid type: sequence, expected a map"},
        {"{\"meters\":true}", USAGE "invalid type: boolean `true`, expected a map"},
        {"{\"meters\":null}", USAGE "invalid type: null, expected a map"},
        {"{\"meters\":-3}", USAGE "invalid type: integer `-3`, expected a map"},
        {"{\"meters\":3}", USAGE "invalid type: integer `3`, expected a map"},
        {"{\"meters\":1.5}", USAGE "invalid type: floating point `1.5`, expected a map"},
        {"{\"meters\":1e+20}", USAGE "invalid type: floating point `1e+20`, expected a map"},
        {"{\"meters\":-0}", USAGE "invalid type: floating point `-0.0`, expected a map"},
        {"{\"meters\":0.0000125}", USAGE "invalid type: floating point `0.0000125`, expected a map"},
        {"{\"meters\":-0.0}", USAGE "invalid type: floating point `-0.0`, expected a map"},
        {"{\"meters\":2.0}", USAGE "invalid type: floating point `2.0`, expected a map"},
        {"[]", USAGE "invalid length 0, expected struct Config with 1 element"},
        {"[{\"a\":\"bad\"},2]", USAGE "invalid length 2, expected fewer elements in array"},
        {"\"meters\"", USAGE "invalid type: string \"meters\", expected struct Config"},
        {"[1", "[plugin_config] does not fit this plugin: it is not JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *error = tally_test_configure(cases[i].config);
        if (!error) tally_test_fail(__FILE__, __LINE__, cases[i].config, "accepted", cases[i].error);
        else TALLY_CHECK_STR(error, cases[i].error);
    }
    TALLY_CHECK(tally_test_configure("[{\"a\":\"max\"}]") == NULL);
    TALLY_CHECK_STR(DESCRIBE("{\"id\":\"x\",\"customer\":\"a\",\"metric\":\"a\",\"quantity\":4,\"ts\":\"t\"}")[0].addend, "{\"max\":4}");
}

int main(void) {
    facts_are_the_id_ts_customer_and_metric();
    malformed_events_get_the_reasons_of_docs_billing_md();
    count_reads_no_quantity_and_other_fields_may_hold_anything();
    each_meter_writes_its_addend_state_and_value();
    latest_goes_by_event_time_and_ties_keep_the_first();
    unique_count_keeps_distinct_values_by_utf8_bytes();
    add_refuses_sum_overflow_and_a_changed_meter();
    the_configuration_is_read_as_the_rust_build_reads_it();
    return tally_test_failures() ? 1 : 0;
}
