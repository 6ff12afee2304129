/* The billing plugin under a plain C test (`make test`), through Tally's C
 * test driver: the rules of docs/billing.md. */
#include "tally_testing.h"

#define SEND(...)                                                                                   \
    tally_test_send((const char *[]){__VA_ARGS__}, sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *))

static const char *const OUTPUTS[] = {"totals"};
static const char ACME_NOVEMBER[] = "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"period\":\"2026-11\"}";

static void every_update_emits_the_running_total_of_its_key_by_utc_month(void) {
    tally_test_start(OUTPUTS, 1);
    tally_sent sent = SEND("{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":3,\"ts\":\"2026-11-03T10:00:00Z\"}",
                           "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":4,\"ts\":\"2026-12-01T00:30:00+01:00\"}",
                           "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":5,\"ts\":\"2026-12-01T00:30:00Z\"}");
    TALLY_CHECK(sent.dead_letter_count == 0);
    TALLY_CHECK(sent.output_count == 3);
    TALLY_CHECK_STR(sent.outputs[0].value, "3");
    TALLY_CHECK_STR(sent.outputs[1].value, "7"); /* still November in UTC */
    TALLY_CHECK_STR(sent.outputs[1].key, ACME_NOVEMBER);
    TALLY_CHECK_STR(sent.outputs[2].value, "5");
    TALLY_CHECK_STR(tally_test_state(ACME_NOVEMBER), "7");
}

static void bad_events_are_refused_with_the_reasons_of_docs_billing_md_and_change_nothing(void) {
    tally_test_start(OUTPUTS, 1);
    tally_sent sent = SEND(
        "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":2,\"ts\":\"2026-11-03T10:00:00Z\"}",
        "{\"customer\":\"acme\"",
        "{\"metric\":\"api_calls\",\"quantity\":3,\"ts\":\"2026-11-03T10:00:00Z\"}",
        "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":-3,\"ts\":\"2026-11-03T10:00:00Z\"}",
        "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":2.5,\"ts\":\"2026-11-03T10:00:00Z\"}",
        "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":1,\"ts\":\"2026-02-30T10:00:00Z\"}",
        "{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":18446744073709551615,\"ts\":\"2026-11-03T10:00:00Z\"}",
        "{\"customer\":\"\xff\"}",
        "{\"customer\":\"a\",\"customer\":\"b\",\"metric\":\"m\",\"quantity\":1,\"ts\":\"2026-11-03T10:00:00Z\"}",
        "1e400",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
        "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]");
    static const char *const reasons[] = {
        "event is not valid JSON",
        "field `customer` is missing",
        "quantity must be a non-negative integer, got -3",
        "quantity must be a non-negative integer, got 2.5",
        "ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got \"2026-02-30T10:00:00Z\"",
        "total would overflow adding 18446744073709551615",
        "event is not UTF-8",
        "field `customer` is given twice",
        "event is not valid JSON",
        "event is not valid JSON",
    };
    TALLY_CHECK(sent.dead_letter_count == 10);
    for (size_t i = 0; i < sent.dead_letter_count && i < 10; i++) {
        TALLY_CHECK(sent.dead_letters[i].offset == i + 1);
        TALLY_CHECK_STR(sent.dead_letters[i].reason, reasons[i]);
    }
    TALLY_CHECK(sent.output_count == 1);
    TALLY_CHECK(tally_test_state_count() == 1);
    TALLY_CHECK_STR(tally_test_state(ACME_NOVEMBER), "2");
}

static void state_carries_across_batches(void) {
    tally_test_start(OUTPUTS, 1);
    SEND("{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":3,\"ts\":\"2026-11-03T10:00:00Z\"}");
    tally_sent sent = SEND("{\"customer\":\"acme\",\"metric\":\"api_calls\",\"quantity\":4,\"ts\":\"2026-11-04T10:00:00Z\"}");
    TALLY_CHECK(sent.output_count == 1 && sent.outputs[0].event == 0);
    TALLY_CHECK_STR(sent.outputs[0].value, "7");
}

int main(void) {
    every_update_emits_the_running_total_of_its_key_by_utc_month();
    bad_events_are_refused_with_the_reasons_of_docs_billing_md_and_change_nothing();
    state_carries_across_batches();
    return tally_test_failures() ? 1 : 0;
}
