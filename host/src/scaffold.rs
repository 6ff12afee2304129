//! `tally plugin new <dir> --lang rust|python|js|ts`: a working plugin to start
//! from (a per-key counter), with a test in the language's own runner. The
//! files refer to the SDKs in the Tally source tree this binary was built
//! from.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The languages `tally plugin new` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate on `tally-sdk`, tested with `cargo test` (tally-testing).
    Rust,
    /// A Python project on the `tally` package, tested with pytest.
    Python,
    /// A JavaScript package on the `tally` module, tested with `node --test`.
    Js,
    /// JavaScript with TypeScript types checked in the editor (JSDoc
    /// against `tally.d.ts`); built as JavaScript.
    Ts,
}

/// The Tally source tree this binary was built from.
fn source_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ sits in the source tree").to_path_buf()
}

/// Writes a new plugin into `dir` (which must not exist or be empty).
pub fn new_plugin(dir: &Path, lang: Lang) -> anyhow::Result<()> {
    if dir.exists() && std::fs::read_dir(dir).with_context(|| format!("reading `{}`", dir.display()))?.next().is_some() {
        bail!("`{}` is not empty; give a new directory", dir.display());
    }
    let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or("plugin").to_string();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') || name.starts_with(|c: char| c.is_ascii_digit()) {
        bail!("the plugin's directory name {name:?} is its package name: use letters, digits, `-` and `_`, not starting with a digit");
    }
    let tree = source_tree();
    let files: Vec<(&str, String)> = match lang {
        Lang::Rust => rust_files(&name, &tree),
        Lang::Python => python_files(&name, &tree),
        Lang::Js | Lang::Ts => js_files(&name, &tree, lang == Lang::Ts),
    };
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("files sit in a directory")).with_context(|| format!("creating `{}`", dir.display()))?;
        std::fs::write(&path, text).with_context(|| format!("writing `{}`", path.display()))?;
    }
    let next = match lang {
        Lang::Rust => "cargo test",
        Lang::Python => "python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt && .venv/bin/pytest",
        Lang::Js | Lang::Ts => "npm install && npm test",
    };
    let language = match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
        Lang::Ts => "JavaScript (with TypeScript types)",
    };
    println!("new {language} plugin `{name}` in {}: `cd {0} && {next}`, then `tally plugin build {0}`", dir.display());
    Ok(())
}

fn rust_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/rust");
    let testing = tree.join("testing");
    vec![
        (
            "Cargo.toml",
            format!(
                r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
tally-sdk = {{ path = {sdk:?} }}

[dev-dependencies]
tally-testing = {{ path = {testing:?} }}

# A workspace of its own, wherever it sits.
[workspace]
"#
            ),
        ),
        (
            "src/lib.rs",
            r#"//! Counts events per `key`, and emits each key's new count to `counts`.

use serde::Deserialize;
use tally_sdk::{Aggregate, Reject};

/// One input event: `{"key":"a","n":2}`.
#[derive(Deserialize)]
pub struct Event {
    key: String,
    n: u64,
}

#[derive(Default)]
pub struct Counter;

impl Aggregate for Counter {
    type Event<'a> = Event;
    type Key = String;
    type State = u64;
    type Output = u64;
    const OUTPUT: &'static str = "counts";

    fn key(&self, event: &Event) -> Result<String, Reject> {
        Ok(event.key.clone())
    }

    fn apply(&self, _key: &String, count: &u64, event: Event) -> Result<u64, Reject> {
        count.checked_add(event.n).ok_or_else(|| Reject::new(format!("the count would overflow adding {}", event.n)))
    }

    fn emit(&self, _key: &String, count: &u64) -> Option<u64> {
        Some(*count)
    }
}

tally_sdk::export!(Counter);
"#
            .to_string(),
        ),
        (
            "tests/counter.rs",
            r##"//! The plugin built into a component and run by Tally's test driver.

#[test]
fn counts_add_up_and_bad_events_are_refused() {
    let mut plugin = tally_testing::PluginTest::build(env!("CARGO_MANIFEST_DIR"), &["counts"]).unwrap();
    let sent = plugin.send([r#"{"key":"a","n":2}"#, r#"{"key":"a","n":3}"#, "not json"]);
    assert_eq!(sent.dead_letters.len(), 1);
    assert_eq!(plugin.state::<u64>(&"a".to_string()), Some(5));
}
"##
            .to_string(),
        ),
    ]
}

fn python_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/python");
    vec![
        (
            "pyproject.toml",
            format!(
                r#"[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"

# `tally plugin build` makes this module into a component.
[tool.tally]
module = "app"

# The SDK, from the Tally source tree (componentize-py builds in its own copy).
[tool.pytest.ini_options]
pythonpath = [{sdk:?}]
"#
            ),
        ),
        ("requirements-dev.txt", "componentize-py==0.25.1\npytest==8.3.5\n".to_string()),
        (
            "app.py",
            r#""""Counts events per `key`, and emits each key's new count to `counts`.

Input: {"key":"a","n":2}
"""

from tally import Reject, aggregate


def key(event: dict) -> str:
    if not isinstance(event.get("key"), str):
        raise Reject("key must be a string")
    return event["key"]


def apply(count: int, event: dict) -> int:
    n = event.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise Reject("n must be a non-negative integer")
    return count + n


Aggregator = aggregate(output="counts", key=key, initial=lambda: 0, apply=apply, emit=lambda count: count)
"#
            .to_string(),
        ),
        (
            "test_app.py",
            r#""""The plugin under pytest, through Tally's test driver."""

import app
from tally.testing import DeadLetter, PluginTest


def test_counts_add_up_and_bad_events_are_refused():
    plugin = PluginTest(app.Aggregator, outputs=["counts"])
    sent = plugin.send(['{"key":"a","n":2}', '{"key":"a","n":3}', "not json"])
    assert sent.dead_letters == [DeadLetter(2, "event is not valid JSON")]
    assert [record.value for record in sent.outputs] == ["2", "5"]
    assert plugin.state("a") == 5
"#
            .to_string(),
        ),
    ]
}

fn js_files(name: &str, tree: &Path, typed: bool) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/js");
    let types = if typed {
        "\n/** @typedef {{ key: string, n: bigint }} Event */\n\n/** @type {import(\"tally\").AggregateSpec<Event, string, bigint>} */\nconst counter = {\n"
    } else {
        "\nconst counter = {\n"
    };
    vec![
        (
            "package.json",
            format!(
                r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "main": "index.js",
  "scripts": {{ "test": "node --test" }},
  "dependencies": {{ "tally": "file:{}" }},
  "devDependencies": {{ "componentize-qjs": "0.4.5" }}
}}
"#,
                sdk.display()
            ),
        ),
        (
            "index.js",
            format!(
                r#"// Counts events per `key`, and emits each key's new count to `counts`.
// Input: {{"key":"a","n":2}}
import {{ aggregate, Reject }} from "tally";
{types}  output: "counts",
  key: (event) => {{
    if (typeof event.key !== "string") throw new Reject("key must be a string");
    return event.key;
  }},
  initial: () => 0n,
  apply: (count, event) => {{
    if (typeof event.n !== "bigint" || event.n < 0n) throw new Reject("n must be a non-negative integer");
    return count + event.n;
  }},
  emit: (count) => count,
}};

export const aggregator = aggregate(counter);
"#
            ),
        ),
        (
            "index.test.js",
            r#"// The plugin under node's test runner, through Tally's test driver.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PluginTest } from "tally/testing";

test("counts add up and bad events are refused", async () => {
  const plugin = await PluginTest.load(new URL("./index.js", import.meta.url), ["counts"]);
  const sent = plugin.send(['{"key":"a","n":2}', '{"key":"a","n":3}', "not json"]);
  assert.deepEqual(sent.deadLetters, [{ offset: 2, reason: "event is not valid JSON" }]);
  assert.deepEqual(sent.outputs.map((record) => record.value), ["2", "5"]);
  assert.equal(plugin.state("a"), 5);
});
"#
            .to_string(),
        ),
    ]
}
