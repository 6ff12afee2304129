//! One committed output line, read for delivery: its idempotency key, the
//! key that orders it (records of one key are delivered in order) and the
//! request body it makes.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::settings::Body;

/// Longest output line a delivery reads; a longer one is a dead letter.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// A committed output record, ready to deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// Byte offset of its line in the output.
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
    /// Reads the line at `offset` (without its line end), or says why it
    /// cannot be delivered.
    pub fn parse(offset: u64, line: &[u8], body: Body) -> Result<OutputRecord, String> {
        if line.len() > MAX_RECORD_BYTES {
            return Err(format!(
                "the record is {} bytes, over the delivery's limit of {MAX_RECORD_BYTES} bytes",
                line.len()
            ));
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
            offset,
            order_key: parsed.key.map(|key| key.get().to_string()).unwrap_or_default(),
            idempotency_key: parsed.idempotency_key,
            body,
        })
    }
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
    fn a_line_that_is_no_record_says_what_it_lacks() {
        for line in ["{}", "not json", r#"{"value":1,"idempotency_key":""}"#] {
            let err = OutputRecord::parse(0, line.as_bytes(), Body::Value).unwrap_err();
            assert!(err.contains("idempotency_key"), "{line}: {err}");
        }
        let huge = vec![b' '; MAX_RECORD_BYTES + 1];
        assert!(OutputRecord::parse(0, &huge, Body::Value).unwrap_err().contains("limit"));
    }
}
