//! The plain Rust types a plugin works with, independent of the Wasm boundary.

/// One input record handed to a plugin (see `tally:plugin/types.event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Index of the source partition within the job.
    pub partition: u32,
    /// Position of the record within its partition (line number or Kafka offset).
    pub offset: u64,
    /// Record timestamp in milliseconds since the Unix epoch, if the source has one.
    pub timestamp_ms: Option<i64>,
    /// Record key, if the source has one.
    pub key: Option<Vec<u8>>,
    /// Record payload, exactly as read.
    pub value: Vec<u8>,
}

/// A record for one of the job's outputs. It borrows its bytes: the host
/// copies them out, so a batch's records can share the plugin's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputRecord<'a> {
    /// Index (within the batch) of the event that caused this record.
    pub event: u32,
    /// Record key.
    pub key: Option<&'a [u8]>,
    /// Record payload.
    pub value: &'a [u8],
}

/// An event the plugin refuses; it goes to the dead-letter output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Index of the event within the batch.
    pub index: u32,
    /// Why, for a human.
    pub reason: String,
}

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something failed.
    Error,
}

/// What a plugin can ask of the host: keyed state, outputs and logging.
///
/// Inside a component these are the `tally:plugin` imports; a host that
/// links a plugin natively (benchmarks) implements it directly. Arguments
/// are borrowed: the host copies what it keeps.
pub trait Host {
    /// Reads many keys; one result per key, in order.
    fn get_many(&mut self, keys: &[&[u8]]) -> Vec<Option<Vec<u8>>>;
    /// Writes many keys, in order.
    fn put_many(&mut self, entries: &[(&[u8], &[u8])]);
    /// Deletes many keys.
    fn delete_many(&mut self, keys: &[&[u8]]);
    /// Emits many records to `output` (a name the job declares), in order.
    fn emit_many(&mut self, output: &str, records: &[OutputRecord<'_>]);
    /// Writes a line to the host's log.
    fn log(&mut self, level: Level, message: &str);
}

/// A plugin at the lowest level: a batch of raw events in, rejections out.
///
/// Most plugins implement [`crate::Aggregate`] instead, which gets this for free.
pub trait Plugin {
    /// Processes one batch, in order, through `host`; returns the events it
    /// refused. A refused event must not have changed state or outputs.
    fn process(&self, events: Vec<Event>, host: &mut dyn Host) -> Vec<Rejection>;
}
