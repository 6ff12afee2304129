//! `tally plugin new` writes plugins that build, run and pass their own
//! tests: the JavaScript one under node's test runner, the Python one under
//! pytest, the Go one with `go test`, the C one with make (the SDKs from this tree, the tools
//! scripts/setup installed: no network), each built by `tally plugin build`
//! and run in local mode.

use std::path::Path;
use std::process::Command;

use tally_tests::tally_binary;

fn tally(args: &[&str], dir: &Path) -> String {
    let (succeeded, said) = tally_said(args, dir);
    assert!(succeeded, "tally {args:?} failed: {said}");
    said
}

/// `command` with the build tools scripts/setup installed for the billing
/// plugins named for `tally plugin build`.
fn with_toolchains(command: &mut Command) -> &mut Command {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    command
        .env(
            "TALLY_COMPONENTIZE_QJS",
            workspace.join("plugins/usage-billing-js/node_modules/.bin/componentize-qjs"),
        )
        .env(
            "TALLY_COMPONENTIZE_PY",
            workspace.join("plugins/usage-billing-python/.venv/bin/componentize-py"),
        )
}

/// Runs `tally` with the toolchains scripts/setup installed; whether it
/// succeeded, and what it printed.
fn tally_said(args: &[&str], dir: &Path) -> (bool, String) {
    let tally = tally_binary();
    // Builds here get a target directory of their own: in the shared one
    // they would rewrite, mid-test, the components other tests load (a
    // plugin built alone is not the bytes of the test build's, whose
    // features are unified), and those tests would see another digest.
    let target = tally.parent().and_then(Path::parent).unwrap().join("scaffold-builds");
    let output = with_toolchains(Command::new(tally).args(args).current_dir(dir))
        .env("CARGO_TARGET_DIR", target)
        // Plugin crates resolve their dependencies from the local cache: no network in tests.
        .env("CARGO_NET_OFFLINE", "true")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

/// Every plugin in the tree builds on its own, as its author builds it:
/// `tally plugin build <dir>`, with no other package in the build (the test
/// build's one `cargo build` of all test plugins unifies their features,
/// which once hid a plugin that did not build alone). The two plugins made
/// to be refused build too, and the host's check refuses them saying why.
#[test]
fn every_plugin_in_the_tree_builds_on_its_own() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut dirs: Vec<std::path::PathBuf> = ["plugins", "plugins/test-plugins"]
        .iter()
        .flat_map(|parent| std::fs::read_dir(workspace.join(parent)).unwrap())
        .map(|entry| entry.unwrap().path())
        .filter(|dir| dir.is_dir() && !dir.ends_with("test-plugins"))
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 12, "the tree's plugins: {dirs:?}");
    let out = tempfile::tempdir().unwrap();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        let wasm = out.path().join(format!("{name}.wasm"));
        let (built, said) = tally_said(
            &["plugin", "build", dir.to_str().unwrap(), "--out", wasm.to_str().unwrap()],
            workspace,
        );
        let refusal = match name.as_str() {
            "imports-sockets" => {
                Some("imports `wasi:sockets/tcp@0.2.0`, which Tally does not provide")
            }
            "wrong-wit-version" => Some("was built for tally:plugin@0.2.0"),
            _ => None,
        };
        match refusal {
            None => assert!(built, "{name} does not build on its own: {said}"),
            Some(why) => assert!(
                !built && said.contains(why),
                "{name} builds, and is refused saying {why:?}: {said}"
            ),
        }
        let component = std::fs::read(&wasm).unwrap_or_else(|err| {
            panic!("{name}: no component at {}: {err}: {said}", wasm.display())
        });
        assert!(
            component.starts_with(b"\0asm"),
            "{name}: {} is a WebAssembly file",
            wasm.display()
        );
    }
}

/// Builds the plugin in `dir/name` and runs it over two events.
fn build_and_run(dir: &Path, name: &str) {
    let built = tally(&["plugin", "build", name, "--out", "plugin.wasm"], dir);
    let imports = built
        .lines()
        .find_map(|line| line.strip_prefix("imports: "))
        .unwrap_or_else(|| panic!("no imports printed: {built}"));
    assert!(
        imports.split(", ").all(|import| import.starts_with("tally:plugin/")),
        "only tally:plugin is imported: {imports}"
    );
    std::fs::write(dir.join("in.ndjson"), "{\"key\":\"a\",\"n\":2}\n{\"key\":\"a\",\"n\":3}\n")
        .unwrap();
    tally(
        &[
            "run",
            "--name",
            name,
            "--plugin",
            "plugin.wasm",
            "--output",
            "counts",
            "--input",
            "in.ndjson",
            "--output-dir",
            "out",
            "--state-dir",
            "state",
        ],
        dir,
    );
    let counts = std::fs::read_to_string(dir.join("out/counts.ndjson")).unwrap();
    let values: Vec<u64> = counts
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["value"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(values, [2, 5], "{counts}");
}

#[test]
fn a_new_javascript_plugin_passes_its_test_builds_and_runs() {
    for lang in ["js", "ts"] {
        let dir = tempfile::tempdir().unwrap();
        tally(&["plugin", "new", "counter", "--lang", lang], dir.path());
        let plugin = dir.path().join("counter");
        // What `npm install` would link, without the network.
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        std::fs::create_dir_all(plugin.join("node_modules")).unwrap();
        std::os::unix::fs::symlink(workspace.join("sdk/js"), plugin.join("node_modules/tally"))
            .unwrap();
        let test = Command::new("node").arg("--test").current_dir(&plugin).output().unwrap();
        assert!(
            test.status.success(),
            "{lang}: {}{}",
            String::from_utf8_lossy(&test.stdout),
            String::from_utf8_lossy(&test.stderr)
        );
        build_and_run(dir.path(), "counter");
    }
}

#[test]
fn a_new_python_plugin_passes_its_test_builds_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    tally(&["plugin", "new", "counter", "--lang", "python"], dir.path());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let pytest = workspace.join("plugins/usage-billing-python/.venv/bin/pytest");
    let test = Command::new(pytest)
        .args(["-q", "-p", "no:cacheprovider"])
        .current_dir(dir.path().join("counter"))
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    assert!(
        String::from_utf8_lossy(&test.stdout).contains("1 passed"),
        "{}",
        String::from_utf8_lossy(&test.stdout)
    );
    build_and_run(dir.path(), "counter");
}

#[test]
fn a_new_go_plugin_passes_its_test_builds_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    tally(&["plugin", "new", "counter", "--lang", "go"], dir.path());
    let test = Command::new("go")
        .args(["test", "./..."])
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .current_dir(dir.path().join("counter"))
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    build_and_run(dir.path(), "counter");
}

#[test]
fn a_new_c_plugin_passes_its_test_builds_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    tally(&["plugin", "new", "counter", "--lang", "c"], dir.path());
    let test = Command::new("make")
        .args(["-s", "test"])
        .current_dir(dir.path().join("counter"))
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    build_and_run(dir.path(), "counter");
}

#[test]
fn a_new_rust_plugin_builds_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    tally(&["plugin", "new", "counter", "--lang", "rust"], dir.path());
    build_and_run(dir.path(), "counter");
    let refused = Command::new(tally_binary())
        .args(["plugin", "new", "counter", "--lang", "rust"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("is not empty")
    );
}

#[test]
fn print_in_python_and_console_log_in_javascript_reach_the_host_log() {
    let dir = tempfile::tempdir().unwrap();
    let edits = [
        (
            "python",
            "app.py",
            "    return count + n",
            "    print(\"counting\", n)\n    return count + n",
        ),
        (
            "js",
            "index.js",
            "    return count + event.n;",
            "    console.log(\"counting\", event.n);\n    return count + event.n;",
        ),
    ];
    std::fs::write(
        dir.path().join("in.ndjson"),
        "{\"key\":\"a\",\"n\":2}\n{\"key\":\"a\",\"n\":3}\n",
    )
    .unwrap();
    for (lang, file, from, to) in edits {
        let name = format!("printing_{lang}");
        tally(&["plugin", "new", &name, "--lang", lang], dir.path());
        let source = dir.path().join(&name).join(file);
        let text = std::fs::read_to_string(&source).unwrap();
        assert!(text.contains(from), "{text}");
        std::fs::write(&source, text.replace(from, to)).unwrap();
        tally(&["plugin", "build", &name, "--out", &format!("{name}.wasm")], dir.path());
        let run = Command::new(tally_binary())
            .args([
                "run",
                "--name",
                &name,
                "--plugin",
                &format!("{name}.wasm"),
                "--output",
                "counts",
                "--input",
                "in.ndjson",
            ])
            .args(["--output-dir", &format!("out-{lang}"), "--state-dir", &format!("state-{lang}")])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{log}");
        for n in [2, 3] {
            assert!(
                log.lines()
                    .any(|line| line.contains(&format!("counting {n}")) && line.contains(&name)),
                "{lang}: the line reaches the log with the job's name:\n{log}"
            );
        }
    }
}

/// `tally plugin new --periods` in every language: a period plugin whose
/// own test, in the language's runner, builds it and runs it through this
/// `tally` (TALLY_BIN), seeing November's FINAL in New York time, then an
/// ADJUSTMENT for a late event, and a dead letter. (The Rust one's test
/// needs a cargo build of the test driver, with wasmtime, of its own: here
/// its plugin is built, and is a period plugin.)
#[test]
fn a_new_period_plugin_in_every_language_passes_its_test_against_the_host() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let ts_modules = workspace.join("plugins/billing-periods-ts/node_modules");
    for lang in ["python", "js", "ts", "go", "c", "rust"] {
        let dir = tempfile::tempdir().unwrap();
        let said = tally(&["plugin", "new", "sum", "--lang", lang, "--periods"], dir.path());
        assert!(said.contains("period plugin"), "{said}");
        let plugin = dir.path().join("sum");
        if lang == "js" || lang == "ts" {
            // What `npm install` would link, without the network.
            std::fs::create_dir_all(plugin.join("node_modules/@types")).unwrap();
            std::os::unix::fs::symlink(workspace.join("sdk/js"), plugin.join("node_modules/tally"))
                .unwrap();
            std::os::unix::fs::symlink(
                ts_modules.join("@types/node"),
                plugin.join("node_modules/@types/node"),
            )
            .unwrap();
        }
        let tsc = ts_modules.join(".bin/tsc");
        let (program, args): (&Path, Vec<&str>) = match lang {
            "python" => (
                &workspace.join("plugins/usage-billing-python/.venv/bin/pytest"),
                vec!["-q", "-p", "no:cacheprovider"],
            ),
            "js" => (Path::new("node"), vec!["--test"]),
            "ts" => (
                Path::new("sh"),
                vec!["-c", "\"$TALLY_TSC\" -p tsconfig.test.json && node --test dist/"],
            ),
            "go" => (Path::new("go"), vec!["test", "./..."]),
            "c" => (Path::new("make"), vec!["-s", "test"]),
            _ => {
                let built = tally(&["plugin", "build", "sum", "--out", "sum.wasm"], dir.path());
                assert!(
                    built.contains("imports: tally:plugin/types@0.2.0, tally:plugin/log@0.2.0"),
                    "{built}"
                );
                continue;
            }
        };
        let test = with_toolchains(Command::new(program).args(&args).current_dir(&plugin))
            .env("TALLY_BIN", tally_binary())
            .env("TALLY_TSC", &tsc)
            .env("GOFLAGS", "-mod=mod")
            .env("GOPROXY", "off")
            .output()
            .unwrap();
        assert!(
            test.status.success(),
            "{lang}: {}{}",
            String::from_utf8_lossy(&test.stdout),
            String::from_utf8_lossy(&test.stderr)
        );
    }
}
