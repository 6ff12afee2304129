//! The job's producer: a client with a thread of its own serving delivery
//! reports (which track the changelog's restore checkpoints and the first
//! failed delivery). Its transactions are the transaction owner's
//! ([`crate::transaction`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::FromClientConfigAndContext;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};
use tally_core::sync::lock;

/// Delivery reports: the first failure, and how far each changelog
/// partition was written (its restore checkpoint).
pub struct DeliveryTracker {
    changelog: String,
    deliveries: Mutex<Deliveries>,
}

#[derive(Default)]
struct Deliveries {
    first_error: Option<String>,
    changelog_next: HashMap<i32, i64>,
}

impl DeliveryTracker {
    /// A tracker noting delivered offsets of topic `changelog`.
    pub fn new(changelog: String) -> DeliveryTracker {
        DeliveryTracker { changelog, deliveries: Mutex::default() }
    }

    pub(super) fn take_error(&self) -> Option<String> {
        lock(&self.deliveries).first_error.take()
    }

    pub(super) fn changelog_next(&self, partition: i32) -> Option<i64> {
        lock(&self.deliveries).changelog_next.get(&partition).copied()
    }
}

impl ClientContext for DeliveryTracker {
    fn error(&self, error: KafkaError, reason: &str) {
        super::log_client_error(error, reason);
    }
}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut deliveries = lock(&self.deliveries);
        match result {
            Ok(record) if record.topic() == self.changelog => {
                let next = deliveries.changelog_next.entry(record.partition()).or_insert(0);
                *next = (*next).max(record.offset() + 1);
            }
            Ok(_) => {}
            Err((err, record)) => {
                deliveries.first_error.get_or_insert_with(|| {
                    format!("sending to `{}` failed: {err}", record.topic())
                });
            }
        }
    }
}

/// How long each poll of a [`JobProducer`]'s delivery thread lasts, and so
/// the longest that dropping the producer waits for the thread to end.
/// rust-rdkafka's `poll` waits in whole milliseconds (it truncates what is
/// left of its window) and spends the fraction of a millisecond left at
/// the end in polls that do not wait: a window 50 µs past whole
/// milliseconds ends in one wait, where 10 ms exactly spun for up to 1 ms
/// of every 10 (an idle job's producer burnt about 7 % of a core, taken
/// from its own restore and from every other job).
const DELIVERY_POLL: Duration = Duration::from_micros(10_050);

/// The job's producer, with a thread of its own serving delivery reports.
/// rdkafka's `ThreadedProducer` does the same, but polls in steps of
/// 100 ms, and dropping it waits for the step to end: 50 ms on average at
/// every session end, restarts and rebalances included.
pub struct JobProducer {
    producer: Arc<BaseProducer<DeliveryTracker>>,
    stop: Arc<AtomicBool>,
    deliveries: Option<std::thread::JoinHandle<()>>,
}

impl FromClientConfigAndContext<DeliveryTracker> for JobProducer {
    fn from_config_and_context(
        config: &ClientConfig,
        tracker: DeliveryTracker,
    ) -> KafkaResult<JobProducer> {
        let producer: Arc<BaseProducer<DeliveryTracker>> =
            Arc::new(config.create_with_context(tracker)?);
        let stop = Arc::new(AtomicBool::new(false));
        let deliveries = {
            let (producer, stop) = (producer.clone(), stop.clone());
            std::thread::Builder::new()
                .name("tally-deliveries".to_string())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        producer.poll(DELIVERY_POLL);
                    }
                })
                .map_err(|err| {
                    KafkaError::ClientCreation(format!(
                        "cannot start the delivery report thread: {err}"
                    ))
                })?
        };
        Ok(JobProducer { producer, stop, deliveries: Some(deliveries) })
    }
}

impl std::ops::Deref for JobProducer {
    type Target = BaseProducer<DeliveryTracker>;

    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}

impl Drop for JobProducer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(deliveries) = self.deliveries.take() {
            let _ = deliveries.join();
        }
    }
}
