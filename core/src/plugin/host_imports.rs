//! The `tally:plugin` imports a plugin calls: keyed state and outputs go
//! into the store's transaction, log lines to the job's plugin log. Each
//! call is bounded before it allocates (see `store`).

use super::bindings;
use super::store::StoreData;

impl bindings::types::Host for StoreData {}

impl bindings::state::Host for StoreData {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        let limit = self.memory_limit;
        match self.txn.get_many(std::slice::from_ref(&key), limit) {
            Ok(mut values) => Ok(values.pop().flatten()),
            Err(err) => Err(self.fail(err)),
        }
    }

    fn get_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        self.check_entries("state.get-many", keys.len())?;
        let limit = self.memory_limit;
        self.txn.get_many(&keys, limit).map_err(|err| self.fail(err))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> wasmtime::Result<()> {
        self.txn.put_many(vec![(key, value)]).map_err(|v| self.fail(v.into()))
    }

    fn put_many(&mut self, entries: Vec<(Vec<u8>, Vec<u8>)>) -> wasmtime::Result<()> {
        self.check_entries("state.put-many", entries.len())?;
        self.txn.put_many(entries).map_err(|v| self.fail(v.into()))
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        self.txn.delete_many(vec![key]).map_err(|v| self.fail(v.into()))
    }

    fn delete_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<()> {
        self.check_entries("state.delete-many", keys.len())?;
        self.txn.delete_many(keys).map_err(|v| self.fail(v.into()))
    }
}

impl bindings::output::Host for StoreData {
    fn emit(&mut self, output: String, record: bindings::OutputRecord) -> wasmtime::Result<()> {
        self.emit_many(output, vec![record])
    }

    fn emit_many(
        &mut self,
        output: String,
        records: Vec<bindings::OutputRecord>,
    ) -> wasmtime::Result<()> {
        self.check_entries("output.emit-many", records.len())?;
        let records = records.into_iter().map(|record| (record.event, record.key, record.value));
        self.txn.emit_many(&output, records).map_err(|err| self.fail(err))
    }
}

/// Longest plugin error line kept as a trap's dead-letter reason.
pub(super) const MAX_LOGGED_ERROR_BYTES: usize = 1024;

impl bindings::log::Host for StoreData {
    fn log(&mut self, level: bindings::Level, message: String) -> wasmtime::Result<()> {
        let level = match level {
            bindings::Level::Trace => tracing::Level::TRACE,
            bindings::Level::Debug => tracing::Level::DEBUG,
            bindings::Level::Info => tracing::Level::INFO,
            bindings::Level::Warn => tracing::Level::WARN,
            bindings::Level::Error => tracing::Level::ERROR,
        };
        self.context.log.write(level, &message);
        if level == tracing::Level::ERROR {
            // A panic message, with the Rust SDK: the reason of the trap that follows.
            self.txn.last_plugin_error =
                Some(crate::text::sanitize(&message, MAX_LOGGED_ERROR_BYTES));
        }
        Ok(())
    }
}

impl bindings::periods::types::Host for StoreData {}

impl bindings::periods::log::Host for StoreData {
    fn log(&mut self, level: bindings::periods::Level, message: String) -> wasmtime::Result<()> {
        use bindings::periods::Level as Wit;
        let level = match level {
            Wit::Trace => bindings::Level::Trace,
            Wit::Debug => bindings::Level::Debug,
            Wit::Info => bindings::Level::Info,
            Wit::Warn => bindings::Level::Warn,
            Wit::Error => bindings::Level::Error,
        };
        bindings::log::Host::log(self, level, message)
    }
}
