//! The crates' dependencies point one way: the engine (`tally-core`) and
//! the plugin test driver (`tally-testing`) reach no RocksDB, no Kafka
//! client and no HTTP stack, so a plugin author's `cargo test` builds none
//! of them; the engine depends on no driver, and no driver on another or
//! on the server.

use std::collections::BTreeSet;
use std::process::Command;

/// Crates only the drivers and the server may pull in.
const DRIVER_ONLY: &[&str] = &[
    "rocksdb",
    "librocksdb-sys",
    "rdkafka",
    "rdkafka-sys",
    "hyper",
    "axum",
    "tokio",
    "tower-http",
    "ureq",
    "tally-state-rocks",
    "tally-local",
    "tally-kafka",
    "tally-host",
];

/// The HTTP stack: only the server and its client have it.
const HTTP: &[&str] = &["hyper", "axum", "tokio", "tower-http", "ureq"];

/// Every package `root` depends on for its library on this platform
/// (normal dependencies, transitively), by name, from `cargo tree`: it reads
/// only the packages this machine's build already fetched.
fn normal_closure(root: &str) -> BTreeSet<String> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["tree", "--offline", "--locked", "-p", root, "-e", "normal", "--prefix", "none"])
        .current_dir(workspace)
        .output()
        .expect("running cargo tree");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .skip(1) // the root itself
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_engine_and_the_plugin_test_driver_reach_no_rocksdb_kafka_or_http() {
    for root in ["tally-core", "tally-testing"] {
        let closure = normal_closure(root);
        assert!(
            closure.contains("wasmtime"),
            "{root} runs plugins, so it has wasmtime: {closure:?}"
        );
        let forbidden: Vec<&&str> =
            DRIVER_ONLY.iter().filter(|name| closure.contains(**name)).collect();
        assert!(forbidden.is_empty(), "{root} depends on {forbidden:?}; keep drivers out of it");
    }
    let state = normal_closure("tally-state-rocks");
    assert!(
        state.contains("tally-core")
            && state.contains("rocksdb")
            && !state.contains("rdkafka")
            && !state.contains("tally-host"),
        "{state:?}"
    );
}

#[test]
fn each_driver_reaches_the_core_and_no_other_driver_nor_the_server() {
    for (driver, other) in [("tally-local", "tally-kafka"), ("tally-kafka", "tally-local")] {
        let closure = normal_closure(driver);
        assert!(
            closure.contains("tally-core") && closure.contains("tally-state-rocks"),
            "{driver}: {closure:?}"
        );
        let wrong: Vec<&str> = [other, "tally-host"]
            .into_iter()
            .chain(HTTP.iter().copied())
            .filter(|name| closure.contains(*name))
            .collect();
        assert!(
            wrong.is_empty(),
            "{driver} depends on {wrong:?}; a driver depends on the core only"
        );
    }
    assert!(!normal_closure("tally-local").contains("rdkafka"), "local mode needs no Kafka client");
}
