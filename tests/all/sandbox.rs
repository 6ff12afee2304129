//! The sandbox: a plugin that panics, spins or hogs memory is stopped on
//! the event that caused it, which is dead-lettered with the reason; every
//! other event is applied exactly once.

use std::path::Path;

use tally_core::limits::Limits;
use tally_testing::PluginTest;

use crate::plugins::MISBEHAVING;

#[test]
fn misbehaving_events_are_dead_lettered_and_the_rest_count_once() {
    let limits = Limits { memory_bytes: 16 << 20, cpu_budget_ms: 200, ..Limits::default() };
    let mut plugin =
        PluginTest::load_with_limits(Path::new(MISBEHAVING), &["counts"], limits).unwrap();
    let sent = plugin.send([
        r#"{"k":"a"}"#,
        r#"{"k":"a","do":"panic"}"#,
        r#"{"k":"a"}"#,
        r#"{"k":"b","do":"spin"}"#,
        r#"{"k":"b"}"#,
        r#"{"k":"a","do":"hog"}"#,
        r#"{"k":"a","do":"reject"}"#,
        r#"{"k":"a"}"#,
    ]);
    let dead: Vec<(u64, &str)> =
        sent.dead_letters.iter().map(|d| (d.offset, d.reason.as_str())).collect();
    assert_eq!(dead.iter().map(|d| d.0).collect::<Vec<_>>(), vec![1, 3, 5, 6], "{dead:?}");
    assert!(
        dead[0].1.contains("plugin trapped") && dead[0].1.contains("asked to panic on key a"),
        "{dead:?}"
    );
    // Retried alone, each event has its share of the batch's budget.
    assert!(
        dead[1].1.contains("exceeded its CPU budget of 25 ms for this event")
            && dead[1].1.contains("limits.cpu_budget_ms = 200 over 8 events"),
        "{dead:?}"
    );
    assert!(dead[2].1.contains("exceeded its memory limit of 16 MiB"), "{dead:?}");
    assert_eq!(dead[3].1, "asked to reject");

    let counts: Vec<(u64, u64)> =
        sent.outputs.iter().map(|o| (o.source_offset, o.json::<u64>())).collect();
    assert_eq!(counts, vec![(0, 1), (2, 2), (4, 1), (7, 3)]);
    assert_eq!(plugin.state::<u64>(&"a"), Some(3));
    assert_eq!(plugin.state::<u64>(&"b"), Some(1));

    // The instance that trapped was replaced; the plugin keeps working.
    let sent = plugin.send([r#"{"k":"b"}"#]);
    assert_eq!(sent.outputs[0].json::<u64>(), 2);
}

#[test]
fn deep_recursion_is_stopped_by_the_wasm_stack_limit() {
    use crate::plugins::HOSTILE;
    let mut plugin = PluginTest::load(Path::new(HOSTILE), &["counts"]).unwrap();
    let sent = plugin.send([r#"{"k":"a"}"#, r#"{"k":"a","do":"recurse"}"#, r#"{"k":"a"}"#]);
    let dead: Vec<(u64, &str)> =
        sent.dead_letters.iter().map(|d| (d.offset, d.reason.as_str())).collect();
    assert_eq!(dead.iter().map(|d| d.0).collect::<Vec<_>>(), vec![1], "{dead:?}");
    assert!(dead[0].1.contains("call stack exhausted"), "{dead:?}");
    assert_eq!(plugin.state::<u64>(&"a"), Some(2));
}
