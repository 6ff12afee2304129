/* The C SDK's own tests (`make -C sdk/c test`): its JSON decoder refuses
 * what serde_json refuses and reads what it reads; its writer escapes as
 * serde_json does; an aggregation reads once, writes once, leaves a
 * refused event's state alone and returns rejections in event order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tally.h"
#include "tally_testing.h"

static bool decodes(const char *text, int flags) {
    tally_json json;
    tally_text why = {0};
    bool ok = tally_json_decode((const uint8_t *)text, strlen(text), flags, &json, &why);
    tally_text_free(&why);
    return ok;
}

static const char *reason_of(const char *text, size_t len) {
    static char reason[64];
    tally_json json;
    tally_text why = {0};
    reason[0] = 0;
    if (!tally_json_decode((const uint8_t *)text, len, 0, &json, &why)) snprintf(reason, sizeof reason, "%.*s", (int)why.len, why.bytes);
    tally_text_free(&why);
    return reason;
}

static void what_serde_json_refuses_is_refused(void) {
    static const char *const refused[] = {"", " ", "{", "[1,]", "{\"a\":1,}", "01", "+1", "1.", ".5", "1e", "NaN", "Infinity",
                                          "'a'", "\"\\x\"", "\"\\ud800\"", "[\"\\udc00\"]", "\"a\tb\"", "[1] 2", "tru", "nul",
                                          "// c\n1", "{\"a\" 1}", "{1:2}", "\"\\u12\"", "-", "[1 2]", "\xef\xbb\xbf" "1"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const char *reason = reason_of(refused[i], strlen(refused[i]));
        if (strcmp(reason, "event is not valid JSON") != 0) tally_test_fail(__FILE__, __LINE__, refused[i], reason, "event is not valid JSON");
    }
    static const char *const read[] = {"0", "-0", "1.5e-3", "1E+2", "[]", "{}", " [ 1 , {\"a\" : null } ]\r\n\t", "\"\\ud834\\udd1e\"",
                                       "\"\\u0000\"", "\"\\/\"", "true", "false", "1e400"};
    for (size_t i = 0; i < sizeof read / sizeof *read; i++) {
        if (!decodes(read[i], 0)) tally_test_fail(__FILE__, __LINE__, read[i], "refused", "read");
    }
    TALLY_CHECK(decodes("\"\\ud800\"", TALLY_JSON_LONE_SURROGATES));
}

static void nesting_stops_at_128_levels(void) {
    char deep[300];
    for (int depth = 127; depth <= 129; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        deep[2 * depth] = 0;
        TALLY_CHECK(decodes(deep, 0) == (depth <= TALLY_JSON_MAX_DEPTH));
    }
}

static void utf8_is_read_as_strictly_as_rust(void) {
    static const char *const invalid[] = {"\"\xff\"", "\"\x80\"", "\"\xc0\x80\"", "\"\xc2\"", "\"\xe0\x80\x80\"", "\"\xed\xa0\x80\"",
                                          "\"\xf0\x80\x80\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xe2\x82\""};
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) TALLY_CHECK_STR(reason_of(invalid[i], strlen(invalid[i])), "event is not UTF-8");
    TALLY_CHECK(decodes("\"z\xc3\xab \xe2\x98\x83 \xf0\x9d\x84\x9e\"", 0));
    TALLY_CHECK_STR(reason_of("\"a\0\"", 4), "event is not valid JSON");
}

static void members_numbers_and_strings_read_back(void) {
    tally_json json;
    tally_text why = {0};
    const char *text = "{\"a\":1,\"b\\u0061\":\"x\\n\\u00e9\",\"a\":18446744073709551615,\"c\":18446744073709551616}";
    TALLY_CHECK(tally_json_decode((const uint8_t *)text, strlen(text), 0, &json, &why));
    uint64_t value = 0;
    TALLY_CHECK(tally_json_count(&json, "a") == 2 && tally_json_u64(tally_json_get(&json, "a"), &value) && value == UINT64_MAX);
    TALLY_CHECK(!tally_json_u64(tally_json_get(&json, "c"), &value));
    TALLY_CHECK(tally_json_string_is(tally_json_get(&json, "ba"), "x\n\xc3\xa9"));
    TALLY_CHECK(tally_json_get(&json, "missing") == NULL && tally_json_get(NULL, "a") == NULL);
    static const char *const finite[] = {"1.7976931348623157e308", "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497791", "0.0000e999999", "1e-400", "-1e308", "0.1e309"};
    static const char *const infinite[] = {"1.7976931348623159e308", "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792", "1e309", "-1e400", "10e308", "1e99999999999999999999"};
    for (int i = 0; i < 6; i++) {
        tally_json number = {.kind = TALLY_JSON_NUMBER, .text = (const uint8_t *)finite[i], .len = strlen(finite[i])};
        if (!tally_json_finite(&number)) tally_test_fail(__FILE__, __LINE__, finite[i], "infinite", "finite");
        number = (tally_json){.kind = TALLY_JSON_NUMBER, .text = (const uint8_t *)infinite[i], .len = strlen(infinite[i])};
        if (tally_json_finite(&number)) tally_test_fail(__FILE__, __LINE__, infinite[i], "finite", "infinite");
    }
    tally_text_free(&why);
}

static void strings_are_written_as_serde_json_writes_them(void) {
    tally_text text = {0};
    const char raw[] = "tab\t nl\n q\" bs\\ nul\0 us\x1f del\x7f \xc3\xa9 \b\f\r/";
    tally_text_json_string(&text, (const uint8_t *)raw, sizeof raw - 1);
    tally_text_u64(&text, 0);
    tally_text_i64(&text, INT64_MIN);
    tally_text_bytes(&text, "", 1);
    TALLY_CHECK_STR((const char *)text.bytes, "\"tab\\t nl\\n q\\\" bs\\\\ nul\\u0000 us\\u001f del\x7f \xc3\xa9 \\b\\f\\r/\"0-9223372036854775808");
    tally_text_free(&text);
}

/* A counter over {"key":…,"n":…}: n < 0 refused when applied. */
typedef struct counted {
    const tally_json *key;
    int64_t n;
} counted;

static bool decode(const uint8_t *value, size_t len, void *out, tally_text *why) {
    counted *event = out;
    tally_json json;
    if (!tally_json_decode(value, len, 0, &json, why)) return false;
    event->key = tally_json_get(&json, "key");
    const tally_json *n = tally_json_get(&json, "n");
    uint64_t magnitude;
    if (!tally_json_is_string(event->key) || !tally_json_is_number(n)) return tally_reject(why, "want {\"key\":string,\"n\":integer}");
    event->n = n->text[0] == '-' ? -1 : tally_json_u64(n, &magnitude) ? (int64_t)magnitude : 0;
    return true;
}

static bool key(const void *event, tally_text *out, tally_text *why) {
    (void)why;
    tally_text_json_string(out, ((const counted *)event)->key->text, ((const counted *)event)->key->len);
    return true;
}

static void initial(void *count) { *(int64_t *)count = 0; }

static bool read_state(const tally_json *stored, void *count) {
    uint64_t value;
    if (!tally_json_u64(stored, &value)) return false;
    *(int64_t *)count = (int64_t)value;
    return true;
}

static void write_state(const void *count, tally_text *out) { tally_text_i64(out, *(const int64_t *)count); }

static bool apply(void *count, const void *event, tally_text *why) {
    *(int64_t *)count += ((const counted *)event)->n; /* changed before refusing: the SDK keeps the old state */
    return ((const counted *)event)->n >= 0 || tally_reject(why, "n must not be negative");
}

static bool emit(const void *count, tally_text *out) {
    write_state(count, out);
    return true;
}

static const tally_aggregate counter = {"counts", sizeof(counted), sizeof(int64_t), decode, key, initial, read_state, write_state, apply, emit};
TALLY_EXPORT(counter)

static void an_aggregation_keeps_refused_events_out_and_rejects_in_order(void) {
    static const char *const outputs[] = {"counts"};
    tally_test_start(outputs, 1);
    tally_sent sent = tally_test_send((const char *[]){"{\"key\":\"a\",\"n\":2}", "{\"key\":\"b\",\"n\":-1}", "{", "{\"key\":\"a\",\"n\":-5}",
                                                       "{\"key\":\"a\",\"n\":3}", "{\"key\":7}"}, 6);
    TALLY_CHECK(sent.dead_letter_count == 4);
    static const char *const reasons[] = {"n must not be negative", "event is not valid JSON", "n must not be negative", "want {\"key\":string,\"n\":integer}"};
    static const uint64_t offsets[] = {1, 2, 3, 5};
    for (size_t i = 0; i < 4 && i < sent.dead_letter_count; i++) {
        TALLY_CHECK(sent.dead_letters[i].offset == offsets[i]);
        TALLY_CHECK_STR(sent.dead_letters[i].reason, reasons[i]);
    }
    TALLY_CHECK(sent.output_count == 2 && sent.outputs[0].event == 0 && sent.outputs[1].event == 4);
    TALLY_CHECK_STR(sent.outputs[1].key, "\"a\"");
    TALLY_CHECK_STR(sent.outputs[1].value, "5");
    TALLY_CHECK_STR(tally_test_state("\"a\""), "5");
    TALLY_CHECK(tally_test_state("\"b\"") == NULL && tally_test_state_count() == 1);
    /* An empty record: the host hands it over without an allocation. */
    sent = tally_test_send((const char *[]){""}, 1);
    TALLY_CHECK(sent.dead_letter_count == 1);
    TALLY_CHECK_STR(sent.dead_letters[0].reason, "event is not valid JSON");
    tally_log(TALLY_INFO, "done");
    TALLY_CHECK_STR(tally_test_log(0), "info: done");
}

int main(void) {
    what_serde_json_refuses_is_refused();
    nesting_stops_at_128_levels();
    utf8_is_read_as_strictly_as_rust();
    members_numbers_and_strings_read_back();
    strings_are_written_as_serde_json_writes_them();
    an_aggregation_keeps_refused_events_out_and_rejects_in_order();
    return tally_test_failures() ? 1 : 0;
}
