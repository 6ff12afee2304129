"""Usage billing in Python: the running total of metered usage per customer,
metric and billing period (the UTC calendar month of the event's timestamp).
It computes what plugins/usage-billing (Rust) computes, byte for byte, with
the same dead-letter reasons: the rules are in docs/billing.md, and
tests/all/languages.rs holds them to it.

Input: {"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}
"""

import re

from tally import JsonNumber, Reject, aggregate, decode_json, duplicates, encode_json

FIELDS = ("customer", "metric", "quantity", "ts")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
U64_MAX = (1 << 64) - 1


def decode(value: bytes) -> dict:
    event = decode_json(value, numbers="raw", lone_surrogates=True)
    # A number alone is read as a float, so one out of range is not JSON.
    if isinstance(event, JsonNumber) and not event.is_finite():
        raise Reject("event is not valid JSON")
    if not isinstance(event, dict):
        raise Reject("event must be a JSON object")
    for field in FIELDS:
        if field in duplicates(event):
            raise Reject(f"field `{field}` is given twice")
        if field not in event:
            raise Reject(f"field `{field}` is missing")
    for field in FIELDS:
        if field == "quantity":
            if not isinstance(event[field], JsonNumber):
                raise Reject("field `quantity` must be a number")
        elif not isinstance(event[field], str):
            raise Reject(f"field `{field}` must be a string")
        # A lone surrogate escape is kept by the decoder (other fields may
        # hold one and are ignored), but it is no text: the event is not JSON.
        elif LONE_SURROGATE.search(event[field]):
            raise Reject("event is not valid JSON")
    return event


def key(usage: dict) -> dict:
    return {"customer": usage["customer"], "metric": usage["metric"], "period": billing_period(usage["ts"])}


def apply(total: int, usage: dict) -> int:
    text = usage["quantity"].text
    if not (text.isascii() and text.isdigit()) or len(text) > 20 or int(text) > U64_MAX:
        raise Reject(f"quantity must be a non-negative integer, got {text}")
    quantity = int(text)
    if total + quantity > U64_MAX:
        raise Reject(f"total would overflow adding {quantity}")
    return total + quantity


Aggregator = aggregate(output="totals", decode=decode, key=key, initial=lambda: 0, apply=apply, emit=lambda total: total)

TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)


def billing_period(ts: str) -> str:
    """`YYYY-MM` of the UTC month of RFC 3339 timestamp `ts`."""
    parts = TIMESTAMP.fullmatch(ts)
    if parts is None:
        refuse(ts)
    year, month, day, hour, minute, second = (int(part) for part in parts.group(1, 2, 3, 4, 5, 6))
    sign, offset_hours, offset_minutes = parts.group(7, 8, 9)
    offset = 0 if sign is None else (-1 if sign == "-" else 1) * (int(offset_hours) * 60 + int(offset_minutes))
    if not (1 <= month <= 12 and 1 <= day <= days_in(year, month) and hour <= 23 and minute <= 59 and second <= 60):
        refuse(ts)
    if sign is not None and (int(offset_hours) > 23 or int(offset_minutes) > 59):
        refuse(ts)
    minutes = hour * 60 + minute - offset
    if minutes < 0 and day == 1:
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    elif minutes >= 24 * 60 and day == days_in(year, month):
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return f"{min(max(year, 0), 9999):04}-{month:02}"


def refuse(ts: str):
    raise Reject(f"ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got {encode_json(ts)}")


def days_in(year: int, month: int) -> int:
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
