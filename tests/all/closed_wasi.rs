//! The closed `wasi_snapshot_preview1` Go plugins are built with: the
//! checked-in modules are its WAT source assembled, with the world it
//! imports embedded (TALLY_REGENERATE=1 writes them again) — one for each
//! contract, whose logs differ only in their package version — and a Go
//! plugin that reads clocks, randomness, its environment and files sees
//! only what the input hands it, the same on every run.

use std::path::Path;

/// The adapter for the contract `version` of `tally:plugin`: the WAT source,
/// its log import that version's, assembled with the world it imports
/// embedded (the plugin log, for stdout and stderr).
fn assembled(version: &str) -> Vec<u8> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let source = std::fs::read_to_string(workspace.join("sdk/go/closed-wasi.wat")).unwrap();
    let import = "\"tally:plugin/log@0.1.0\"";
    assert_eq!(source.matches(import).count(), 1, "the WAT imports the log once");
    let source = source.replace(import, &format!("\"tally:plugin/log@{version}\""));
    let mut adapter = wat::parse_str(&source).unwrap();
    let mut resolve = wit_parser::Resolve::default();
    resolve.push_path(workspace.join(format!("wit/tally-plugin@{version}"))).unwrap();
    let world_text = format!(
        "package tally:closed-wasi;\nworld adapter {{ import tally:plugin/log@{version}; }}\n"
    );
    let package = resolve.push_str("closed-wasi.wit", &world_text).unwrap();
    let world = resolve.select_world(&[package], Some("adapter")).unwrap();
    wit_component::embed_component_metadata(
        &mut adapter,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    adapter
}

#[test]
fn the_checked_in_closed_wasis_are_assembled_from_their_source() {
    for (file, version) in [("closed-wasi.wasm", "0.1.0"), ("closed-wasi-periods.wasm", "0.2.0")] {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("sdk/go").join(file);
        let built = assembled(version);
        if std::env::var_os("TALLY_REGENERATE").is_some() {
            std::fs::write(&path, &built).unwrap();
        }
        assert!(
            std::fs::read(&path).unwrap() == built,
            "sdk/go/{file} is stale: run this test with TALLY_REGENERATE=1"
        );
    }
}

/// Runs the sandbox plugin over `input` with `tally run`; returns the
/// records it emitted (digest blanked) and what the host logged.
fn run_sandbox(dir: &Path, run: &str, input: &Path) -> (String, String) {
    let out = dir.join(run);
    let output = std::process::Command::new(tally_tests::tally_binary())
        .args([
            "run",
            "--name",
            "sandbox",
            "--plugin",
            crate::plugins::GO_SANDBOX,
            "--output",
            "seen",
            "--input",
        ])
        .arg(input)
        .arg("--output-dir")
        .arg(out.join("out"))
        .arg("--state-dir")
        .arg(out.join("state"))
        .env("TALLY_CACHE_DIR", dir.join("compiled"))
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{log}");
    let digest = tally_core::plugin::digest(&std::fs::read(crate::plugins::GO_SANDBOX).unwrap());
    let seen = std::fs::read_to_string(out.join("out/seen.ndjson"))
        .unwrap()
        .replace(&digest[..23], "sha256:<digest>");
    (seen, log)
}

#[test]
fn a_go_plugin_sees_no_host_and_the_same_time_and_randomness_on_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    std::fs::write(&input, (0..300).map(|n| format!("{{\"n\":{n}}}\n")).collect::<String>())
        .unwrap();
    let (first, log) = run_sandbox(dir.path(), "first", &input);
    let (second, _) = run_sandbox(dir.path(), "second", &input);
    assert_eq!(first, second, "a re-run of the same input gives byte-identical outputs");

    let seen: Vec<String> = first
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["value"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(seen.len(), 300);
    let fields: Vec<&str> = seen[0].split('|').collect();
    // NDJSON records carry no time: the clock reads the epoch (and ticks).
    assert!(fields[0].starts_with("1970-01-01T00:00:00"), "{}", seen[0]);
    assert_eq!(
        &fields[2..6],
        ["[]", "[]", "true", "true"],
        "no arguments, no environment, no files: {}",
        seen[0]
    );
    let randoms: std::collections::BTreeSet<&str> =
        seen.iter().map(|record| record.split('|').nth(1).unwrap()).collect();
    assert_eq!(randoms.len(), 300, "randomness still varies within a run");
    assert!(
        log.contains("hello from stdout") && log.contains("hello from stderr"),
        "stdout and stderr reach the log:\n{log}"
    );
    assert!(
        log.lines().any(|line| line.contains("hello from stdout") && line.contains("sandbox")),
        "labelled with the job:\n{log}"
    );
}
