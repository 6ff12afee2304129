/*
 * Tally's test driver for C plugins: the plugin compiled natively (with
 * gcc or clang) against an in-memory host that answers the same
 * `tally:plugin` calls a component makes, so a test is an ordinary C
 * program and needs no build of the component:
 *
 *   tally_test_start((const char *[]){"totals"}, 1);
 *   tally_sent sent = tally_test_send((const char *[]){"{\"customer\":\"acme\", …}"}, 1);
 *   TALLY_CHECK(sent.dead_letter_count == 0);
 *   TALLY_CHECK_STR(sent.outputs[0].value, "3");
 *   return tally_test_failures() ? 1 : 0;
 *
 * Like the host, emitting to an output the job does not declare stops the
 * plugin (here: the test program aborts, naming the output).
 */
#ifndef TALLY_TESTING_H
#define TALLY_TESTING_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The checks: TALLY_CHECK, TALLY_CHECK_STR, tally_test_failures. */
#include "tally_check.h"

/** One record a batch emitted, key and value as NUL-terminated text. */
typedef struct tally_test_record {
    const char *output;
    uint32_t event;
    const char *key; /* NULL when the record has none */
    const char *value;
} tally_test_record;

/** One event a batch refused. */
typedef struct tally_test_dead_letter {
    uint64_t offset;
    const char *reason;
} tally_test_dead_letter;

/** What one send did (valid until the next send). */
typedef struct tally_sent {
    const tally_test_record *outputs;
    size_t output_count;
    const tally_test_dead_letter *dead_letters;
    size_t dead_letter_count;
} tally_sent;

/** Starts a job declaring `outputs`, with empty state, at offset 0. */
void tally_test_start(const char *const *outputs, size_t count);
/** Sends one batch of NUL-terminated records on partition 0. */
tally_sent tally_test_send(const char *const *records, size_t count);
/** Sends one batch of records given as bytes and lengths. */
tally_sent tally_test_send_bytes(const uint8_t *const *records, const size_t *lengths, size_t count);
/** The stored state of the key whose JSON is `key` (NUL-terminated), or NULL. */
const char *tally_test_state(const char *key);
/** How many keys have state. */
size_t tally_test_state_count(void);
/** The lines logged so far, each "level: message". */
size_t tally_test_log_count(void);
const char *tally_test_log(size_t index);

#endif
