#!/usr/bin/env python3
"""Prints per-customer billing totals from `tally state list --json` (stdin)
and checks them against the totals gen_usage.py computed from the input.

Usage: tally state list --state-dir STATE --json | billing_report.py EXPECTED_JSON
Exits 1 if the totals differ.
"""
import json
import sys

METRICS = [("api_calls", 12), ("storage_gb_hours", 17), ("egress_mb", 12)]


def main():
    state = {}
    for line in sys.stdin:
        entry = json.loads(line)
        key = entry["key"]
        state["\t".join([key["customer"], key["metric"], key["period"]])] = entry["value"]
    with open(sys.argv[1]) as f:
        expected = json.load(f)

    per_customer = {}
    for key, total in state.items():
        customer, metric, period = key.split("\t")
        per_customer.setdefault((customer, period), {})[metric] = total

    print()
    print(f"{'customer':<10} {'period':<8} " + " ".join(f"{name:>{width}}" for name, width in METRICS))
    for (customer, period), totals in sorted(per_customer.items()):
        cells = " ".join(f"{totals.get(name, 0):>{width}}" for name, width in METRICS)
        print(f"{customer:<10} {period:<8} {cells}")
    print()
    match = state == expected
    print("totals match an independent sum of the input:", "yes" if match else "NO")
    sys.exit(0 if match else 1)


if __name__ == "__main__":
    main()
