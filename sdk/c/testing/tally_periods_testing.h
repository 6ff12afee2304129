/*
 * Tally's test driver for C period plugins: the plugin compiled natively
 * (gcc or clang) and called through its `tally:plugin@0.2.0` exports as the
 * host calls them (buffers handed over and freed as the component model
 * does), so a test is an ordinary C program:
 *
 *   TALLY_CHECK(tally_test_configure("{\"meters\":{\"calls\":\"sum\"}}") == NULL);
 *   const tally_test_facts *facts = tally_test_describe((const char *[]){"{\"id\":\"e1\", …}"}, 1);
 *   TALLY_CHECK_STR(facts[0].addend, "{\"sum\":3}");
 *   tally_test_folded folded = tally_test_fold(NULL, (const char *[]){facts[0].addend}, (int64_t[]){1}, 1);
 *   TALLY_CHECK_STR(folded.states[0], "{\"sum\":3}");
 *   TALLY_CHECK(tally_test_value(folded.states[0]) == 3);
 *   return tally_test_failures() ? 1 : 0;
 *
 * What a call returns stays valid until the next call of the same kind.
 */
#ifndef TALLY_PERIODS_TESTING_H
#define TALLY_PERIODS_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The checks: TALLY_CHECK, TALLY_CHECK_STR, tally_test_failures. */
#include "tally_check.h"

/** What `describe` said of one event (texts NUL-terminated). */
typedef struct tally_test_facts {
    /** Whether it was described; else `reason` says why it is malformed. */
    bool ok;
    const char *reason;
    const char *id;
    /** The event time: RFC 3339 text (`time`), or `millis` when `unix_millis`. */
    bool unix_millis;
    const char *time;
    int64_t millis;
    /** The aggregation key's fields, in order. */
    size_t key_count;
    const char *key_names[16];
    const char *key_values[16];
    const char *customer;
    /** The addend, as the host keeps it. */
    const char *addend;
} tally_test_facts;

/** One addition of an `add` call. */
typedef struct tally_test_addition {
    uint32_t period;
    int64_t seconds;
    uint32_t nanoseconds;
    uint32_t addend;
} tally_test_addition;

/** What `add` returned: every period's state, or the refusal. */
typedef struct tally_test_folded {
    bool ok;
    size_t count;
    const char *const *states;
    uint32_t refused;
    const char *reason;
} tally_test_folded;

/** Calls `configure` with `config` (JSON): NULL when accepted, else why. */
const char *tally_test_configure(const char *config);
/** Calls `describe` with a batch of NUL-terminated records. */
const tally_test_facts *tally_test_describe(const char *const *records, size_t count);
/** Calls `describe` with records given as bytes and lengths. */
const tally_test_facts *tally_test_describe_bytes(const uint8_t *const *records, const size_t *lengths, size_t count);
/** Calls `add` (`states[i]` NULL: a period without an event yet). */
tally_test_folded tally_test_add(const char *const *states, size_t state_count, const char *const *addends, size_t addend_count,
                                 const tally_test_addition *additions, size_t addition_count);
/** Folds `addends` (at `seconds`, in order) into one period whose state is
 * `state` (NULL: none yet), in one `add` call. */
tally_test_folded tally_test_fold(const char *state, const char *const *addends, const int64_t *seconds, size_t count);
/** Calls `value`. */
uint64_t tally_test_value(const char *state);

#endif
