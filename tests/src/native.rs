//! A plugin's logic compiled natively into the host, behind the same
//! [`Processor`] trait the Wasm runtime implements. The benchmark runs the
//! billing job both ways through the same task, so the only difference is
//! the Wasm boundary.

use tally_core::plugin::{Event, ProcessError, Processor, Rejection};
use tally_core::transaction::{HostCallError, Transaction};
use tally_sdk::{Host, Level, OutputRecord, Plugin};

/// Runs a `tally_sdk::Plugin` natively.
pub struct NativeProcessor<P> {
    plugin: P,
    digest: String,
}

impl<P: Plugin> NativeProcessor<P> {
    /// Wraps `plugin`; `name` appears in lineage as `native:<name>`.
    pub fn new(plugin: P, name: &str) -> Self {
        NativeProcessor { plugin, digest: format!("native:{name}") }
    }
}

/// The SDK's host interface, served straight from the transaction.
struct DirectHost<'a> {
    txn: &'a mut Transaction,
    failure: Option<HostCallError>,
}

impl DirectHost<'_> {
    fn fail(&mut self, err: HostCallError) {
        self.failure.get_or_insert(err);
    }
}

impl Host for DirectHost<'_> {
    // Each call copies what the transaction keeps, as the Wasm path's
    // lifting of the same arguments does.
    fn get_many(&mut self, keys: &[&[u8]]) -> Vec<Option<Vec<u8>>> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|key| key.to_vec()).collect();
        let limit = self.txn.limits().memory_bytes;
        match self.txn.get_many(&keys, limit) {
            Ok(values) => values,
            Err(err) => {
                let empty = vec![None; keys.len()];
                self.fail(err);
                empty
            }
        }
    }

    fn put_many(&mut self, entries: &[(&[u8], &[u8])]) {
        let entries = entries.iter().map(|(key, value)| (key.to_vec(), value.to_vec())).collect();
        if let Err(err) = self.txn.put_many(entries) {
            self.fail(err.into());
        }
    }

    fn delete_many(&mut self, keys: &[&[u8]]) {
        if let Err(err) = self.txn.delete_many(keys.iter().map(|key| key.to_vec()).collect()) {
            self.fail(err.into());
        }
    }

    fn emit_many(&mut self, output: &str, records: &[OutputRecord<'_>]) {
        let records = records
            .iter()
            .map(|record| (record.event, record.key.map(<[u8]>::to_vec), record.value.to_vec()));
        if let Err(err) = self.txn.emit_many(output, records) {
            self.fail(err);
        }
    }

    fn log(&mut self, _level: Level, _message: &str) {}
}

impl<P: Plugin> Processor for NativeProcessor<P> {
    fn process(
        &mut self,
        events: &[Event],
        txn: &mut Transaction,
    ) -> Result<Vec<Rejection>, ProcessError> {
        // The Wasm path copies each event into guest memory; this copies it
        // into the SDK's owned type.
        let events = events
            .iter()
            .map(|event| tally_sdk::Event {
                partition: event.partition,
                offset: event.offset,
                timestamp_ms: event.timestamp_ms,
                key: event.key.clone(),
                value: event.value.clone(),
            })
            .collect();
        let mut host = DirectHost { txn, failure: None };
        let rejections = self.plugin.process(events, &mut host);
        match host.failure {
            None => Ok(rejections
                .into_iter()
                .map(|r| Rejection { index: r.index, reason: r.reason })
                .collect()),
            Some(HostCallError::Violation(violation)) => Err(ProcessError::Plugin(violation.0)),
            Some(HostCallError::Misconfigured(message)) => {
                Err(ProcessError::Misconfigured(message))
            }
            Some(HostCallError::State(state)) => Err(ProcessError::Host(state)),
        }
    }

    fn digest(&self) -> &str {
        &self.digest
    }
}
