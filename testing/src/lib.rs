#![warn(missing_docs)]
//! A test driver for plugin authors: feed events to a built plugin and look
//! at its outputs, dead letters and state, from an ordinary `cargo test`.
//!
//! Events go through the same batch path as a real job (rejections and traps
//! become dead letters), and each [`PluginTest::send`] commits to an
//! in-memory store, so later batches see earlier state.
//!
//! ```no_run
//! use tally_testing::PluginTest;
//!
//! let mut plugin = PluginTest::build(env!("CARGO_MANIFEST_DIR"), &["totals"]).unwrap();
//! let batch = plugin.send([r#"{"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}"#]);
//! assert_eq!(batch.outputs[0].json::<u64>(), 3);
//! assert!(batch.dead_letters.is_empty());
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;
use serde::de::DeserializeOwned;

use tally_core::batch::BatchRunner;
use tally_core::limits::Limits;
use tally_core::plugin::{Event, LoadedPlugin, PluginError, PluginInstance, PluginRuntime};
use tally_core::state::{MemoryStore, StateStore, StoreCommit};
use tally_core::transaction::Transaction;

mod periods_run;

pub use periods_run::{PeriodRecord, PeriodsRun, PeriodsSent, TALLY_BIN};

/// Why the driver could not set up a plugin.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// Building the plugin crate failed.
    #[error(transparent)]
    Build(#[from] tally_plugin_build::BuildError),
    /// The plugin was refused.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// A [`PeriodsRun`] could not run its job (the message says why).
    #[error("{0}")]
    Run(String),
}

/// One record the plugin emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// Output name.
    pub output: String,
    /// Offset of the event that caused it (events are numbered from 0 across sends).
    pub source_offset: u64,
    /// Record key.
    pub key: Option<Vec<u8>>,
    /// Record value.
    pub value: Vec<u8>,
}

impl Emitted {
    /// The value decoded from JSON.
    pub fn json<T: DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.value).unwrap_or_else(|err| {
            panic!(
                "output value {:?} is not the expected JSON: {err}",
                String::from_utf8_lossy(&self.value)
            )
        })
    }
}

/// One event sent to the dead-letter output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Offset of the event (numbered from 0 across sends).
    pub offset: u64,
    /// Why it was not applied.
    pub reason: String,
}

/// What one [`PluginTest::send`] produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sent {
    /// Emitted records, in order.
    pub outputs: Vec<Emitted>,
    /// Dead-lettered events, in offset order.
    pub dead_letters: Vec<Rejected>,
}

/// A plugin under test, with in-memory committed state.
pub struct PluginTest {
    instance: PluginInstance,
    batches: BatchRunner,
    txn: Transaction,
    store: Arc<MemoryStore>,
    next_offset: u64,
}

impl PluginTest {
    /// Builds the plugin crate at `crate_dir` (once per test process) and
    /// loads it; the plugin may emit to `outputs`.
    pub fn build(crate_dir: impl AsRef<Path>, outputs: &[&str]) -> Result<PluginTest, DriverError> {
        static BUILT: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
        let crate_dir = crate_dir.as_ref().to_path_buf();
        let mut built = tally_core::sync::lock(BUILT.get_or_init(Default::default));
        let component = match built.get(&crate_dir) {
            Some(component) => component.clone(),
            None => {
                let target_dir = tally_plugin_build::default_target_dir(&crate_dir);
                let component = tally_plugin_build::build_crate(&crate_dir, &target_dir)?.component;
                built.insert(crate_dir, component.clone());
                component
            }
        };
        drop(built);
        PluginTest::load(&component, outputs)
    }

    /// Loads a built component; the plugin may emit to `outputs`.
    pub fn load(component: &Path, outputs: &[&str]) -> Result<PluginTest, DriverError> {
        PluginTest::load_with_limits(component, outputs, Limits::default())
    }

    /// Loads a built component with non-default limits.
    pub fn load_with_limits(
        component: &Path,
        outputs: &[&str],
        limits: Limits,
    ) -> Result<PluginTest, DriverError> {
        let plugin = runtime()?.load_file(component)?;
        PluginTest::from_plugin(&plugin, outputs, limits)
    }

    /// Wraps an already loaded plugin.
    pub fn from_plugin(
        plugin: &LoadedPlugin,
        outputs: &[&str],
        limits: Limits,
    ) -> Result<PluginTest, DriverError> {
        let store = Arc::new(MemoryStore::default());
        let names: Vec<String> = outputs.iter().map(|name| name.to_string()).collect();
        let txn = Transaction::new(store.clone(), names.into(), limits);
        Ok(PluginTest {
            instance: plugin.instantiate(limits)?,
            batches: BatchRunner::new(),
            txn,
            store,
            next_offset: 0,
        })
    }

    /// Sends `events` (JSON lines) as one batch on partition 0 and commits
    /// it. Panics if the host itself fails (never for plugin misbehaviour,
    /// which shows up as dead letters).
    pub fn send<I: AsRef<[u8]>>(&mut self, events: impl IntoIterator<Item = I>) -> Sent {
        let events: Vec<Event> = events
            .into_iter()
            .map(|value| {
                let offset = self.next_offset;
                self.next_offset += 1;
                Event {
                    partition: 0,
                    offset,
                    timestamp_ms: None,
                    key: None,
                    value: value.as_ref().to_vec(),
                }
            })
            .collect();
        if let Err(err) = self.batches.run(&mut self.instance, &mut self.txn, &events) {
            panic!("the test driver could not run the plugin: {err}");
        }
        let names = self.txn.output_names().to_vec();
        let outputs = self
            .txn
            .outputs()
            .iter()
            .map(|record| Emitted {
                output: names[record.output].clone(),
                source_offset: record.source.offset,
                key: record.key.clone(),
                value: record.value.clone(),
            })
            .collect();
        let mut dead_letters: Vec<Rejected> = self
            .txn
            .dead_letters()
            .iter()
            .map(|dead| Rejected { offset: dead.source.offset, reason: dead.reason.clone() })
            .collect();
        self.txn.outputs_sent();
        dead_letters.sort_by_key(|dead| dead.offset);
        self.store
            .commit(StoreCommit { state: self.txn.overlay.changes(), meta: vec![] })
            .expect("memory store commits");
        self.txn.committed();
        Sent { outputs, dead_letters }
    }

    /// The committed state of `key` (JSON-encoded, as the Rust SDK stores
    /// keys), decoded from JSON.
    pub fn state<T: DeserializeOwned>(&self, key: &impl Serialize) -> Option<T> {
        let key = serde_json::to_vec(key).expect("state keys serialize to JSON");
        self.raw_state(&key).map(|value| {
            serde_json::from_slice(&value).unwrap_or_else(|err| {
                panic!(
                    "state value {:?} is not the expected JSON: {err}",
                    String::from_utf8_lossy(&value)
                )
            })
        })
    }

    /// The committed state of a raw key.
    pub fn raw_state(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.store.get_many(&[key]).expect("memory store reads").pop().flatten()
    }

    /// Every committed state entry, in key order.
    pub fn all_state(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.store.scan_state().expect("memory store reads")
    }
}

/// One engine per test process: compiling is the slow part.
fn runtime() -> Result<&'static PluginRuntime, PluginError> {
    static RUNTIME: OnceLock<PluginRuntime> = OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let runtime = PluginRuntime::new()?;
    Ok(RUNTIME.get_or_init(|| runtime))
}
