package tally.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import java.util.function.Supplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerInterceptor;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * A Kafka Streams peer of Tally's billing job, for the restore benchmark.
 *
 * <p>Each input value is a JSON event {@code {"customer", "metric", "quantity", "ts"}}; the job
 * keeps the running total of quantity per {@code customer|metric|YYYY-MM} in a RocksDB store
 * backed by a changelog topic and forwards (key, new total) to the output topic.
 *
 * <pre>
 * process --bootstrap B --input T --output T --app-id ID --state-dir D --expect N [--timeout-s S] [--lineage true]
 *     runs until N input records are processed and committed; prints {"processed", "ms"}. With
 *     --lineage, each output record carries its input's partition and offset in the headers
 *     tally.source.partition and tally.source.offset, as Tally's outputs do (the latency benchmark
 *     matches outputs to inputs by them)
 * restore --bootstrap B --input T --output T --app-id ID --state-dir D [--timeout-s S]
 *     starts on an empty state dir, waits until the store is restored from its changelog
 *     and the app runs; prints {"restore_ms", "records", "partitions", "cpu_s", "changelog_bytes"}
 * </pre>
 *
 * Only that JSON line goes to stdout; errors go to stderr with a non-zero exit status.
 */
public final class RestorePeer {
    static final String STORE = "totals";
    static final ObjectMapper JSON = new ObjectMapper();
    /** Input records processed so far (one stream thread, so never counted twice). */
    static final AtomicLong PROCESSED = new AtomicLong();

    public static void main(String[] args) {
        int status;
        try {
            status = run(args);
        } catch (IllegalArgumentException e) {
            System.err.println("restore-peer: error: " + e.getMessage());
            System.err.println("usage: restore-peer process|restore --bootstrap B --input T --output T"
                    + " --app-id ID --state-dir D [--expect N] [--timeout-s S] [--lineage true]");
            status = 2;
        } catch (Exception e) {
            System.err.println("restore-peer: error: " + e.getMessage());
            status = 1;
        }
        System.out.flush();
        System.exit(status);
    }

    static int run(String[] args) throws Exception {
        if (args.length == 0) throw new IllegalArgumentException("missing command");
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length)
                throw new IllegalArgumentException("expected --name value, got '" + args[i] + "'");
            opts.put(args[i].substring(2), args[i + 1]);
        }
        long timeoutS = Long.parseLong(opts.getOrDefault("timeout-s", "600"));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS);
        Job job = new Job(required(opts, "bootstrap"), required(opts, "input"), required(opts, "output"),
                required(opts, "app-id"), required(opts, "state-dir"), deadline, timeoutS,
                Boolean.parseBoolean(opts.getOrDefault("lineage", "false")));
        switch (args[0]) {
            case "process":
                return job.process(Long.parseLong(required(opts, "expect")));
            case "restore":
                return job.restore();
            default:
                throw new IllegalArgumentException("unknown command '" + args[0] + "'");
        }
    }

    static String required(Map<String, String> opts, String name) {
        String v = opts.get(name);
        if (v == null) throw new IllegalArgumentException("missing --" + name);
        return v;
    }

    /** One run of the billing job against Kafka. */
    record Job(String bootstrap, String input, String output, String appId, String stateDir,
               long deadline, long timeoutS, boolean lineage) {

        Topology topology() {
            Topology t = new Topology();
            t.addSource("events", Serdes.String().deserializer(), Serdes.String().deserializer(), input);
            t.addProcessor("billing", () -> new Billing(lineage), "events");
            t.addStateStore(Stores.keyValueStoreBuilder(
                            Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long())
                    .withLoggingEnabled(Map.of())
                    .withCachingDisabled(), "billing");
            t.addSink("totals", output, Serdes.String().serializer(), Serdes.Long().serializer(), "billing");
            return t;
        }

        Properties config() {
            Properties p = new Properties();
            p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
            p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
            p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
            p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
            p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
            p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
            p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
            return p;
        }

        /** Processes {@code expect} records, then closes (which commits under EOS) and checks the commit. */
        int process(long expect) throws Exception {
            KafkaStreams streams = new KafkaStreams(topology(), config());
            AtomicReference<Throwable> failure = watch(streams);
            long start = System.nanoTime();
            streams.start();
            try {
                await(streams, failure, () -> PROCESSED.get() >= expect,
                        () -> "processing " + expect + " records (" + PROCESSED.get() + " so far)");
            } finally {
                close(streams);
            }
            double ms = (System.nanoTime() - start) / 1e6;
            long committed = committedInputOffsets();
            if (committed < expect)
                throw new IllegalStateException("the committed input offsets add up to " + committed
                        + ", fewer than the " + expect + " records expected");
            System.out.printf(Locale.ROOT, "{\"processed\": %d, \"ms\": %.1f}%n", PROCESSED.get(), ms);
            return 0;
        }

        /** Restores the store from its changelog into an empty state dir and reports how that went. */
        int restore() throws Exception {
            Properties config = config();
            config.put(StreamsConfig.restoreConsumerPrefix(ConsumerConfig.INTERCEPTOR_CLASSES_CONFIG),
                    ChangelogBytes.class.getName());
            KafkaStreams streams = new KafkaStreams(topology(), config);
            RestoreStats stats = new RestoreStats();
            streams.setGlobalStateRestoreListener(stats);
            AtomicReference<Throwable> failure = watch(streams);
            streams.start();
            String report;
            try {
                await(streams, failure, () -> streams.state() == KafkaStreams.State.RUNNING && stats.settled(),
                        () -> "the restore (" + stats + ")");
                report = stats.json();
                System.err.println("restore-peer: " + stats);
            } finally {
                close(streams);
            }
            System.out.println(report);
            return 0;
        }

        /** Makes a failed stream thread shut the client down and records why. */
        AtomicReference<Throwable> watch(KafkaStreams streams) {
            AtomicReference<Throwable> failure = new AtomicReference<>();
            streams.setUncaughtExceptionHandler(e -> {
                failure.compareAndSet(null, e);
                return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
            });
            streams.setStateListener((now, before) -> {
                if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.PENDING_ERROR)
                    failure.compareAndSet(null, new IllegalStateException("Kafka Streams went to " + now));
            });
            return failure;
        }

        /** Waits for {@code done}, failing on a stream error, an unexpected shutdown or the deadline. */
        void await(KafkaStreams streams, AtomicReference<Throwable> failure, BooleanSupplier done,
                   Supplier<String> what) throws InterruptedException {
            while (!done.getAsBoolean()) {
                Throwable e = failure.get();
                if (e != null) throw new IllegalStateException("Kafka Streams failed: " + describe(e), e);
                if (!streams.state().isRunningOrRebalancing())
                    throw new IllegalStateException("Kafka Streams stopped (" + streams.state() + ")");
                if (System.nanoTime() > deadline)
                    throw new IllegalStateException("timed out after " + timeoutS + " s waiting for " + what.get());
                Thread.sleep(10);
            }
        }

        void close(KafkaStreams streams) {
            long left = Math.max(TimeUnit.NANOSECONDS.toSeconds(deadline - System.nanoTime()), 10);
            // Leave the group, so that the next run need not wait out this member's session timeout.
            CloseOptions options = CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
                    .withTimeout(Duration.ofSeconds(Math.min(left, 120)));
            if (!streams.close(options))
                throw new IllegalStateException("Kafka Streams did not close in time");
        }

        /** The sum of the group's committed offsets on the input topic's partitions. */
        long committedInputOffsets() throws Exception {
            try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
                Map<TopicPartition, OffsetAndMetadata> offsets = admin.listConsumerGroupOffsets(appId)
                        .partitionsToOffsetAndMetadata().get(60, TimeUnit.SECONDS);
                return offsets.entrySet().stream()
                        .filter(e -> e.getKey().topic().equals(input) && e.getValue() != null)
                        .mapToLong(e -> e.getValue().offset()).sum();
            }
        }
    }

    static String describe(Throwable e) {
        StringBuilder s = new StringBuilder(e.toString());
        for (Throwable c = e.getCause(); c != null && c != c.getCause(); c = c.getCause()) s.append("; caused by ").append(c);
        return s.toString();
    }

    /** The billing job: one running total per customer, metric and month. */
    static final class Billing implements Processor<String, String, String, Long> {
        private final boolean lineage;
        private ProcessorContext<String, Long> context;
        private KeyValueStore<String, Long> totals;

        Billing(boolean lineage) {
            this.lineage = lineage;
        }

        @Override
        public void init(ProcessorContext<String, Long> context) {
            this.context = context;
            this.totals = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<String, String> record) {
            JsonNode event;
            try {
                event = JSON.readTree(record.value());
            } catch (Exception e) {
                throw new IllegalArgumentException("input value is not JSON: " + record.value(), e);
            }
            JsonNode customer = event.get("customer"), metric = event.get("metric"),
                    quantity = event.get("quantity"), ts = event.get("ts");
            if (customer == null || !customer.isTextual() || metric == null || !metric.isTextual()
                    || quantity == null || !quantity.canConvertToExactIntegral() || quantity.asLong() < 0
                    || ts == null || !ts.isTextual() || ts.asText().length() < 7)
                throw new IllegalArgumentException("malformed billing event: " + record.value());
            // The benchmark's timestamps are UTC ("...Z"), so the month is the first 7 characters.
            String key = customer.asText() + "|" + metric.asText() + "|" + ts.asText().substring(0, 7);
            Long old = totals.get(key);
            long total = (old == null ? 0 : old) + quantity.asLong();
            totals.put(key, total);
            Record<String, Long> out = record.withKey(key).withValue(total);
            if (lineage) {
                RecordMetadata source = context.recordMetadata().orElseThrow();
                Headers headers = new RecordHeaders()
                        .add("tally.source.partition", Integer.toString(source.partition()).getBytes(StandardCharsets.UTF_8))
                        .add("tally.source.offset", Long.toString(source.offset()).getBytes(StandardCharsets.UTF_8));
                out = out.withHeaders(headers);
            }
            context.forward(out);
            PROCESSED.incrementAndGet();
        }
    }

    /** Times the restore: first start to last end, in wall-clock and process CPU time. */
    static final class RestoreStats implements StateRestoreListener {
        private final Set<TopicPartition> started = new HashSet<>(), ended = new HashSet<>();
        private long firstStart, lastEnd, cpuAtStart, cpuAtEnd, restored, batched;

        static long cpuNanos() {
            return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                    .getProcessCpuTime();
        }

        @Override
        public synchronized void onRestoreStart(TopicPartition tp, String store, long from, long to) {
            if (started.isEmpty()) {
                firstStart = System.nanoTime();
                cpuAtStart = cpuNanos();
            }
            started.add(tp);
        }

        @Override
        public synchronized void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {
            batched += n;
        }

        @Override
        public synchronized void onRestoreEnd(TopicPartition tp, String store, long total) {
            lastEnd = System.nanoTime();
            cpuAtEnd = cpuNanos();
            restored += total;
            ended.add(tp);
        }

        @Override
        public synchronized void onRestoreSuspended(TopicPartition tp, String store, long total) {
            System.err.println("restore-peer: restore of " + tp + " suspended after " + total + " records");
        }

        /** True once every partition whose restore started has finished. */
        synchronized boolean settled() {
            return ended.containsAll(started);
        }

        synchronized String json() {
            if (started.isEmpty())
                return "{\"restore_ms\": 0, \"records\": 0, \"partitions\": 0, \"cpu_s\": 0, \"changelog_bytes\": 0}";
            return String.format(Locale.ROOT,
                    "{\"restore_ms\": %.3f, \"records\": %d, \"partitions\": %d, \"cpu_s\": %.3f, \"changelog_bytes\": %d}",
                    (lastEnd - firstStart) / 1e6, restored, ended.size(), (cpuAtEnd - cpuAtStart) / 1e9,
                    ChangelogBytes.BYTES.get());
        }

        @Override
        public synchronized String toString() {
            return "partitions started " + started.size() + ", ended " + ended.size() + "; records restored "
                    + restored + " (batches: " + batched + "); changelog bytes " + ChangelogBytes.BYTES.get();
        }
    }

    /**
     * A restore-consumer interceptor adding up the key and value bytes of every changelog record
     * the restore reads. It only reads two ints per record, so it costs next to nothing.
     */
    public static final class ChangelogBytes implements ConsumerInterceptor<byte[], byte[]> {
        static final AtomicLong BYTES = new AtomicLong();

        @Override
        public ConsumerRecords<byte[], byte[]> onConsume(ConsumerRecords<byte[], byte[]> records) {
            long n = 0;
            for (ConsumerRecord<byte[], byte[]> r : records)
                n += Math.max(r.serializedKeySize(), 0) + Math.max(r.serializedValueSize(), 0);
            BYTES.addAndGet(n);
            return records;
        }

        @Override
        public void onCommit(Map<TopicPartition, OffsetAndMetadata> offsets) {}

        @Override
        public void close() {}

        @Override
        public void configure(Map<String, ?> configs) {}
    }
}
