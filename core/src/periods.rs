//! A period job's book (one that declares `[periods]`): each input
//! partition's periods, watermark and seen event ids under the rules of
//! `tally-periods`, as the open transaction leaves them. The transaction
//! holds the book, so that it outlives a plugin swap; what changes in it
//! is written into the transaction as host-owned state entries (under the
//! partition's 4 bytes, big-endian), and after a dropped transaction it is
//! read again from the store. The period plugin's processor
//! (`plugin::period_processor`) applies the rules to it. See
//! `docs/periods.md`.
//!
//! In Kafka mode an instance holds only the partitions it owns (assigned
//! and restored), and learns the others' watermarks from the broker.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use jiff::Timestamp;
use tally_periods::{PartitionPeriods, PeriodCounts, PeriodSettings};

use crate::state::{StateError, StateStore};

/// A period job's partitions, as the open transaction leaves them.
pub struct PeriodBook {
    settings: Arc<PeriodSettings>,
    /// Index of the output FINAL and ADJUSTMENT records go to.
    output: usize,
    partitions: BTreeMap<u32, PartitionPeriods>,
    /// The offset of the last event offered per partition: the source its
    /// ADJUSTMENTs and idle FINALs name in their lineage.
    last_offset: BTreeMap<u32, u64>,
    /// Whether `partitions` may hold dropped work: read them again from
    /// the store before the next use.
    stale: bool,
    /// The partitions this instance owns (`None`: every one in the store).
    owned: Option<BTreeSet<u32>>,
    /// Owned partitions not read from the store yet.
    to_load: BTreeSet<u32>,
    /// The own watermarks of partitions other instances own, as last
    /// shared through the broker.
    others: BTreeMap<u32, Timestamp>,
}

/// One partition's periods, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStatus {
    /// The partition's index within the job.
    pub partition: u32,
    /// Its own watermark: the highest event time it accepted.
    pub watermark: Option<Timestamp>,
    /// The watermark its periods close by (its own, or the one idleness
    /// closed it through).
    pub effective_watermark: Option<Timestamp>,
    /// Periods not yet final.
    pub open_periods: usize,
    /// Event ids remembered for de-duplication.
    pub seen_ids: usize,
    /// What it did since the job opened.
    pub counts: PeriodCounts,
}

impl PeriodBook {
    /// The periods of a job under `settings`, emitting to output index
    /// `output`; read from the store at first use.
    pub fn new(settings: Arc<PeriodSettings>, output: usize) -> PeriodBook {
        PeriodBook {
            settings,
            output,
            partitions: BTreeMap::new(),
            last_offset: BTreeMap::new(),
            stale: true,
            owned: None,
            to_load: BTreeSet::new(),
            others: BTreeMap::new(),
        }
    }

    /// Holds only `partitions` from now on (Kafka mode: those assigned
    /// and restored). Partitions given up are forgotten; new ones are read
    /// from the store at their first use, and only they, so a commit still
    /// on its way to the store cannot be missed by the others.
    pub fn own(&mut self, partitions: BTreeSet<u32>) {
        if self.owned.as_ref() == Some(&partitions) {
            return;
        }
        self.partitions.retain(|partition, _| partitions.contains(partition));
        self.last_offset.retain(|partition, _| partitions.contains(partition));
        let held = self.owned.take().unwrap_or_default();
        self.to_load.retain(|partition| partitions.contains(partition));
        self.to_load.extend(partitions.difference(&held));
        self.others.retain(|partition, _| !partitions.contains(partition));
        self.owned = Some(partitions);
    }

    /// The own watermarks of partitions other instances own (those this
    /// one owns are ignored).
    pub fn set_others(&mut self, watermarks: impl IntoIterator<Item = (u32, Timestamp)>) {
        let owned = self.owned.as_ref();
        self.others = watermarks
            .into_iter()
            .filter(|(partition, _)| owned.is_none_or(|owned| !owned.contains(partition)))
            .collect();
    }

    /// Each partition's own watermark, of those held that have one.
    pub fn watermarks(&self) -> impl Iterator<Item = (u32, Timestamp)> + '_ {
        self.partitions
            .iter()
            .filter_map(|(&partition, periods)| Some((partition, periods.watermark()?)))
    }

    /// The job's period settings.
    pub fn settings(&self) -> &PeriodSettings {
        &self.settings
    }

    /// Marks what is in memory as possibly holding dropped work.
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Each partition's watermarks and sizes.
    pub fn status(&self) -> Vec<PartitionStatus> {
        self.partitions
            .iter()
            .map(|(&partition, periods)| PartitionStatus {
                partition,
                watermark: periods.watermark(),
                effective_watermark: periods.effective_watermark(),
                open_periods: periods.open_periods(),
                seen_ids: periods.seen_ids(),
                counts: periods.counts(),
            })
            .collect()
    }

    /// Index of the output FINAL and ADJUSTMENT records go to.
    pub fn output(&self) -> usize {
        self.output
    }

    /// Reads the partitions again from `store` if they may hold dropped
    /// work (the store holds what was committed; the transaction holds
    /// nothing more after a drop).
    /// Owned partitions not read yet are read too.
    pub fn load_if_stale(&mut self, store: &dyn StateStore) -> Result<(), StateError> {
        if self.stale {
            self.partitions.clear();
            let stored = match &self.owned {
                None => store.scan_state()?,
                Some(owned) => {
                    let mut stored = Vec::new();
                    for partition in owned {
                        stored.extend(store.scan_state_prefix(&partition.to_be_bytes())?);
                    }
                    stored
                }
            };
            self.restore(stored)?;
            self.to_load.clear();
            self.stale = false;
        }
        while let Some(partition) = self.to_load.pop_first() {
            self.partitions.remove(&partition);
            if let Err(err) = store
                .scan_state_prefix(&partition.to_be_bytes())
                .and_then(|stored| self.restore(stored))
            {
                self.to_load.insert(partition);
                return Err(err);
            }
        }
        Ok(())
    }

    /// Restores the partitions whose entries (keys with the partition's 4
    /// bytes first) are `stored`.
    fn restore(&mut self, stored: Vec<crate::state::Entry>) -> Result<(), StateError> {
        let mut entries: BTreeMap<u32, Vec<crate::state::Entry>> = BTreeMap::new();
        for (key, value) in stored {
            let Some((partition, entry)) = key.split_first_chunk::<4>() else {
                return Err(StateError::Damaged {
                    what: format!("a period entry's key of {} bytes has no partition", key.len()),
                });
            };
            let partition = u32::from_be_bytes(*partition);
            entries.entry(partition).or_default().push((entry.to_vec(), value));
        }
        for (partition, entries) in entries {
            let periods =
                PartitionPeriods::restore(self.settings.clone(), entries).map_err(|damaged| {
                    StateError::Damaged {
                        what: format!("partition {partition}'s periods: {damaged}"),
                    }
                })?;
            self.partitions.insert(partition, periods);
        }
        Ok(())
    }

    /// Partition `partition`'s periods (empty ones if it has none yet);
    /// `offset` is the event offered to them.
    pub fn partition(&mut self, partition: u32, offset: u64) -> &mut PartitionPeriods {
        self.last_offset.insert(partition, offset);
        let settings = &self.settings;
        self.partitions.entry(partition).or_insert_with(|| PartitionPeriods::new(settings.clone()))
    }

    /// The partitions that have periods, in order.
    pub fn partitions(&self) -> Vec<u32> {
        self.partitions.keys().copied().collect()
    }

    /// Partition `partition`'s periods and the lowest own watermark among
    /// the job's other partitions that have one, here or in other
    /// instances (what an idle partition adopts); `None` if it has no
    /// periods.
    pub fn idle_partition(
        &mut self,
        partition: u32,
    ) -> Option<(&mut PartitionPeriods, Option<Timestamp>)> {
        let held = self
            .partitions
            .iter()
            .filter(|(other, _)| **other != partition)
            .filter_map(|(_, periods)| periods.watermark());
        let elsewhere = self
            .others
            .iter()
            .filter(|(other, _)| **other != partition && !self.partitions.contains_key(other))
            .map(|(_, watermark)| *watermark);
        let adopted = held.chain(elsewhere).min();
        self.partitions.get_mut(&partition).map(|periods| (periods, adopted))
    }

    /// The offset of the last event offered to `partition` (0 if none this
    /// run): what its records not caused by one event name as their source.
    pub fn last_offset(&self, partition: u32) -> u64 {
        self.last_offset.get(&partition).copied().unwrap_or(0)
    }

    /// What changed in every partition since the last call, as state
    /// entries to write in the transaction (`None`: delete).
    pub fn take_changes(&mut self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let mut entries = Vec::new();
        for (partition, periods) in &mut self.partitions {
            if !periods.is_dirty() {
                continue;
            }
            let prefix = partition.to_be_bytes();
            entries.extend(periods.take_changes().into_iter().map(|(key, value)| {
                let mut full = Vec::with_capacity(prefix.len() + key.len());
                full.extend_from_slice(&prefix);
                full.extend_from_slice(&key);
                (full, value)
            }));
        }
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{MemoryStore, StoreCommit};
    use tally_periods::{Addition, Aggregation, EventFacts, Folded, PeriodsTable};

    /// Counts events: the state is the count, one byte.
    struct Count;

    impl Aggregation for Count {
        type Error = String;
        fn add(
            &mut self,
            states: &[Option<&[u8]>],
            additions: &[Addition],
            _tentative: bool,
        ) -> Result<Folded, String> {
            let mut counts: Vec<u8> =
                states.iter().map(|state| state.map_or(0, |state| state[0])).collect();
            for addition in additions {
                counts[addition.period] += 1;
            }
            Ok(Folded::States(counts.into_iter().map(|count| vec![count]).collect()))
        }
        fn value(&mut self, state: &[u8]) -> Result<u64, String> {
            Ok(u64::from(state[0]))
        }
    }

    fn book() -> PeriodBook {
        PeriodBook::new(Arc::new(PeriodSettings::try_from(PeriodsTable::default()).unwrap()), 0)
    }

    fn offer(book: &mut PeriodBook, partition: u32, id: &str, time: &str) {
        let event = EventFacts {
            id: id.into(),
            time: time.parse().unwrap(),
            key: vec![("customer".into(), "acme".into())],
            customer: "acme".into(),
        };
        let arrival = event.time;
        let mut out = Vec::new();
        book.partition(partition, 0).offer(&event, b"", arrival, &mut Count, &mut out).unwrap();
    }

    #[test]
    fn an_instance_holds_the_partitions_it_owns_and_adopts_the_others_shared_watermarks() {
        let store = MemoryStore::default();
        let mut all = book();
        all.load_if_stale(&store).unwrap();
        offer(&mut all, 0, "a", "2026-09-03T00:00:00Z");
        offer(&mut all, 1, "b", "2026-10-15T00:00:00Z");
        offer(&mut all, 2, "c", "2026-10-01T00:00:00Z");
        store.commit(StoreCommit { state: all.take_changes(), meta: Vec::new() }).unwrap();

        let mut mine = book();
        mine.own(BTreeSet::from([0]));
        mine.load_if_stale(&store).unwrap();
        assert_eq!(mine.partitions(), vec![0]);
        // Another instance owns 1 and 2; what it says of 0 is not taken.
        mine.set_others([
            (0, "2030-01-01T00:00:00Z".parse().unwrap()),
            (1, "2026-10-15T00:00:00Z".parse().unwrap()),
            (2, "2026-10-01T00:00:00Z".parse().unwrap()),
        ]);
        let adopted = mine.idle_partition(0).unwrap().1;
        assert_eq!(adopted, Some("2026-10-01T00:00:00Z".parse().unwrap()));

        // Partition 2 moves here: read from the store, its own watermark
        // counts, and what was shared of it no longer does.
        mine.own(BTreeSet::from([0, 2]));
        mine.load_if_stale(&store).unwrap();
        assert_eq!(mine.partitions(), vec![0, 2]);
        let watermarks: Vec<(u32, Timestamp)> = mine.watermarks().collect();
        assert_eq!(watermarks.len(), 2);
        mine.set_others([(1, "2026-10-20T00:00:00Z".parse().unwrap())]);
        assert_eq!(
            mine.idle_partition(0).unwrap().1,
            Some("2026-10-01T00:00:00Z".parse().unwrap())
        );

        // Given up: forgotten, and not read again.
        mine.own(BTreeSet::from([2]));
        mine.load_if_stale(&store).unwrap();
        assert_eq!(mine.partitions(), vec![2]);
        assert!(mine.idle_partition(0).is_none());
    }
}
