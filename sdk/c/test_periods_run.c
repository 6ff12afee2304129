/* The host run's own tests (`make -C sdk/c test`): the period billing
 * plugin of this tree (plugins/billing-periods-c) built and run by the real
 * `tally` ($TALLY_BIN, else on PATH), its FINAL and ADJUSTMENT records and
 * dead letters read back exactly; then a fake `tally` (a shell script) for
 * what the real one does not do: fail, or write records that do not add
 * up. */
#define _XOPEN_SOURCE 700

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "periods_plugin.h"
#include "tally_check.h"
#include "tally_periods_run.h"

/* What this program needs of a test host: the SDK's `log` import (the
 * plugin runs in tally, not here) and the checks of tally_check.h. */
void tally_plugin_log_log(tally_plugin_log_level_t level, periods_plugin_string_t *message) {
    (void)level;
    (void)message;
}

static int failures;

void tally_test_fail(const char *file, int line, const char *what, const char *actual, const char *expected) {
    failures++;
    if (expected || actual)
        fprintf(stderr, "%s:%d: %s is \"%s\", expected \"%s\"\n", file, line, what, actual ? actual : "(null)", expected ? expected : "(null)");
    else
        fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
}

int tally_test_failures(void) {
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures;
}

#define LINES(...) ((const char *const[]){__VA_ARGS__}), (sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))
#define EVENT(id, customer, metric, quantity, ts)                                                                   \
    "{\"id\":\"" id "\",\"customer\":\"" customer "\",\"metric\":\"" metric "\",\"quantity\":" quantity ",\"ts\":\"" ts \
    "\"}"

static bool contains(const char *text, const char *part) { return text && strstr(text, part) != NULL; }

/* ---- A fake tally ---------------------------------------------------------- */

static char fake_dir[] = "/tmp/tally-periods-run-test-XXXXXX";

/* A `tally` whose `plugin build` succeeds and whose `run` runs `script`
 * (sh, in the job's directory). */
static void fake_tally(const char *script) {
    char path[sizeof fake_dir + 16];
    snprintf(path, sizeof path, "%s/tally", fake_dir);
    FILE *file = fopen(path, "w");
    TALLY_CHECK(file != NULL);
    if (!file) return;
    fprintf(file, "#!/bin/sh\nif [ \"$1\" = plugin ]; then : > \"$5\"; exit 0; fi\nmkdir -p out\n%s\n", script);
    fclose(file);
    chmod(path, 0755);
    setenv("TALLY_BIN", path, 1);
}

/* What the driver printed to stderr between quiet() and loud(). */
static char printed[4096];
static int saved_stderr = -1;

static void quiet(void) {
    char path[sizeof fake_dir + 16];
    snprintf(path, sizeof path, "%s/stderr", fake_dir);
    fflush(stderr);
    int file = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    saved_stderr = dup(2);
    dup2(file, 2);
    close(file);
}

static void loud(void) {
    char path[sizeof fake_dir + 16];
    snprintf(path, sizeof path, "%s/stderr", fake_dir);
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    FILE *said = fopen(path, "r");
    size_t n = said ? fread(printed, 1, sizeof printed - 1, said) : 0;
    printed[n] = 0;
    if (said) fclose(said);
}

static tally_periods_run *start_capturing_stderr(const char *periods) {
    quiet();
    tally_periods_run *run = tally_periods_run_start(fake_dir, periods, NULL);
    loud();
    return run;
}

/* A send whose failure is expected: stderr captured into `printed`. */
static tally_periods_sent send_quietly(tally_periods_run *run, const char *const *lines, size_t count) {
    quiet();
    tally_periods_sent sent = tally_periods_run_send(run, lines, count);
    loud();
    return sent;
}

/* ---- The real tally ------------------------------------------------------- */

static void a_host_run_shows_finals_adjustments_and_dead_letters_as_the_host_writes_them(void) {
    /* max_future: the dates are fixed, the host's clock is the machine's. */
    tally_periods_run *run = tally_periods_run_start(
        "../../plugins/billing-periods-c",
        "time_zones = { acme = \"America/New_York\", globex = \"Australia/Lord_Howe\" }\nmax_future = \"36500d\"",
        "meters = { calls = \"sum\", gb = \"latest\" }");
    TALLY_CHECK(run != NULL);
    if (!run) return;

    tally_periods_sent sent = tally_periods_run_send(
        run, LINES(EVENT("g1", "globex", "calls", "18446744073709551615", "2026-10-15T00:00:00Z"),
                   EVENT("a1", "acme", "calls", "5", "2026-11-10T12:00:00Z"),
                   EVENT("a2", "acme", "calls", "7", "2026-12-01T00:00:00Z"),
                   EVENT("a3", "acme", "gb", "10", "2026-11-20T00:00:00Z"), "not json",
                   EVENT("a1", "acme", "calls", "5", "2026-11-10T12:00:00Z"),
                   EVENT("a4", "acme", "calls", "1", "2026-12-03T00:00:00Z")));
    TALLY_CHECK(sent.ok && sent.record_count == 3 && sent.dead_letter_count == 2);
    if (sent.record_count == 3) {
        /* Lord Howe's October (30-minute DST from 4 October) ends first. */
        const tally_periods_record *october = &sent.records[0];
        TALLY_CHECK(october->final && october->value == UINT64_MAX && october->version == 1 && october->previous == 0 &&
                    october->delta == 0 && !october->delta_negative);
        TALLY_CHECK_STR(october->type, "final");
        TALLY_CHECK_STR(october->customer, "globex");
        TALLY_CHECK_STR(october->period, "2026-10");
        TALLY_CHECK_STR(october->start, "2026-09-30T13:30:00Z");
        TALLY_CHECK_STR(october->end, "2026-10-31T13:00:00Z");
        TALLY_CHECK(contains(october->fields, "\"time_zone\":\"Australia/Lord_Howe\""));
        TALLY_CHECK(contains(october->fields, "\"value\":18446744073709551615,"));
        /* New York's November, 721 hours: calls, then gb. */
        for (int i = 1; i <= 2; i++) {
            const tally_periods_record *november = &sent.records[i];
            TALLY_CHECK(november->final && november->version == 1 && november->value == (i == 1 ? 12 : 10));
            TALLY_CHECK_STR(november->customer, "acme");
            TALLY_CHECK_STR(november->period, "2026-11");
            TALLY_CHECK_STR(november->start, "2026-11-01T04:00:00Z");
            TALLY_CHECK_STR(november->end, "2026-12-01T05:00:00Z");
            TALLY_CHECK(contains(november->fields, i == 1 ? "\"metric\":\"calls\"" : "\"metric\":\"gb\""));
        }
    }
    if (sent.dead_letter_count == 2) {
        TALLY_CHECK(sent.dead_letters[0].offset == 4 && sent.dead_letters[1].offset == 5);
        TALLY_CHECK_STR(sent.dead_letters[0].reason, "malformed: event is not valid JSON");
        TALLY_CHECK(strncmp(sent.dead_letters[1].reason, "duplicate:", 10) == 0);
    }
    tally_periods_sent_free(&sent);

    /* A later run of the same job: only what it added. */
    sent = tally_periods_run_send(run, LINES(EVENT("a5", "acme", "calls", "3", "2026-11-20T00:00:00Z"),
                                             EVENT("a6", "acme", "gb", "4", "2026-11-29T00:00:00Z")));
    TALLY_CHECK(sent.ok && sent.record_count == 2 && sent.dead_letter_count == 0);
    if (sent.record_count == 2) {
        const tally_periods_record *calls = &sent.records[0], *gb = &sent.records[1];
        TALLY_CHECK(!calls->final && calls->version == 2 && calls->value == 15 && calls->previous == 12 && calls->delta == 3 &&
                    !calls->delta_negative);
        TALLY_CHECK_STR(calls->type, "adjustment");
        TALLY_CHECK_STR(calls->period, "2026-11");
        TALLY_CHECK(contains(calls->fields, "\"metric\":\"calls\""));
        /* A later `latest` lowers gb: a negative delta. */
        TALLY_CHECK(!gb->final && gb->version == 2 && gb->value == 4 && gb->previous == 10 && gb->delta_negative &&
                    0 - gb->delta == 6 && gb->previous + gb->delta == gb->value);
        TALLY_CHECK(contains(gb->fields, "\"delta\":-6,"));
    }
    tally_periods_sent_free(&sent);

    /* Nothing sent, nothing added; then a too-old event, its offset
     * counted over every line sent. */
    sent = tally_periods_run_send(run, NULL, 0);
    TALLY_CHECK(sent.ok && sent.record_count == 0 && sent.dead_letter_count == 0);
    tally_periods_sent_free(&sent);
    sent = tally_periods_run_send(run, LINES(EVENT("a7", "acme", "calls", "1", "2027-02-10T00:00:00Z"),
                                             EVENT("a8", "acme", "calls", "1", "2026-11-21T00:00:00Z")));
    TALLY_CHECK(sent.ok && sent.record_count == 1 && sent.dead_letter_count == 1);
    if (sent.record_count == 1) {
        TALLY_CHECK(sent.records[0].final && sent.records[0].value == 1);
        TALLY_CHECK_STR(sent.records[0].period, "2026-12");
    }
    if (sent.dead_letter_count == 1) {
        TALLY_CHECK(sent.dead_letters[0].offset == 10);
        TALLY_CHECK(strncmp(sent.dead_letters[0].reason, "too_old:", 8) == 0);
    }
    tally_periods_sent_free(&sent);

    /* A line holding a line break is not sent. */
    sent = send_quietly(run, LINES("{\"id\":\n\"x\"}"));
    TALLY_CHECK(!sent.ok && contains(sent.error, "line break") && contains(printed, "line break"));
    tally_periods_sent_free(&sent);
    tally_periods_run_end(run);
}

static void without_tally_start_says_where_to_get_it(void) {
    char *saved_path = strdup(getenv("PATH") ? getenv("PATH") : "");
    setenv("TALLY_BIN", "", 1);
    setenv("PATH", fake_dir, 1); /* holds no tally yet */
    TALLY_CHECK(start_capturing_stderr("") == NULL);
    TALLY_CHECK(contains(printed, "TALLY_BIN") && contains(printed, "PATH") && contains(printed, "cargo install --path host"));
    setenv("TALLY_BIN", "tally-of-another-name", 1);
    TALLY_CHECK(start_capturing_stderr("") == NULL);
    TALLY_CHECK(contains(printed, "TALLY_BIN is tally-of-another-name"));
    /* A name is looked up on PATH. */
    fake_tally("exit 0");
    setenv("TALLY_BIN", "tally", 1);
    tally_periods_run *run = start_capturing_stderr("");
    TALLY_CHECK(run != NULL);
    tally_periods_run_end(run);
    setenv("PATH", saved_path, 1);
    free(saved_path);
}

static void a_failed_run_names_tallys_stderr(void) {
    fake_tally("echo 'error: the job is refused: no' >&2; exit 3");
    tally_periods_run *run = start_capturing_stderr("grace = \"1h\"");
    TALLY_CHECK(run != NULL);
    tally_periods_sent sent = send_quietly(run, LINES("{}"));
    TALLY_CHECK(!sent.ok && sent.record_count == 0 && contains(sent.error, "the job is refused: no") &&
                contains(sent.error, "exit status 3") && contains(printed, "the job is refused: no"));
    tally_periods_sent_free(&sent);
    tally_periods_run_end(run);
}

static void records_that_do_not_add_up_fail_the_send(void) {
    static const char *const wrong[] = {
        "{\"value\":{\"type\":\"adjustment\",\"period\":\"p\",\"start\":\"a\",\"end\":\"b\",\"value\":3,\"previous\":1,\"delta\":1,\"version\":2}}",
        "{\"value\":{\"type\":\"final\",\"period\":\"p\",\"start\":\"a\",\"end\":\"b\",\"value\":18446744073709551616,\"version\":1}}",
        "{\"value\":{\"type\":\"final\",\"period\":\"p\",\"start\":\"a\",\"end\":\"b\",\"value\":-1,\"version\":1}}",
        "{\"value\":{\"type\":\"final\",\"start\":\"a\",\"end\":\"b\",\"value\":1,\"version\":1}}",
        "{\"value\":\"x\"}",
        "[1,",
    };
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        char script[1024];
        snprintf(script, sizeof script, "cat >> out/periods.ndjson <<'EOF'\n%s\nEOF", wrong[i]);
        fake_tally(script);
        tally_periods_run *run = start_capturing_stderr("");
        tally_periods_sent sent = send_quietly(run, NULL, 0);
        if (sent.ok || !contains(sent.error, "a line of out/periods.ndjson"))
            tally_test_fail(__FILE__, __LINE__, wrong[i], sent.error, "refused");
        tally_periods_sent_free(&sent);
        tally_periods_run_end(run);
    }
    /* The extremes read exactly; a line not yet ended waits for the next send. */
    fake_tally("printf '%s\\n%s' "
               "'{\"key\":{},\"value\":{\"type\":\"adjustment\",\"customer\":\"c\",\"period\":\"p\",\"start\":\"a\",\"end\":\"b\","
               "\"value\":0,\"previous\":18446744073709551615,\"delta\":-18446744073709551615,\"version\":4294967295}}' "
               "'{\"key\":{},\"value\":{\"type\":\"fin' >> out/periods.ndjson; "
               "printf '{\"reason\":\"refused: r\",\"source\":{\"offset\":18446744073709551615}}\\n' >> out/dead-letters.ndjson");
    tally_periods_run *run = start_capturing_stderr("");
    tally_periods_sent sent = tally_periods_run_send(run, NULL, 0);
    TALLY_CHECK(sent.ok && sent.record_count == 1 && sent.dead_letter_count == 1);
    if (sent.record_count == 1) {
        const tally_periods_record *r = &sent.records[0];
        TALLY_CHECK(!r->final && r->value == 0 && r->previous == UINT64_MAX && r->delta == 1 && r->delta_negative &&
                    r->version == 4294967295u);
        TALLY_CHECK_STR(r->customer, "c");
    }
    if (sent.dead_letter_count == 1) {
        TALLY_CHECK(sent.dead_letters[0].offset == UINT64_MAX);
        TALLY_CHECK_STR(sent.dead_letters[0].reason, "refused: r");
    }
    tally_periods_sent_free(&sent);
    tally_periods_run_end(run);
}

int main(void) {
    if (!mkdtemp(fake_dir)) {
        perror("mkdtemp");
        return 1;
    }
    a_host_run_shows_finals_adjustments_and_dead_letters_as_the_host_writes_them();
    without_tally_start_says_where_to_get_it();
    a_failed_run_names_tallys_stderr();
    records_that_do_not_add_up_fail_the_send();
    char command[sizeof fake_dir + 16];
    snprintf(command, sizeof command, "rm -rf %s", fake_dir);
    if (system(command) != 0) fprintf(stderr, "cannot remove %s\n", fake_dir);
    return tally_test_failures() ? 1 : 0;
}
