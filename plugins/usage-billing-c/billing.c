/* Usage billing in C: the running total of metered usage per customer,
 * metric and billing period (the UTC calendar month of the event's
 * timestamp). It computes what plugins/usage-billing (Rust) computes, byte
 * for byte, with the same dead-letter reasons: the rules are in
 * docs/billing.md, and tests/all/languages.rs holds them to it.
 *
 * Input: {"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}
 */
#include <string.h>

#include "tally.h"

typedef struct usage {
    const tally_json *customer, *metric, *quantity, *ts;
} usage;

static const char *const FIELDS[] = {"customer", "metric", "quantity", "ts"};

static bool decode(const uint8_t *value, size_t len, void *out, tally_text *why) {
    usage *event = out;
    tally_json json;
    if (!tally_json_decode(value, len, TALLY_JSON_LONE_SURROGATES, &json, why)) return false;
    /* A number alone is read as a float, so one out of range is not JSON. */
    if (json.kind == TALLY_JSON_NUMBER && !tally_json_finite(&json)) return tally_reject(why, "event is not valid JSON");
    if (json.kind != TALLY_JSON_OBJECT) return tally_reject(why, "event must be a JSON object");
    const tally_json **fields[] = {&event->customer, &event->metric, &event->quantity, &event->ts};
    for (int i = 0; i < 4; i++) {
        size_t given = tally_json_count(&json, FIELDS[i]);
        if (given > 1 || given == 0) {
            why->len = 0;
            tally_text_str(why, "field `");
            tally_text_str(why, FIELDS[i]);
            tally_text_str(why, given ? "` is given twice" : "` is missing");
            return false;
        }
        *fields[i] = tally_json_get(&json, FIELDS[i]);
    }
    for (int i = 0; i < 4; i++) {
        const tally_json *field = *fields[i];
        bool quantity = i == 2;
        if (quantity ? !tally_json_is_number(field) : !tally_json_is_string(field)) {
            why->len = 0;
            tally_text_str(why, "field `");
            tally_text_str(why, FIELDS[i]);
            tally_text_str(why, quantity ? "` must be a number" : "` must be a string");
            return false;
        }
        /* A lone surrogate escape is kept by the decoder (other fields may
         * hold one and are ignored), but it is no text: the event is not JSON. */
        if (field->lone_surrogate) return tally_reject(why, "event is not valid JSON");
    }
    return true;
}

static int days_in(int year, int month) {
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    return month == 2 && leap ? 29 : days[month - 1];
}

/* Reads `count` digits at `*at` into `*out`. */
static bool number(const uint8_t **at, const uint8_t *end, int count, int *out) {
    if (end - *at < count) return false;
    *out = 0;
    for (int i = 0; i < count; i++, (*at)++) {
        if (**at < '0' || **at > '9') return false;
        *out = *out * 10 + (**at - '0');
    }
    return true;
}

static bool expect(const uint8_t **at, const uint8_t *end, const char *either) {
    if (*at >= end || !strchr(either, **at) || **at == 0) return false;
    (*at)++;
    return true;
}

/* The UTC month of RFC 3339 timestamp `ts`, as year and month. */
static bool billing_period(const tally_json *ts, int *year_out, int *month_out) {
    const uint8_t *at = ts->text, *end = at + ts->len;
    int year, month, day, hour, minute, second, offset = 0;
    if (!number(&at, end, 4, &year) || !expect(&at, end, "-") || !number(&at, end, 2, &month) || !expect(&at, end, "-") ||
        !number(&at, end, 2, &day) || !expect(&at, end, "Tt") || !number(&at, end, 2, &hour) || !expect(&at, end, ":") ||
        !number(&at, end, 2, &minute) || !expect(&at, end, ":") || !number(&at, end, 2, &second))
        return false;
    if (at < end && *at == '.') {
        const uint8_t *digits = ++at;
        while (at < end && *at >= '0' && *at <= '9') at++;
        if (at == digits) return false;
    }
    if (at < end && (*at == 'Z' || *at == 'z')) {
        at++;
    } else if (at < end && (*at == '+' || *at == '-')) {
        int sign = *at++ == '-' ? -1 : 1, hours, minutes;
        if (!number(&at, end, 2, &hours) || !expect(&at, end, ":") || !number(&at, end, 2, &minutes) || hours > 23 || minutes > 59)
            return false;
        offset = sign * (hours * 60 + minutes);
    } else {
        return false;
    }
    if (at != end || month < 1 || month > 12 || day < 1 || day > days_in(year, month) || hour > 23 || minute > 59 || second > 60)
        return false;
    int minutes = hour * 60 + minute - offset;
    if (minutes < 0 && day == 1) {
        if (--month == 0) year--, month = 12;
    } else if (minutes >= 24 * 60 && day == days_in(year, month)) {
        if (++month == 13) year++, month = 1;
    }
    *year_out = year < 0 ? 0 : year > 9999 ? 9999 : year;
    *month_out = month;
    return true;
}

static bool key(const void *in, tally_text *key, tally_text *why) {
    const usage *event = in;
    int year, month;
    if (!billing_period(event->ts, &year, &month)) {
        why->len = 0;
        tally_text_str(why, "ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got ");
        tally_text_json_string(why, event->ts->text, event->ts->len);
        return false;
    }
    char period[] = {'"', '0' + year / 1000, '0' + year / 100 % 10, '0' + year / 10 % 10, '0' + year % 10, '-',
                     '0' + month / 10, '0' + month % 10, '"', '}'};
    tally_text_str(key, "{\"customer\":");
    tally_text_json_string(key, event->customer->text, event->customer->len);
    tally_text_str(key, ",\"metric\":");
    tally_text_json_string(key, event->metric->text, event->metric->len);
    tally_text_str(key, ",\"period\":");
    tally_text_bytes(key, period, sizeof period);
    return true;
}

static void initial(void *total) { *(uint64_t *)total = 0; }

static bool read_state(const tally_json *stored, void *total) { return tally_json_u64(stored, total); }

static void write_state(const void *total, tally_text *out) { tally_text_u64(out, *(const uint64_t *)total); }

static bool apply(void *state, const void *in, tally_text *why) {
    const usage *event = in;
    uint64_t *total = state, quantity;
    if (!tally_json_u64(event->quantity, &quantity)) {
        why->len = 0;
        tally_text_str(why, "quantity must be a non-negative integer, got ");
        tally_text_bytes(why, event->quantity->text, event->quantity->len);
        return false;
    }
    if (*total > UINT64_MAX - quantity) {
        why->len = 0;
        tally_text_str(why, "total would overflow adding ");
        tally_text_u64(why, quantity);
        return false;
    }
    *total += quantity;
    return true;
}

static bool emit(const void *total, tally_text *out) {
    write_state(total, out);
    return true;
}

static const tally_aggregate billing = {
    .output = "totals",
    .event_size = sizeof(usage),
    .state_size = sizeof(uint64_t),
    .decode = decode,
    .key = key,
    .initial = initial,
    .read_state = read_state,
    .write_state = write_state,
    .apply = apply,
    .emit = emit,
};

TALLY_EXPORT(billing)
