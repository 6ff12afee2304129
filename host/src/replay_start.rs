//! `tally replay --from`: `earliest` (every input from its start), an RFC
//! 3339 time, or offsets (`0:1200,1:980`; `<topic>:0:1200` when the job
//! has several inputs). The Kafka job seeds the start before the version
//! first runs ([`tally_kafka::StartAt`]).

use std::collections::BTreeMap;

use anyhow::bail;
use tally_kafka::StartAt;

/// Reads `--from`'s value for a job reading `inputs`: `None` for
/// `earliest`, where a new consumer group starts anyway.
pub fn parse(text: &str, inputs: &[String]) -> anyhow::Result<Option<StartAt>> {
    if text == "earliest" {
        return Ok(None);
    }
    if let Ok(at) = text.parse::<jiff::Timestamp>() {
        return Ok(Some(StartAt::Time(at)));
    }
    let bad = || {
        anyhow::anyhow!(
            "--from {text:?} is neither `earliest`, an RFC 3339 time (2026-11-01T00:00:00Z) nor offsets \
             (`0:1200,1:980`, or `<topic>:0:1200` with several inputs)"
        )
    };
    let mut offsets = BTreeMap::new();
    for entry in text.split(',') {
        let mut parts: Vec<&str> = entry.trim().rsplitn(3, ':').collect();
        parts.reverse();
        let (topic, partition, offset) = match parts.as_slice() {
            [partition, offset] => match inputs {
                [only] => (only.clone(), partition, offset),
                _ => bail!(
                    "--from {text:?}: the job reads {} inputs; name each offset's topic (`<topic>:{partition}:{offset}`)",
                    inputs.len()
                ),
            },
            [topic, partition, offset] => (topic.to_string(), partition, offset),
            _ => return Err(bad()),
        };
        let partition: i32 = partition.parse().map_err(|_| bad())?;
        let offset: i64 = offset.parse().map_err(|_| bad())?;
        if partition < 0 || offset < 0 {
            return Err(bad());
        }
        if !inputs.contains(&topic) {
            bail!(
                "--from {text:?} names topic `{}`, which the job does not read: name one of its inputs ({})",
                tally_core::text::sanitize(&topic, 100),
                inputs.join(", ")
            );
        }
        if offsets.insert((topic.clone(), partition), offset).is_some() {
            bail!("--from {text:?} names `{topic}` partition {partition} twice");
        }
    }
    Ok(Some(StartAt::Offsets(offsets)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_start_is_earliest_a_time_or_offsets() {
        let one = inputs(&["usage"]);
        assert_eq!(parse("earliest", &one).unwrap(), None);
        assert_eq!(
            parse("2026-11-01T04:00:00Z", &one).unwrap(),
            Some(StartAt::Time("2026-11-01T04:00:00Z".parse().unwrap()))
        );
        let Some(StartAt::Offsets(offsets)) = parse("0:12, 3:0", &one).unwrap() else {
            panic!("offsets expected")
        };
        let usage = |partition| ("usage".to_string(), partition);
        assert_eq!(offsets.into_iter().collect::<Vec<_>>(), vec![(usage(0), 12), (usage(3), 0)]);
        let two = inputs(&["usage", "usage.eu"]);
        let Some(StartAt::Offsets(offsets)) =
            parse("usage:0:12, usage:3:0,usage.eu:1:7", &two).unwrap()
        else {
            panic!("offsets expected")
        };
        let usage = |partition| ("usage".to_string(), partition);
        assert_eq!(
            offsets.into_iter().collect::<Vec<_>>(),
            vec![(usage(0), 12), (usage(3), 0), (("usage.eu".to_string(), 1), 7)]
        );
    }

    #[test]
    fn a_start_that_is_none_of_them_says_what_it_may_be() {
        let one = inputs(&["usage"]);
        for bad in
            ["", "yesterday", "0:", "0:-1", "-1:5", "a:b:c:d", "0:1.5", "2026-13-01T00:00:00Z"]
        {
            let err = parse(bad, &one).unwrap_err().to_string();
            assert!(err.contains("neither `earliest`"), "{bad}: {err}");
        }
        let err = parse("0:1,0:2", &one).unwrap_err().to_string();
        assert!(err.contains("names `usage` partition 0 twice"), "{err}");
        let err = parse("0:1", &inputs(&["usage", "usage.eu"])).unwrap_err().to_string();
        assert!(err.contains("reads 2 inputs; name each offset's topic"), "{err}");
        let err = parse("usage.eu:1:7", &one).unwrap_err().to_string();
        assert!(err.contains("names topic `usage.eu`, which the job does not read"), "{err}");
    }
}
