/*
 * The checks of Tally's C test drivers, shared by tally_testing.h (the
 * `process` contract) and tally_periods_testing.h (the period contract),
 * which include it: a failed check is reported on stderr and counted, and
 * the test program ends with `return tally_test_failures() ? 1 : 0;`.
 */
#ifndef TALLY_CHECK_H
#define TALLY_CHECK_H

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Records a failed check (used by the macros below). */
void tally_test_fail(const char *file, int line, const char *what, const char *actual, const char *expected);
/** How many checks failed so far. */
int tally_test_failures(void);

#define TALLY_CHECK(condition) \
    ((condition) ? (void)0 : tally_test_fail(__FILE__, __LINE__, #condition, NULL, NULL))
#define TALLY_CHECK_STR(actual, expected)                                                              \
    do {                                                                                               \
        const char *tally_actual_ = (actual), *tally_expected_ = (expected);                           \
        if (!tally_actual_ || !tally_expected_ ? tally_actual_ != tally_expected_                      \
                                               : strcmp(tally_actual_, tally_expected_) != 0)          \
            tally_test_fail(__FILE__, __LINE__, #actual, tally_actual_, tally_expected_);              \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
