//! Plugins the host must refuse, each with a clear error and nothing written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tally_tests::*;

use crate::plugins::{IMPORTS_SOCKETS, USAGE_BILLING, WRONG_WIT_VERSION};

/// Runs the billing job with `plugin`; returns the output of `tally run`.
fn run_with_plugin(dir: &Path, plugin: &Path) -> Output {
    let (inputs, _) = write_partitions(dir, &usage_lines(3, 50, 0), 1);
    let job = write_billing_job(dir, plugin.to_str().unwrap(), &inputs, "");
    Command::new(tally_binary()).arg("run").arg(&job).output().unwrap()
}

fn assert_refused(plugin: &Path, expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let run = run_with_plugin(dir.path(), plugin);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "a bad plugin was run");
    assert!(stderr.contains(expected), "expected {expected:?} in: {stderr}");
    assert!(!dir.path().join("state").exists(), "a refused plugin must not create state");
    assert!(!dir.path().join("out").exists(), "a refused plugin must not create outputs");

    let inspect =
        Command::new(tally_binary()).args(["plugin", "inspect"]).arg(plugin).output().unwrap();
    assert!(!inspect.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&inspect.stdout),
        String::from_utf8_lossy(&inspect.stderr)
    );
    assert!(said.contains(expected), "inspect should say {expected:?}: {said}");
}

#[test]
fn a_plugin_importing_sockets_is_refused_naming_the_import() {
    assert_refused(
        Path::new(IMPORTS_SOCKETS),
        "imports `wasi:sockets/tcp@0.2.0`, which Tally does not provide: plugins may only use tally:plugin's state, output and log",
    );
}

#[test]
fn a_plugin_for_another_contract_version_is_refused_naming_both_versions() {
    assert_refused(
        Path::new(WRONG_WIT_VERSION),
        "was built for tally:plugin@0.2.0, but this host runs tally:plugin@0.1.0",
    );
}

#[test]
fn a_core_module_is_refused_as_not_a_component() {
    // The billing plugin's own core module, before `tally plugin build` wrapped it.
    let components_dir = Path::new(USAGE_BILLING).parent().unwrap();
    let core: PathBuf =
        components_dir.parent().unwrap().join("wasm32-unknown-unknown/release/usage_billing.wasm");
    assert!(core.exists(), "{} should exist after the plugin build", core.display());
    assert_refused(&core, "is a core WebAssembly module, not a component");
}

#[test]
fn a_file_that_is_not_wasm_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("billing.wasm");
    std::fs::write(&fake, "#!/bin/sh\necho hello\n").unwrap();
    assert_refused(&fake, "is not a WebAssembly file");
}

#[test]
fn a_missing_plugin_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_with_plugin(dir.path(), &dir.path().join("nowhere.wasm"));
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("cannot read plugin") && stderr.contains("nowhere.wasm"), "{stderr}");
}

#[test]
fn inspect_describes_a_good_plugin() {
    let inspect = Command::new(tally_binary())
        .args(["plugin", "inspect", "--json", USAGE_BILLING])
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{}", String::from_utf8_lossy(&inspect.stderr));
    let report: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(report["wit_versions"], serde_json::json!(["0.1.0"]));
    assert_eq!(report["exports"], serde_json::json!(["tally:plugin/aggregator@0.1.0"]));
    let imports: Vec<&str> =
        report["imports"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(imports.iter().all(|i| i.starts_with("tally:plugin/")), "{imports:?}");
    assert!(report["size"].as_u64().unwrap() > 0);
    assert!(report["digest"].as_str().unwrap().starts_with("sha256:"));
}
