//! Kafka mode's committer meets the core's committer conformance suite
//! (`tally_core::commit::conformance`) against the real broker and a real
//! RocksDB store: what a `read_committed` reader, the consumer group's
//! committed offsets and the store show after commits, aborts and crashes
//! between the two phases.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use tally_core::commit::TwoPhaseCommitter;
use tally_core::commit::conformance::{self, Backend, KEY, OUTPUT, Visible};
use tally_core::limits::Limits;
use tally_core::state::StateStore;
use tally_core::transaction::Transaction;
use tally_kafka::Guarantee;
use tally_kafka::committer::{
    Addresses, DeliveryTracker, JobProducer, KafkaCommitError, KafkaCommitter, KafkaTransactions,
    Prepared, RecordCollector, TransactionOwner,
};
use tally_kafka::keys;
use tally_state_rocks::RocksStore;
use tally_tests::kafka::*;

/// How long a transactional call may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// One process's committer: its transactional producer's side and the
/// consumer whose group the input offsets are committed for.
struct ProcessCommitter {
    committer: KafkaCommitter,
    consumer: BaseConsumer,
}

impl ProcessCommitter {
    fn transactions(&self) -> KafkaTransactions<'_, rdkafka::consumer::DefaultConsumerContext> {
        KafkaTransactions { committer: &self.committer, consumer: &self.consumer }
    }
}

impl TwoPhaseCommitter for ProcessCommitter {
    type Positions = BTreeMap<u32, i64>;
    type Prepared = Option<Prepared>;
    type Error = KafkaCommitError;

    fn prepare(
        &mut self,
        txn: &mut Transaction,
        positions: &BTreeMap<u32, i64>,
    ) -> Result<Option<Prepared>, KafkaCommitError> {
        self.transactions().prepare(txn, positions)
    }

    fn commit(&self, prepared: Option<Prepared>) -> Result<(), KafkaCommitError> {
        self.transactions().commit(prepared)
    }

    fn abort(&mut self) -> Result<(), KafkaCommitError> {
        self.transactions().abort()
    }
}

/// A job's topics, group and state store; each [`Backend::open`] is a new
/// process with the same transactional id.
struct KafkaBackend {
    job: String,
    input: String,
    totals: String,
    dead_letters: String,
    changelog: String,
    store: Arc<dyn StateStore>,
    _dir: tempfile::TempDir,
}

impl KafkaBackend {
    fn new() -> KafkaBackend {
        let job = unique("committer");
        let [input, totals, dead_letters, changelog] =
            ["input", "totals", "dead-letters", "changelog"].map(|topic| format!("{job}-{topic}"));
        for topic in [&input, &totals, &dead_letters, &changelog] {
            create_topic(topic, 1);
        }
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RocksStore::open(&dir.path().join("db")).unwrap());
        KafkaBackend { job, input, totals, dead_letters, changelog, store, _dir: dir }
    }

    fn group(&self) -> String {
        format!("tally-{}", self.job)
    }
}

impl Drop for KafkaBackend {
    fn drop(&mut self) {
        delete_topics(&[&self.input, &self.totals, &self.dead_letters, &self.changelog]);
    }
}

impl Backend for KafkaBackend {
    type Committer = ProcessCommitter;

    fn open(&mut self) -> ProcessCommitter {
        let producer: JobProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("enable.idempotence", "true")
            .set("transactional.id", format!("tally-{}-0", self.job))
            .set("transaction.timeout.ms", "10000")
            .create_with_context(DeliveryTracker::new(self.changelog.clone()))
            .unwrap();
        let owner =
            Arc::new(TransactionOwner::new(Arc::new(producer), Guarantee::ExactlyOnce, TIMEOUT));
        owner.fence_earlier_producers().unwrap();
        let addresses = Addresses {
            job: self.job.clone(),
            inputs: vec![self.input.clone()],
            outputs: vec![self.totals.clone()],
            dead_letter: self.dead_letters.clone(),
            changelog: self.changelog.clone(),
            watermarks: None,
        };
        let collector = RecordCollector::new(owner.clone(), addresses);
        let committer = KafkaCommitter::new(owner, collector, self.store.clone());
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", self.group())
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .unwrap();
        ProcessCommitter { committer, consumer }
    }

    fn transaction(&mut self) -> Transaction {
        let mut txn = Transaction::new(
            self.store.clone(),
            vec![OUTPUT.to_string()].into(),
            Limits::default(),
        );
        // A Kafka job keeps each input partition's state apart.
        txn.set_namespace(&keys::namespace(0));
        txn
    }

    fn positions<R>(&self, included: u64, with: impl FnOnce(&BTreeMap<u32, i64>) -> R) -> R {
        with(&BTreeMap::from([(keys::source_id(0, 0), included as i64)]))
    }

    fn visible(&mut self) -> Visible {
        let outputs = read_topic(&self.totals, true)
            .into_iter()
            .map(|record| String::from_utf8(record.value).unwrap())
            .collect();
        let state = self.store.get_many(&[&keys::namespaced(0, KEY)]).unwrap().remove(0);
        let state = state.map(|value| String::from_utf8(value).unwrap());
        let included = committed_progress(&group_reader(&self.group()), &self.input, 1);
        Visible { outputs, state, included: included as u64 }
    }
}

#[test]
fn the_kafka_committer_meets_the_committer_conformance_suite() {
    let _serial = serial();
    conformance::run(KafkaBackend::new);
}
