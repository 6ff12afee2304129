#!/usr/bin/env python3
"""Generates sample metered-usage events as NDJSON, one file per partition.

Usage: gen_usage.py OUT_DIR [--events N] [--files F] [--bad-per-mille B] [--seed S]
Prints the expected totals per customer (computed here, independently of
Tally) to OUT_DIR/expected.json.
"""
import argparse
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

CUSTOMERS = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka"]
METRICS = ["api_calls", "storage_gb_hours", "egress_mb"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--bad-per-mille", type=int, default=5)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    files = [open(args.out_dir / f"usage-{i}.ndjson", "w") for i in range(args.files)]
    start = datetime(2026, 10, 20, tzinfo=timezone.utc)
    expected = {}
    for n in range(args.events):
        customer, metric = rng.choice(CUSTOMERS), rng.choice(METRICS)
        quantity = rng.randrange(1000)
        at = start + timedelta(seconds=rng.randrange(50 * 24 * 3600))
        offset = timezone(timedelta(hours=rng.choice([0, 0, 1, -5])))
        ts = at.astimezone(offset).isoformat().replace("+00:00", "Z")
        event = {"customer": customer, "metric": metric, "quantity": quantity, "ts": ts}
        if rng.randrange(1000) < args.bad_per_mille:
            event["quantity"] = -quantity - 1  # rejected: negative quantity
        else:
            period = at.strftime("%Y-%m")
            key = f"{customer}\t{metric}\t{period}"
            expected[key] = expected.get(key, 0) + quantity
        files[n % args.files].write(json.dumps(event, separators=(",", ":")) + "\n")
    for f in files:
        f.close()
    (args.out_dir / "expected.json").write_text(json.dumps(expected, sort_keys=True))


if __name__ == "__main__":
    main()
