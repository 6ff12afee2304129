/*
 * Tally's host run for C period plugins: the plugin project built into a
 * component (`tally plugin build`) and run by the real `tally` binary in
 * local mode, so a test sees the FINAL and ADJUSTMENT records, and the
 * dead letters, exactly as the host emits them (calendar periods in the
 * customer's time zone, DST, grace, versions):
 *
 *   tally_periods_run *run = tally_periods_run_start(".", "time_zones = { acme = \"America/New_York\" }",
 *                                                    "meters = { calls = \"sum\" }");
 *   const char *const lines[] = {
 *       "{\"id\":\"a\",\"customer\":\"acme\",\"metric\":\"calls\",\"quantity\":5,\"ts\":\"2026-11-10T12:00:00Z\"}",
 *       "{\"id\":\"b\",\"customer\":\"acme\",\"metric\":\"calls\",\"quantity\":1,\"ts\":\"2026-12-03T00:00:00Z\"}",
 *   };
 *   tally_periods_sent sent = tally_periods_run_send(run, lines, 2);
 *   TALLY_CHECK(sent.ok && sent.record_count == 1 && sent.records[0].final && sent.records[0].value == 5);
 *   TALLY_CHECK_STR(sent.records[0].end, "2026-12-01T05:00:00Z");
 *   tally_periods_sent_free(&sent);
 *   tally_periods_run_end(run);
 *
 * `tally_periods_run_start` builds the project once, into a temporary
 * directory (under $TMPDIR, else /tmp) holding the job:
 *
 *   name = "test"
 *   plugin = "plugin.wasm"
 *   outputs = ["periods"]
 *   [local]
 *   inputs = ["events.ndjson"]
 *   output_dir = "out"
 *   state_dir = "state"
 *   [periods]
 *   <periods_toml>
 *   [plugin_config]
 *   <plugin_config_toml>
 *
 * Each send appends its lines to events.ndjson and runs `tally run
 * job.toml` there: a later send is a later run of the same job, its state
 * kept; at the end of each run, every input read to its end, the host
 * closes what the watermark passed. The send returns what that run added
 * to out/periods.ndjson and out/dead-letters.ndjson. The host reads the
 * wall clock as each line's arrival: an event time more than `max_future`
 * (default 5m) past it is dead-lettered `future:`; a test with fixed dates
 * can give `max_future = "36500d"`.
 *
 * The `tally` binary is $TALLY_BIN, else `tally` on PATH. The driver runs
 * natively (stdio, system(3) and POSIX): compile testing/tally_periods_run.c
 * into the test beside the period SDK (tally_periods.c, whose JSON decoder
 * it uses) and the period test host (testing/periods_host.c).
 */
#ifndef TALLY_PERIODS_RUN_H
#define TALLY_PERIODS_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Most bytes one send reads of each output, and of tally's stderr: past
 * it the send fails, saying so. */
#define TALLY_PERIODS_RUN_MAX_OUTPUT ((size_t)64 << 20)

/** A FINAL or ADJUSTMENT record as the host wrote it (texts
 * NUL-terminated, owned by the `tally_periods_sent`). */
typedef struct tally_periods_record {
    /** Whether it is the FINAL (`type` "final"); else an ADJUSTMENT. */
    bool final;
    /** "final" or "adjustment". */
    char *type;
    /** The aggregation key's `customer` field ("" when the key has none). */
    char *customer;
    /** The period's label ("2026-11"; "2026-11-03" for a daily calendar). */
    char *period;
    /** The period's start and end: UTC instants, RFC 3339. */
    char *start;
    char *end;
    /** The period's value now. */
    uint64_t value;
    /** An ADJUSTMENT's previous value (0 on a FINAL). */
    uint64_t previous;
    /** value − previous modulo 2^64 (0 on a FINAL): `previous + delta ==
     * value` always holds; a value that fell (a `latest` meter) has
     * `delta_negative` set, and its magnitude is `0 - delta`. */
    uint64_t delta;
    bool delta_negative;
    /** 1 for the FINAL, then one more per ADJUSTMENT. */
    uint64_t version;
    /** The whole record as the host wrote it: a JSON object with every
     * field (`metric`, `time_zone`, `tzdata`, … beside the ones above). */
    char *fields;
} tally_periods_record;

/** An input line the host dead-lettered: its offset in the input (the
 * line's index, from 0, over every line sent so far) and the reason
 * (`malformed: …`, `refused: …`, `duplicate: …`, `future: …`, …). */
typedef struct tally_periods_dead_letter {
    uint64_t offset;
    char *reason;
} tally_periods_dead_letter;

/** What one send added to the job's outputs. */
typedef struct tally_periods_sent {
    /** Whether the run succeeded and its outputs were read; else `error`
     * says why (tally's stderr when `tally run` failed; also printed to
     * stderr) and there are no records or dead letters. */
    bool ok;
    char *error;
    tally_periods_record *records;
    size_t record_count;
    tally_periods_dead_letter *dead_letters;
    size_t dead_letter_count;
} tally_periods_sent;

/** A period job run by `tally`, in its own temporary directory. */
typedef struct tally_periods_run tally_periods_run;

/** Builds the period plugin project in `plugin_dir` (`tally plugin build`)
 * and writes the job around it; `periods_toml` and `plugin_config_toml`
 * are the `[periods]` and `[plugin_config]` tables' TOML text, without
 * their headers (NULL: empty). NULL on failure, the reason printed to
 * stderr. */
tally_periods_run *tally_periods_run_start(const char *plugin_dir, const char *periods_toml, const char *plugin_config_toml);

/** Appends `count` lines (one NDJSON event each, without line breaks) to
 * the job's input, runs the job and returns what the run added. Free it
 * with tally_periods_sent_free. */
tally_periods_sent tally_periods_run_send(tally_periods_run *run, const char *const *lines, size_t count);

/** Frees what a send returned (and empties it). */
void tally_periods_sent_free(tally_periods_sent *sent);

/** Removes the job's directory and frees the run (NULL: nothing). */
void tally_periods_run_end(tally_periods_run *run);

#ifdef __cplusplus
}
#endif

#endif
