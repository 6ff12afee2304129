//! The layout of a Kafka job's keys, in one place: how input partitions
//! are numbered (source ids), how state keys are namespaced by partition,
//! the host's metadata keys, and the changelog's record keys. Everything
//! that writes or reads one of these goes through here (see
//! `docs/formats.md`).

/// How source ids name input partitions: the topic's index among the
/// job's inputs in the high bits, the partition in the low 20 bits. The
/// plugin sees the source id as the event's `partition` (for a one-topic
/// job it is the Kafka partition).
const PARTITION_BITS: u32 = 20;

/// Source id of partition `partition` of input topic number `topic`.
pub fn source_id(topic: usize, partition: i32) -> u32 {
    ((topic as u32) << PARTITION_BITS) | partition as u32
}

/// Input topic number and partition of a source id.
pub fn split_source_id(id: u32) -> (usize, i32) {
    ((id >> PARTITION_BITS) as usize, (id & ((1 << PARTITION_BITS) - 1)) as i32)
}

/// The state namespace of partition `partition`: 4 big-endian bytes, so a
/// partition's keys are contiguous in RocksDB.
pub fn namespace(partition: i32) -> [u8; 4] {
    (partition as u32).to_be_bytes()
}

/// The stored key of plugin key `key` in partition `partition`'s state.
pub fn namespaced(partition: i32, key: &[u8]) -> Vec<u8> {
    let mut full = Vec::with_capacity(4 + key.len());
    full.extend_from_slice(&namespace(partition));
    full.extend_from_slice(key);
    full
}

/// Splits a stored state key into its partition and the plugin's key;
/// `None` for a key too short to hold a namespace (Tally writes none).
pub fn split_namespaced(key: &[u8]) -> Option<(i32, &[u8])> {
    key.split_first_chunk::<4>()
        .map(|(namespace, rest)| (u32::from_be_bytes(*namespace) as i32, rest))
}

/// Metadata key of the next offset of `topic`/`partition` the state includes.
pub fn included_key(topic: &str, partition: i32) -> Vec<u8> {
    format!("kafka/input/{topic}/{partition}").into_bytes()
}

/// Metadata key of the changelog offset partition `partition` restores from.
pub fn checkpoint_key(partition: i32) -> Vec<u8> {
    format!("kafka/changelog/{partition}").into_bytes()
}

/// First byte of a changelog record key holding a state write.
const STATE_RECORD: u8 = b's';
/// First byte of a changelog record key holding an included input offset.
const OFFSET_RECORD: u8 = b'o';

/// What a changelog record's key says it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangelogKey<'k> {
    /// A write of this plugin state key (its value, or a delete).
    State(&'k [u8]),
    /// The next offset of this input topic the state includes.
    Offset(&'k str),
}

impl<'k> ChangelogKey<'k> {
    /// Reads a changelog record key; `None` if Tally writes no such key.
    pub fn parse(key: &'k [u8]) -> Option<ChangelogKey<'k>> {
        let (&kind, rest) = key.split_first()?;
        match kind {
            STATE_RECORD => Some(ChangelogKey::State(rest)),
            OFFSET_RECORD => std::str::from_utf8(rest).ok().map(ChangelogKey::Offset),
            _ => None,
        }
    }

    /// The record key's bytes.
    pub fn to_bytes(self) -> Vec<u8> {
        let (kind, rest) = match self {
            ChangelogKey::State(key) => (STATE_RECORD, key),
            ChangelogKey::Offset(topic) => (OFFSET_RECORD, topic.as_bytes()),
        };
        let mut record = Vec::with_capacity(1 + rest.len());
        record.push(kind);
        record.extend_from_slice(rest);
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ids_round_trip() {
        for (topic, partition) in [(0, 0), (0, 7), (3, 1_000_000)] {
            assert_eq!(split_source_id(source_id(topic, partition)), (topic, partition));
        }
        assert_eq!(source_id(0, 5), 5, "a one-topic job's source id is the partition");
    }

    #[test]
    fn namespaced_keys_and_changelog_keys_round_trip() {
        let key = namespaced(7, b"acme");
        assert_eq!(&key[..4], &namespace(7));
        assert_eq!(split_namespaced(&key), Some((7, &b"acme"[..])));
        assert_eq!(split_namespaced(b"abc"), None);
        for record in [ChangelogKey::State(b"acme"), ChangelogKey::Offset("usage")] {
            assert_eq!(ChangelogKey::parse(&record.to_bytes()), Some(record));
        }
        assert_eq!(ChangelogKey::parse(b"xacme"), None);
        assert_eq!(ChangelogKey::parse(b""), None);
    }
}
