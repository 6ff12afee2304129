/* What the two in-memory hosts share (host.c for tally_testing.h,
 * periods_host.c for tally_periods_testing.h): memory handed over as the
 * component model hands it, and the checks of tally_check.h. Each host
 * #includes this file, so a plugin's test build goes on naming just one
 * host source; it is not compiled on its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tally_check.h"

static int failures;

static void *grow(void *ptr, size_t size) {
    void *grown = realloc(ptr, size ? size : 1);
    if (!grown) abort();
    return grown;
}

/* What the canonical ABI hands a plugin for an empty buffer: a pointer
 * that is not malloc's (the alignment), which the plugin must not free;
 * the sanitizers catch one that does. */
#define EMPTY ((uint8_t *)1)

/* A buffer handed to the plugin, as the component model hands it. */
static uint8_t *handed(const void *bytes, size_t len) {
    if (len == 0) return EMPTY;
    uint8_t *out = grow(NULL, len);
    memcpy(out, bytes, len);
    return out;
}

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
