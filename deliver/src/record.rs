//! One committed output record, read for delivery: its idempotency key,
//! the key that orders it (records of one key are delivered in order) and
//! the request body it makes.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::settings::Body;
use crate::source::{KafkaRecord, Payload};

/// Longest output line a delivery reads; a longer one is a dead letter.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// A committed output record, ready to deliver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputRecord {
    /// Its partition (0 for a local output).
    pub partition: u32,
    /// Its offset in the partition (a local output's: its line's byte offset).
    pub offset: u64,
    /// The job's idempotency key for it.
    pub idempotency_key: String,
    /// Its `key` as the job wrote it: records with the same one are
    /// delivered in their order.
    pub order_key: String,
    /// The request body.
    pub body: Vec<u8>,
}

/// The parts of a line a delivery reads.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    key: Option<&'a RawValue>,
    #[serde(borrow)]
    value: &'a RawValue,
    idempotency_key: String,
}

impl OutputRecord {
    /// Reads the record at `offset` of `partition`, or says why it cannot
    /// be delivered.
    pub fn read(
        partition: u32,
        offset: u64,
        payload: &Payload,
        body: Body,
    ) -> Result<OutputRecord, String> {
        let mut record = match payload {
            Payload::Json(line) => OutputRecord::parse(offset, line, body),
            Payload::Kafka(record) => OutputRecord::from_kafka(offset, record, body),
            Payload::TooLong(length) => Err(too_long(*length as usize)),
        }?;
        record.partition = partition;
        Ok(record)
    }

    /// Reads the local output line at `offset` (without its line end), or
    /// says why it cannot be delivered.
    pub fn parse(offset: u64, line: &[u8], body: Body) -> Result<OutputRecord, String> {
        if line.len() > MAX_RECORD_BYTES {
            return Err(too_long(line.len()));
        }
        let parsed: Line<'_> = serde_json::from_slice(line).map_err(|err| {
            format!(
                "not an output record (a JSON object with `value` and `idempotency_key`): {err}"
            )
        })?;
        if parsed.idempotency_key.is_empty() {
            return Err("its idempotency_key is empty".into());
        }
        let body = match body {
            Body::Value => parsed.value.get().as_bytes().to_vec(),
            Body::Record => line.to_vec(),
        };
        Ok(OutputRecord {
            partition: 0,
            offset,
            order_key: parsed.key.map(|key| key.get().to_string()).unwrap_or_default(),
            idempotency_key: parsed.idempotency_key,
            body,
        })
    }

    /// Reads a Kafka output record: its key and value inlined when each is
    /// one JSON value, else as a JSON string (as a local output line has
    /// them); its idempotency key header must be there. `Body::Record`
    /// makes the object a local output line is: key, value, lineage
    /// (`source`) and idempotency key.
    pub fn from_kafka(
        offset: u64,
        record: &KafkaRecord,
        body: Body,
    ) -> Result<OutputRecord, String> {
        let size =
            record.key.as_ref().map_or(0, Vec::len) + record.value.as_ref().map_or(0, Vec::len);
        if size > MAX_RECORD_BYTES {
            return Err(too_long(size));
        }
        let idempotency_key = match &record.idempotency_key {
            Some(key) if !key.is_empty() => key.clone(),
            _ => return Err("it has no tally.idempotency-key header".into()),
        };
        let value = inlined(record.value.as_deref().ok_or("it has no value (a tombstone)")?);
        let key = record.key.as_deref().map(inlined);
        let body = match body {
            Body::Value => value.get().as_bytes().to_vec(),
            Body::Record => {
                let mut line = serde_json::Map::new();
                let raw = |raw: &RawValue| {
                    serde_json::from_str::<serde_json::Value>(raw.get()).expect("checked above")
                };
                line.insert("key".into(), key.as_deref().map_or(serde_json::Value::Null, raw));
                line.insert("value".into(), raw(&value));
                line.insert(
                    "source".into(),
                    serde_json::to_value(&record.lineage).expect("strings serialize"),
                );
                line.insert("idempotency_key".into(), idempotency_key.clone().into());
                serde_json::to_vec(&line).expect("JSON serializes")
            }
        };
        Ok(OutputRecord {
            partition: 0,
            offset,
            order_key: key.map(|key| key.get().to_string()).unwrap_or_default(),
            idempotency_key,
            body,
        })
    }
}

/// `bytes` as one JSON value: themselves when they are one, else a JSON
/// string of them (invalid UTF-8 replaced).
fn inlined(bytes: &[u8]) -> Box<RawValue> {
    match serde_json::from_slice::<&RawValue>(bytes) {
        Ok(value) => value.to_owned(),
        Err(_) => {
            let text =
                serde_json::to_string(&String::from_utf8_lossy(bytes)).expect("strings serialize");
            RawValue::from_string(text).expect("a JSON string is one JSON value")
        }
    }
}

fn too_long(length: usize) -> String {
    format!("the record is {length} bytes, over the delivery's limit of {MAX_RECORD_BYTES} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"key":{"customer":"acme","period":"2026-11"},"value":{"type":"final","value":5120},"source":{"partition":"usage-0.ndjson","offset":12},"plugin":"sha256:0a0c","idempotency_key":"billing/customer=acme/v1"}"#;

    #[test]
    fn a_record_gives_its_value_as_written_and_its_keys() {
        let record = OutputRecord::parse(7, LINE.as_bytes(), Body::Value).unwrap();
        assert_eq!(record.offset, 7);
        assert_eq!(record.body, br#"{"type":"final","value":5120}"#);
        assert_eq!(record.order_key, r#"{"customer":"acme","period":"2026-11"}"#);
        assert_eq!(record.idempotency_key, "billing/customer=acme/v1");
        let whole = OutputRecord::parse(7, LINE.as_bytes(), Body::Record).unwrap();
        assert_eq!(whole.body, LINE.as_bytes());
    }

    #[test]
    fn a_kafka_record_gives_its_value_and_cannot_smuggle_another_key() {
        let record = KafkaRecord {
            key: Some(br#"{"customer":"acme"}"#.to_vec()),
            value: Some(br#"{"type":"final","value":5120}"#.to_vec()),
            idempotency_key: Some("billing/f/v1".into()),
            lineage: [("plugin".to_string(), "sha256:0a".to_string())].into(),
        };
        let read = OutputRecord::read(3, 9, &Payload::Kafka(record.clone()), Body::Value).unwrap();
        assert_eq!((read.partition, read.offset), (3, 9));
        assert_eq!(read.body, br#"{"type":"final","value":5120}"#);
        assert_eq!(read.order_key, r#"{"customer":"acme"}"#);
        let whole = OutputRecord::from_kafka(9, &record, Body::Record).unwrap();
        let whole: serde_json::Value = serde_json::from_slice(&whole.body).unwrap();
        assert_eq!(whole["idempotency_key"], "billing/f/v1");
        assert_eq!(whole["value"]["value"], 5120);
        // A value that would close the object early is no JSON value: it
        // goes as a string.
        let forged = KafkaRecord {
            value: Some(br#"1,"idempotency_key":"other""#.to_vec()),
            ..record.clone()
        };
        let whole = OutputRecord::from_kafka(9, &forged, Body::Record).unwrap();
        let whole: serde_json::Value = serde_json::from_slice(&whole.body).unwrap();
        assert_eq!(whole["idempotency_key"], "billing/f/v1");
        assert_eq!(whole["value"], r#"1,"idempotency_key":"other""#);
        let keyless = KafkaRecord { idempotency_key: None, ..record };
        assert!(
            OutputRecord::from_kafka(9, &keyless, Body::Value).unwrap_err().contains("idempotency")
        );
    }

    #[test]
    fn a_line_that_is_no_record_says_what_it_lacks() {
        for line in ["{}", "not json", r#"{"value":1,"idempotency_key":""}"#] {
            let err = OutputRecord::parse(0, line.as_bytes(), Body::Value).unwrap_err();
            assert!(err.contains("idempotency_key"), "{line}: {err}");
        }
        let huge = vec![b' '; MAX_RECORD_BYTES + 1];
        assert!(OutputRecord::parse(0, &huge, Body::Value).unwrap_err().contains("limit"));
    }
}
