/* The period billing plugin through the real host (`make test`): built by
 * `tally plugin build`, each send a `tally run` of the same job
 * (testing/tally_periods_run.h; `tally` is $TALLY_BIN, else on PATH). New
 * York's November, 721 hours as EDT ends, is FINAL once a December event
 * passes its end plus the grace; a late November event adjusts it; a
 * malformed line is a dead letter. */
#include "tally_periods_run.h"
#include "tally_periods_testing.h"

#define LINES(...) ((const char *const[]){__VA_ARGS__}), (sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

static void the_host_closes_november_in_new_york_and_adjusts_it(void) {
    /* max_future: the dates are fixed, the host's clock is the machine's. */
    tally_periods_run *run = tally_periods_run_start(".", "time_zones = { acme = \"America/New_York\" }\nmax_future = \"36500d\"",
                                                     "meters = { calls = \"sum\" }");
    TALLY_CHECK(run != NULL);
    if (!run) return;
    tally_periods_sent sent = tally_periods_run_send(
        run, LINES("{\"id\":\"a\",\"customer\":\"acme\",\"metric\":\"calls\",\"quantity\":5,\"ts\":\"2026-11-01T04:00:00Z\"}",
                   "{\"id\":\"b\",\"customer\":\"acme\",\"metric\":\"calls\",\"quantity\":7,\"ts\":\"2026-12-01T04:59:59Z\"}",
                   "{\"id\":\"c\",\"customer\":\"acme\",\"metric\":\"calls\",\"quantity\":1,\"ts\":\"2026-12-02T05:00:00Z\"}",
                   "{\"id\":\"d\",\"customer\":\"acme\",\"metric\":\"calls\","));
    TALLY_CHECK(sent.ok && sent.record_count == 1 && sent.dead_letter_count == 1);
    if (sent.record_count == 1) {
        const tally_periods_record *november = &sent.records[0];
        TALLY_CHECK(november->final && november->value == 12 && november->version == 1);
        TALLY_CHECK_STR(november->type, "final");
        TALLY_CHECK_STR(november->customer, "acme");
        TALLY_CHECK_STR(november->period, "2026-11");
        TALLY_CHECK_STR(november->start, "2026-11-01T04:00:00Z");
        TALLY_CHECK_STR(november->end, "2026-12-01T05:00:00Z");
        TALLY_CHECK(strstr(november->fields, "\"time_zone\":\"America/New_York\"") != NULL);
    }
    if (sent.dead_letter_count == 1) {
        TALLY_CHECK(sent.dead_letters[0].offset == 3);
        TALLY_CHECK_STR(sent.dead_letters[0].reason, "malformed: event is not valid JSON");
    }
    tally_periods_sent_free(&sent);

    sent = tally_periods_run_send(
        run, LINES("{\"id\":\"e\",\"customer\":\"acme\",\"metric\":\"calls\",\"quantity\":3,\"ts\":\"2026-11-30T23:00:00-05:00\"}"));
    TALLY_CHECK(sent.ok && sent.record_count == 1 && sent.dead_letter_count == 0);
    if (sent.record_count == 1) {
        const tally_periods_record *adjustment = &sent.records[0];
        TALLY_CHECK(!adjustment->final && adjustment->version == 2 && adjustment->value == 15 && adjustment->previous == 12 &&
                    adjustment->delta == 3 && !adjustment->delta_negative);
        TALLY_CHECK_STR(adjustment->type, "adjustment");
        TALLY_CHECK_STR(adjustment->period, "2026-11");
    }
    tally_periods_sent_free(&sent);
    tally_periods_run_end(run);
}

int main(void) {
    the_host_closes_november_in_new_york_and_adjusts_it();
    return tally_test_failures() ? 1 : 0;
}
