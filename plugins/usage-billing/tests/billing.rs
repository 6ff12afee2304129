//! The billing plugin, built from source and driven through the host's
//! test driver: totals, billing periods, and every kind of bad input.

use tally_testing::{PluginTest, Sent};
use usage_billing::BillingKey;

fn plugin() -> PluginTest {
    PluginTest::build(env!("CARGO_MANIFEST_DIR"), &["totals"])
        .expect("the billing plugin builds and loads")
}

fn usage(customer: &str, metric: &str, quantity: &str, ts: &str) -> String {
    format!(r#"{{"customer":"{customer}","metric":"{metric}","quantity":{quantity},"ts":"{ts}"}}"#)
}

fn key(customer: &str, metric: &str, period: &str) -> BillingKey {
    BillingKey { customer: customer.into(), metric: metric.into(), period: period.into() }
}

/// (key, total) of each emitted record.
fn totals(sent: &Sent) -> Vec<(BillingKey, u64)> {
    sent.outputs
        .iter()
        .map(|output| {
            (serde_json::from_slice(output.key.as_ref().unwrap()).unwrap(), output.json())
        })
        .collect()
}

#[test]
fn every_update_emits_the_running_total_of_its_key() {
    let mut plugin = plugin();
    let sent = plugin.send([
        usage("acme", "api_calls", "3", "2026-11-03T10:00:00Z"),
        usage("acme", "api_calls", "4", "2026-11-04T10:00:00Z"),
        usage("acme", "storage", "10", "2026-11-04T10:00:00Z"),
        usage("globex", "api_calls", "1", "2026-11-05T10:00:00Z"),
    ]);
    assert!(sent.dead_letters.is_empty(), "{:?}", sent.dead_letters);
    let got: Vec<(String, String, u64)> = totals(&sent)
        .into_iter()
        .map(|(k, total)| (k.customer.into(), k.metric.into(), total))
        .collect();
    assert_eq!(
        got,
        vec![
            ("acme".into(), "api_calls".into(), 3),
            ("acme".into(), "api_calls".into(), 7),
            ("acme".into(), "storage".into(), 10),
            ("globex".into(), "api_calls".into(), 1),
        ]
    );
    assert!(sent.outputs.iter().all(|o| o.output == "totals"));

    // State persists across batches.
    let sent = plugin.send([usage("acme", "api_calls", "5", "2026-11-30T23:59:59Z")]);
    assert_eq!(totals(&sent)[0].1, 12);
    assert_eq!(plugin.state::<u64>(&key("acme", "api_calls", "2026-11")), Some(12));
}

#[test]
fn events_on_both_sides_of_a_month_end_go_to_their_own_period() {
    let mut plugin = plugin();
    let sent = plugin.send([
        usage("acme", "api_calls", "1", "2026-10-31T23:59:59Z"),
        usage("acme", "api_calls", "10", "2026-11-01T00:00:00Z"),
        // 00:30 at UTC+1 is still October in UTC.
        usage("acme", "api_calls", "100", "2026-11-01T00:30:00+01:00"),
        // 22:00 at UTC-3 on Nov 30 is already December in UTC.
        usage("acme", "api_calls", "1000", "2026-11-30T22:00:00-03:00"),
        usage("acme", "api_calls", "10000", "2026-12-31T23:59:59.999Z"),
    ]);
    assert!(sent.dead_letters.is_empty(), "{:?}", sent.dead_letters);
    let periods: Vec<(String, u64)> =
        totals(&sent).into_iter().map(|(k, total)| (k.period.into(), total)).collect();
    assert_eq!(
        periods,
        vec![
            ("2026-10".into(), 1),
            ("2026-11".into(), 10),
            ("2026-10".into(), 101),
            ("2026-12".into(), 1000),
            ("2026-12".into(), 11000),
        ]
    );
    assert_eq!(plugin.state::<u64>(&key("acme", "api_calls", "2026-10")), Some(101));
    assert_eq!(plugin.state::<u64>(&key("acme", "api_calls", "2026-11")), Some(10));
    assert_eq!(plugin.state::<u64>(&key("acme", "api_calls", "2026-12")), Some(11000));
}

#[test]
fn each_kind_of_bad_input_is_rejected_with_a_reason_and_changes_nothing() {
    let mut plugin = plugin();
    let sent = plugin.send([
        usage("acme", "api_calls", "2", "2026-11-03T10:00:00Z"),
        "{\"customer\":\"acme\"".to_string(),
        r#"{"metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}"#.to_string(),
        r#"{"customer":"acme","metric":"api_calls","ts":"2026-11-03T10:00:00Z"}"#.to_string(),
        usage("acme", "api_calls", "-3", "2026-11-03T10:00:00Z"),
        usage("acme", "api_calls", "2.5", "2026-11-03T10:00:00Z"),
        usage("acme", "api_calls", "\"7\"", "2026-11-03T10:00:00Z"),
        usage("acme", "api_calls", "1", "last tuesday"),
        usage("acme", "api_calls", "18446744073709551615", "2026-11-03T10:00:00Z"),
        usage("acme", "api_calls", "5", "2026-11-03T10:00:00Z"),
    ]);
    let reasons: Vec<(u64, String)> =
        sent.dead_letters.iter().map(|d| (d.offset, d.reason.clone())).collect();
    let expect = |offset: u64, fragment: &str| {
        let reason = &reasons
            .iter()
            .find(|(o, _)| *o == offset)
            .unwrap_or_else(|| panic!("offset {offset} not rejected: {reasons:?}"))
            .1;
        assert_eq!(reason, fragment, "offset {offset}");
    };
    // The reasons of docs/billing.md, which every language's build gives.
    assert_eq!(reasons.len(), 8, "{reasons:?}");
    expect(1, "event is not valid JSON");
    expect(2, "field `customer` is missing");
    expect(3, "field `quantity` is missing");
    expect(4, "quantity must be a non-negative integer, got -3");
    expect(5, "quantity must be a non-negative integer, got 2.5");
    expect(6, "field `quantity` must be a number");
    expect(7, "ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got \"last tuesday\"");
    expect(8, "total would overflow adding 18446744073709551615");
    // The good events around the bad ones count exactly once.
    assert_eq!(totals(&sent).iter().map(|(_, total)| *total).collect::<Vec<_>>(), vec![2, 7]);
    assert_eq!(plugin.state::<u64>(&key("acme", "api_calls", "2026-11")), Some(7));
    assert_eq!(plugin.all_state().len(), 1);
}

#[test]
fn escaped_strings_decode_to_the_same_key_as_plain_ones() {
    // Plain strings are borrowed from the record, escaped ones decoded into
    // a copy: both must land on the same key.
    let mut plugin = plugin();
    let sent = plugin.send([
        usage("acme", "api_calls", "3", "2026-11-03T10:00:00Z"),
        usage(r"ac\u006de", r"api_\u0063alls", "4", r"2026-11-04T10:00:00\u005a"),
        usage(r#"say \"hi\""#, "api_calls", "5", "2026-11-04T10:00:00Z"),
    ]);
    assert!(sent.dead_letters.is_empty(), "{:?}", sent.dead_letters);
    assert_eq!(plugin.state::<u64>(&key("acme", "api_calls", "2026-11")), Some(7));
    assert_eq!(plugin.state::<u64>(&key("say \"hi\"", "api_calls", "2026-11")), Some(5));
}
