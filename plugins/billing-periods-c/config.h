/* The billing plugin's meters, read from the job's [plugin_config]:
 * `meters = { calls = "sum", seats = { unique_count = "user" } }`, one per
 * metric. A configuration the Rust build refuses is refused here in the
 * same words (its serde_json messages included). */
#ifndef BILLING_CONFIG_H
#define BILLING_CONFIG_H

#include "tally_periods.h"

/** How one metric counts (the order of the addend and state tags). */
typedef enum meter_kind { METER_SUM, METER_COUNT, METER_MAX, METER_LATEST, METER_UNIQUE } meter_kind;

/** One metric's meter (`field`: what a unique_count meter counts). */
typedef struct meter {
    tally_str metric;
    meter_kind kind;
    tally_str field;
} meter;

/** `configure`: reads `meters` from the decoded [plugin_config], or
 * refuses the job with the Rust build's message. */
bool configure_meters(const tally_json *config, tally_text *why);
/** The meter of `metric`, or NULL. */
const meter *find_meter(const uint8_t *metric, size_t len);
/** Appends the metrics with a meter, by their UTF-8 bytes, joined by ", ". */
void write_metrics(tally_text *out);
/** Appends `text` as Rust's `{:?}` writes a string (quoted, escaped). */
void write_rust_debug(tally_text *out, const uint8_t *text, size_t len);

#endif
