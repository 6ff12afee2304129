/*
 * What Tally's two C SDKs share: the text writer, JSON decoded as strictly
 * as serde_json, and the SDK's arena. `tally.h` (the `process` contract,
 * tally:plugin@0.1.0) and `tally_periods.h` (the period contract,
 * tally:plugin@0.2.0) both include this header; a plugin includes one of
 * those, not this.
 *
 * Its definitions, tally_json.c, are compiled as part of tally.c and of
 * tally_periods.c (each #includes it), so a plugin's build goes on naming
 * just one SDK source.
 *
 * Memory: decoded JSON and `tally_alloc` blocks live in the SDK's arena,
 * which the SDK empties when the batch ends (tally.h) or when the export
 * call ends (tally_periods.h).
 */
#ifndef TALLY_JSON_H
#define TALLY_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Text being written: keys, addends, states, outputs, reasons --------- */

/** A growing byte buffer. */
typedef struct tally_text {
    uint8_t *bytes;
    size_t len;
    size_t cap;
} tally_text;

/** Appends `len` bytes. */
void tally_text_bytes(tally_text *text, const void *bytes, size_t len);
/** Appends a NUL-terminated string. */
void tally_text_str(tally_text *text, const char *str);
/** Appends an unsigned integer in decimal. */
void tally_text_u64(tally_text *text, uint64_t value);
/** Appends a signed integer in decimal. */
void tally_text_i64(tally_text *text, int64_t value);
/** Appends UTF-8 `utf8` as a JSON string, quoted and escaped as serde_json
 * writes it (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other controls as
 * `\u00XX`; everything else as is). */
void tally_text_json_string(tally_text *text, const uint8_t *utf8, size_t len);
/** Frees a text's bytes (the SDK frees the texts it hands callbacks). */
void tally_text_free(tally_text *text);
/** Sets `why` to `reason` and returns false: `return tally_reject(why, "…");`. */
bool tally_reject(tally_text *why, const char *reason);

/* ---- JSON values, decoded strictly ----------------------------------------- */

/** What a JSON value is. */
typedef enum tally_json_kind {
    TALLY_JSON_NULL,
    TALLY_JSON_FALSE,
    TALLY_JSON_TRUE,
    TALLY_JSON_NUMBER,
    TALLY_JSON_STRING,
    TALLY_JSON_ARRAY,
    TALLY_JSON_OBJECT,
} tally_json_kind;

/** One decoded JSON value (it lives in the SDK's arena: until the batch,
 * or the export call, ends). */
typedef struct tally_json {
    tally_json_kind kind;
    /** A string's UTF-8 (escapes resolved), or a number's source text. */
    const uint8_t *text;
    size_t len;
    /** The value as written in the record, from its first byte to its
     * last (a string with its quotes and escapes). */
    const uint8_t *raw;
    size_t raw_len;
    /** A string holding a lone surrogate escape (`"\ud800"`), kept as
     * WTF-8 (only with TALLY_JSON_LONE_SURROGATES): serde_json reads it as
     * no text at all, so a plugin reading it as text refuses the event as
     * "event is not valid JSON". */
    bool lone_surrogate;
    /** Items of an array, members of an object. */
    size_t count;
    /** An array's items, an object's values. */
    struct tally_json *items;
    /** An object's names (strings), one per value, in the record's order. */
    struct tally_json *names;
} tally_json;

/** Most nesting a decoded value may have (as serde_json's limit). */
#define TALLY_JSON_MAX_DEPTH 128
/** Keep strings with lone surrogate escapes instead of refusing them. */
#define TALLY_JSON_LONE_SURROGATES 1

/** Decodes one JSON value from `bytes` as strictly as serde_json: UTF-8
 * only, RFC 8259 (no comments, trailing commas, leading zeros, NaN), at
 * most TALLY_JSON_MAX_DEPTH levels. Numbers keep their source text (see
 * `tally_json_u64`). On failure returns false with `why` set to "event is
 * not UTF-8" or "event is not valid JSON" (the other SDKs' reasons). */
bool tally_json_decode(const uint8_t *bytes, size_t len, int flags, tally_json *out, tally_text *why);
/** The last value of member `name` of `object`; NULL when it has none or
 * `object` is NULL or not an object. */
const tally_json *tally_json_get(const tally_json *object, const char *name);
/** How many times `object` gives member `name`. */
size_t tally_json_count(const tally_json *object, const char *name);
/** Whether `value` is a string (NULL is not). */
bool tally_json_is_string(const tally_json *value);
/** Whether `value` is a string without a lone surrogate: text. */
bool tally_json_is_text(const tally_json *value);
/** Whether `value` is a number (NULL is not). */
bool tally_json_is_number(const tally_json *value);
/** `number` as a u64 when it is written as an integer without sign,
 * fraction or exponent, at most 2^64 - 1. */
bool tally_json_u64(const tally_json *number, uint64_t *out);
/** `number` as an i64 when it is written as an integer without fraction
 * or exponent, within i64. */
bool tally_json_i64(const tally_json *number, int64_t *out);
/** Whether `number` reads as a finite double (`1e400` does not). */
bool tally_json_finite(const tally_json *number);
/** Whether a string holds exactly the NUL-terminated `text`. */
bool tally_json_string_is(const tally_json *string, const char *text);
/** Whether a string holds exactly the `len` bytes at `bytes`. */
bool tally_json_string_eq(const tally_json *string, const uint8_t *bytes, size_t len);

/* ---- Memory for the batch (tally.h) or the export call (tally_periods.h) -- */

/** `size` bytes (8-aligned, zeroed) freed when the batch, or the export
 * call, ends. */
void *tally_alloc(size_t size);

#ifdef __cplusplus
}
#endif

#endif
