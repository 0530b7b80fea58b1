"""The one configuration schema: every option, its default, its unit and why.

Sections map to TOML tables (`[cluster]`, `[zookeeper]`, `[bookie]`); every option can be overridden by
an environment variable ``BKSIM_<SECTION>_<OPTION>`` (upper case), e.g. ``BKSIM_BOOKIE_GROUP_WAIT_MS_MAX=5``.
Defaults live here and, for reading, in ``deploy/bksim.toml``; a test keeps the two equal. Loading files
and the environment is the CLI's job (``bksim.cli.config``); this module only describes and validates.

Every bound (queue length, entry size, cache size, in-flight window) is a named option here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bksim.model.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
# the largest gRPC message between a bookie and its clients: the default of bookie.frame_bytes_max, and the most a
# bookie client (adapters/bookie_client.py, and so the broker's transport) receives in one message
FRAME_BYTES_MAX = 5 * MiB + 64 * KiB
# unanswered AddEntries requests per bookie stream: the default of broker.add_window_max and of a bookie client's
# add stream (adapters/bookie_client.py)
ADD_WINDOW_MAX = 64


def option(default, doc: str):
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    run_dir: str = option(".run", "directory for the cluster's data, logs and pid files (relative to the cwd)")
    bookies: int = option(3, "number of bookies `bksim cluster up` starts")
    bookie_port_base: int = option(3181, "bookie i (1-based) listens on bookie_port_base + i - 1")
    zookeepers: int = option(1, "number of ZooKeeper servers `bksim cluster up` starts: 1 = standalone, 3 or 5 = an "
                                "ensemble (server i on zookeeper.port + i - 1, its peer ports quorum_port_base + i "
                                "- 1 and election_port_base + i - 1)")
    brokers: int = option(2, "number of brokers `bksim cluster up` starts")
    broker_port_base: int = option(6650, "broker i (1-based) listens on broker_port_base + i - 1")
    bookie_http_port_base: int = option(8000, "bookie i serves HTTP (/metrics, admin API) on bookie_http_port_base + "
                                              "i - 1 (BookKeeper's httpServerPort); 0 = no HTTP")
    broker_http_port_base: int = option(8080, "broker i serves HTTP (/metrics, admin REST, /dashboard) on "
                                              "broker_http_port_base + i - 1 (Pulsar's webServicePort); 0 = no HTTP")
    start_timeout_ms: int = option(60_000, "how long `cluster up` waits for each process to become ready")


@dataclass(frozen=True, slots=True)
class ZooKeeperConfig:
    host: str = option("127.0.0.1", "address ZooKeeper binds to and clients connect to (loopback only)")
    port: int = option(2181, "ZooKeeper client port (of server 1 in an ensemble)")
    connect: str = option("", "the connect string every bookie, broker and tool uses, HOST:PORT[,HOST:PORT...] "
                              "(BookKeeper's zkServers); empty = host with port (or secure_port) .. + "
                              "cluster.zookeepers - 1")
    quorum_port_base: int = option(2888, "ensemble only: server i talks to the leader on quorum_port_base + i - 1")
    election_port_base: int = option(3888, "ensemble only: server i's leader-election port is election_port_base "
                                           "+ i - 1")
    peers: str = option("", "a ZooKeeper server started from this configuration (containers): its ensemble as "
                            "HOST:QUORUM_PORT:ELECTION_PORT[,...] in server-id order (ZooKeeper's server.N lines); "
                            "empty = standalone. `cluster up` derives its ensemble from host and the port bases")
    server_id: int = option(0, "with peers: this server's id, 1-based (ZooKeeper's myid); 0 = the trailing number "
                               "of the host name plus one (a StatefulSet's zk-0 is 1)")
    tick_time_ms: int = option(2000, "ZooKeeper tickTime; sessions time out between 2 and 20 ticks")
    session_timeout_ms: int = option(10_000, "session timeout bookies ask for (ephemeral registration lifetime)")
    heap_mb: int = option(256, "JVM heap of the ZooKeeper server")
    data_dir: str = option("", "ZooKeeper data directory; empty = <run_dir>/zookeeper")
    operation_timeout_ms: int = option(10_000, "a metadata operation unanswered this long fails as a connection "
                                       "loss (outcome unknown)")
    read_tries_max: int = option(3, "tries in all for a metadata read after connection losses; writes are "
                                 "never retried blindly")
    digest_credentials_file: str = option("", "file holding USER:PASSWORD (one line): every ZooKeeper client of "
                                              "the cluster authenticates with it and every znode it creates gets a "
                                              "digest ACL for that user (ZooKeeper's digest scheme, BookKeeper's "
                                              "zkEnableSecurity); empty = open ACLs")
    secure_port: int = option(0, "ZooKeeper's TLS client port (secureClientPort, Netty; of server 1 in an ensemble, "
                                 "server i: secure_port + i - 1); with it set, the cluster's clients connect there "
                                 "using the security.tls_* files; 0 = plaintext port only")


@dataclass(frozen=True, slots=True)
class BookieConfig:
    # identity and addresses
    host: str = option("127.0.0.1", "address the bookie's gRPC server binds to")
    port: int = option(3181, "bookie gRPC port")
    http_port: int = option(0, "bookie HTTP port: /metrics (Prometheus) and the admin API (/heartbeat, /api/v1/...); "
                               "0 = none (`cluster up` gives each bookie one)")
    bookie_id: str = option("", "bookie id registered in ZooKeeper; empty = <host>:<port>")
    journal_dir: str = option("", "journal directory; empty = <run_dir>/bookie-<port>/journal")
    ledger_dir: str = option("", "entry logs + index directory; empty = <run_dir>/bookie-<port>/ledgers")
    journal_archive_dir: str = option("", "when set, journals below the checkpoint mark are moved here, not deleted")
    # journal
    group_wait_ms_max: float = option(2.0, "group commit: flush when the oldest unsynced record waited this long")
    group_bytes_max: int = option(512 * KiB, "group commit: flush when this many bytes are buffered")
    journal_flush_when_idle: bool = option(False, "group commit: also flush as soon as the queue is empty")
    journal_sync_on_loop: bool = option(True, "fdatasync journal groups on the event loop, not a worker thread: "
                                        "saves two thread hand-offs per group (this machine: 5.4k vs 3.2k "
                                        "syncs/s of 16 KiB); set false where one sync takes milliseconds")
    journal_remove_from_page_cache: bool = option(True, "drop synced journal pages from the OS page cache (only "
                                                  "replay reads a journal; BookKeeper's journalRemoveFromPageCache)")
    journal_file_bytes_max: int = option(256 * MiB, "roll the journal file after this many bytes")
    journal_backups_max: int = option(5, "journal files below the checkpoint mark kept (when not archiving)")
    journal_queue_records_max: int = option(100_000, "records waiting for the journal writer before adds get TOO_MANY_REQUESTS")
    journal_skip_corruption: bool = option(False, "LOUD: skip mid-journal corruption on replay instead of refusing to start")
    # ledger storage
    flush_interval_ms: int = option(10_000, "checkpoint period (also runs when a write cache half fills)")
    write_cache_bytes_max: int = option(64 * MiB, "write cache, both halves together; an entry > half is BAD_REQUEST")
    write_cache_entry_overhead_bytes: int = option(128, "bytes the write cache counts per entry on top of its length "
                                                   "(a cached entry's Python objects), so small entries are bounded "
                                                   "too; 0 counts entry bytes only, as BookKeeper")
    write_cache_throttle_ms_max: int = option(2_500, "an add waits this long for write-cache space, then "
                                              "TOO_MANY_REQUESTS; must be < broker.bookie_timeout_ms (default: half)")
    read_cache_bytes_max: int = option(16 * MiB, "read cache (entries read from entry logs)")
    entry_log_bytes_max: int = option(256 * MiB, "roll the entry log after this many bytes")
    entry_log_page_cache_bytes: int = option(64 * MiB, "as a checkpoint syncs the entry log, its synced bytes older "
                                             "than its newest this-many leave the OS page cache, and a rolled log's "
                                             "all (reads of them go to the device, through the read cache); -1 = "
                                             "all stay, as with BookKeeper's entry logger")
    index_write_buffer_bytes: int = option(16 * MiB, "RocksDB memtable size of the index stores (BookKeeper's "
                                           "dbStorage_rocksDB_writeBufferSizeMB, 64 MB there)")
    # limits on requests
    entry_bytes_max: int = option(5 * MiB, "largest entry (header + payload) accepted; larger gets BAD_REQUEST")
    frame_bytes_max: int = option(FRAME_BYTES_MAX, "largest gRPC message; checked by gRPC before buffering")
    add_inflight_per_stream_max: int = option(20_000, "unacknowledged adds per AddEntries stream; more get TOO_MANY_REQUESTS")
    add_inflight_total_max: int = option(100_000, "unacknowledged adds in the whole bookie; more get TOO_MANY_REQUESTS")
    read_batch_entries_max: int = option(1_024, "entry ids one ReadEntries call may ask for; more get BAD_REQUEST")
    list_entries_ids_max: int = option(16_384, "entry ids one ListEntries answer covers at most (the bookie's work "
                                               "per call); the client asks again from where it stopped")
    requests_inflight_max: int = option(4_096, "concurrent RPCs (an open AddEntries stream counts, ~25 KiB each) a "
                                               "bookie serves; more get RESOURCE_EXHAUSTED at once")
    # disk space and read-only mode
    disk_check_interval_ms: int = option(1_000, "how often the ledger and journal disks are checked")
    disk_usage_threshold: float = option(0.95, "used fraction at which the bookie goes read-only")
    disk_usage_lwm_threshold: float = option(0.90, "used fraction below which a read-only bookie is writable again")
    recovery_add_reserve_bytes: int = option(64 * MiB, "a read-only bookie still takes RECOVERY_ADDs while this much is free")
    # garbage collection and compaction (bookie/gc.py; defaults of Pulsar's bookkeeper.conf)
    gc_wait_time_ms: int = option(900_000, "garbage collection period: local ledgers absent from the metadata are "
                                           "deleted, entry logs left without live ledgers removed (gcWaitTime)")
    gc_verify_metadata: bool = option(True, "re-read each deletion candidate's metadata before deleting it "
                                            "(verifyMetadataOnGC)")
    minor_compaction_threshold: float = option(0.2, "entry logs below this live fraction are compacted by minor "
                                                    "compaction; 0 = off")
    minor_compaction_interval_ms: int = option(3_600_000, "minor compaction period (at a GC round)")
    major_compaction_threshold: float = option(0.5, "entry logs below this live fraction are compacted by major "
                                                    "compaction (and when the disk is full); 0 = off")
    major_compaction_interval_ms: int = option(86_400_000, "major compaction period (at a GC round)")
    compaction_rate_bytes_per_s: int = option(1 * MiB, "live bytes compaction copies per second at most, so adds "
                                                       "stay fast (BookKeeper's compactionRateByEntries 1,000/s: "
                                                       "about this at 1 KiB entries); 0 = unlimited")
    # lifecycle
    shutdown_grace_ms: int = option(10_000, "SIGTERM: how long in-flight requests get to drain")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The broker: a stateless gRPC server with the ledger client (PROTOCOL.md §4) inside."""
    host: str = option("127.0.0.1", "address the broker's gRPC server binds to")
    port: int = option(6650, "broker gRPC port")
    http_port: int = option(0, "broker HTTP port: /metrics (Prometheus), the admin REST API (/admin/v2/...) and "
                               "/dashboard; 0 = none (`cluster up` gives each broker one)")
    metrics_topics_max: int = option(1_000, "topics (and subscriptions) with series of their own on /metrics; the "
                                            "rest are summed into one series labelled topic=\"_other\" "
                                            "(docs/observability.md)")
    broker_id: str = option("", "broker id registered in ZooKeeper (/brokers/available); empty = <host>:<port>")
    bookie_timeout_ms: int = option(5_000, "a bookie call unanswered this long fails; for an add that means an "
                                           "ensemble change; must be > bookie.write_cache_throttle_ms_max")
    speculative_read_ms: int = option(2_000, "a read unanswered this long also asks the next replica")
    metadata_cas_attempts_max: int = option(10, "read-modify-CAS rounds of one metadata update before giving up")
    add_batch_entries_max: int = option(1024, "entries sent to one bookie in one AddEntries request")
    add_window_max: int = option(ADD_WINDOW_MAX, "unanswered AddEntries requests per bookie stream")
    add_requests_per_bookie_max: int = option(2, "AddEntries requests of one ledger unanswered at one bookie; the "
                                                 "ledger's next entries for it wait meanwhile and leave together, "
                                                 "in requests of up to add_batch_entries_max (a bookie that keeps "
                                                 "up sees no wait); 0 = no bound, each loop turn's entries at once")
    append_inflight_max: int = option(20_000, "unacknowledged appends per ledger; an Append stream waits for room")
    payload_bytes_max: int = option(5 * MiB - 64 * KiB, "largest entry payload a client may append "
                                                          "(keep it + 36 header bytes within the bookies' entry_bytes_max)")
    ledgers_open_max: int = option(10_000, "ledgers one broker writes at once; more get RESOURCE_EXHAUSTED")
    read_window_max: int = option(64, "entries a ReadEntries stream or a recovery reads ahead in parallel")
    read_entries_max: int = option(1_000_000, "entries one ReadEntries call may ask for")
    requests_inflight_max: int = option(1_000, "concurrent RPCs a broker serves; more get RESOURCE_EXHAUSTED")
    shutdown_grace_ms: int = option(10_000, "SIGTERM: how long in-flight requests get to drain")
    bookie_address_overrides: str = option("", "comma-separated BOOKIE_ID=HOST:PORT: dial HOST:PORT for that bookie "
                                               "instead of its registered address (the chaos runner routes links "
                                               "through fault-injecting proxies this way); empty = none")
    quarantine_errors: int = option(3, "failed calls to one bookie within quarantine_window_ms that quarantine it: "
                                       "not chosen for new ensembles or replacements (BookKeeper's "
                                       "bookieQuarantineTime); 0 = never quarantine")
    quarantine_window_ms: int = option(30_000, "the window in which quarantine_errors failed calls count")
    quarantine_ms: int = option(60_000, "how long a quarantined bookie is not chosen (it still serves reads)")


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """The topic layer in the broker (PROTOCOL.md §5): managed ledgers, cursors, dispatchers, producers."""
    # managed ledgers
    ensemble_size: int = option(2, "E of a topic's ledgers (and cursor ledgers); Pulsar's broker default is 2/2/2")
    write_quorum_size: int = option(2, "Qw of a topic's ledgers")
    ack_quorum_size: int = option(2, "Qa of a topic's ledgers")
    ledger_entries_max: int = option(50_000, "roll the topic's ledger after this many entries")
    ledger_bytes_max: int = option(256 * MiB, "roll the topic's ledger after this many payload bytes")
    ledger_age_ms_min: int = option(0, "never roll a ledger younger than this (entries/bytes limits wait for it)")
    ledger_age_ms_max: int = option(4 * 3600_000, "roll a non-empty ledger older than this")
    pending_adds_max: int = option(50_000, "entries a topic has sent to its ledger and not yet had acknowledged")
    trim_interval_ms: int = option(120_000, "how often retention trimming and TTL expiry run per topic")
    # producers
    message_bytes_max: int = option(5 * MiB - 128 * KiB, "largest entry (message or batch) a producer may send; "
                                   "capped by broker.payload_bytes_max")
    batch_messages_max: int = option(10_000, "messages in one Send (one entry)")
    producer_pending_max: int = option(1_000, "Sends of one producer in flight; more get TOO_MANY_REQUESTS")
    dedup_snapshot_entries: int = option(1_000, "dedup: persist the producers' highest sequence ids every this many "
                                         "entries (recovery replays the entries after the snapshot)")
    dedup_producers_max: int = option(10_000, "dedup: producer names remembered per topic")
    backlog_quota_check_interval_ms: int = option(1_000, "how often a topic applies consumer_backlog_eviction and a "
                                                  "held Send looks again whether the backlog is under its quota "
                                                  "(Pulsar's backlogQuotaCheckIntervalInSeconds)")
    backlog_quota_hold_ms_max: int = option(60_000, "producer_request_hold: a Send held longer than this fails with "
                                            "TIMEOUT (the client sends it again); above the client's default send "
                                            "timeout, which normally ends the wait first")
    # consumers and dispatch
    dispatch_read_entries_max: int = option(100, "entries a dispatcher reads from the ledger at once")
    consumer_unacked_max: int = option(50_000, "unacknowledged messages one consumer may hold (then it gets no more)")
    subscription_unacked_max: int = option(200_000, "unacknowledged messages one subscription may hold")
    consumers_per_subscription_max: int = option(1_000, "consumers of one subscription")
    subscriptions_per_topic_max: int = option(1_000, "subscriptions of one topic")
    key_shared_replica_points: int = option(100, "Key_Shared: points per consumer on the consistent-hash ring")
    key_shared_sticky_ranges_max: int = option(1_024, "Key_Shared sticky mode: hash ranges one consumer may declare")
    failover_switch_delay_ms: int = option(1_000, "Failover: wait this long after an active-consumer change before "
                                           "redispatching, so the old consumer's acks can land")
    delayed_delivery_enabled: bool = option(True, "Shared and Key_Shared subscriptions hold a message with a delivery "
                                            "time until then (Pulsar's delayedDeliveryEnabled); off = at once")
    delayed_messages_per_subscription_max: int = option(100_000, "delayed messages one subscription holds; at "
                                                        "the limit its dispatcher reads no further until some "
                                                        "come due")
    # cursors
    cursor_persist_interval_ms: int = option(1_000, "a cursor persists its ack state at most this often (a kill -9 "
                                             "can redeliver what was acked since its last persist)")
    cursor_ledger_entries_max: int = option(50_000, "roll a cursor ledger after this many snapshot entries")
    cursor_snapshot_chunk_bytes: int = option(1 * MiB, "a snapshot larger than this is split into chunk entries "
                                              "followed by a marker entry")
    ranges_in_metadata_max: int = option(1_000, "ack ranges a cursor may keep in its znode (fallback and clean close)")
    redelivery_counts_max: int = option(1_000_000, "redelivery counts a cursor keeps (and persists)")


@dataclass(frozen=True, slots=True)
class AutoRecoveryConfig:
    """The auditor and the replication workers (PROTOCOL.md §6): they restore lost replicas."""
    enabled: bool = option(True, "run the auditor election and a replication worker inside every bookie process "
                                 "(BookKeeper's autoRecoveryDaemonEnabled); `bksim autorecovery run` runs them alone")
    lost_bookie_recovery_delay_ms: int = option(0, "a bookie missing from the registrations this long is lost and "
                                                   "its ledgers are marked (0 = at once); a restart within it is "
                                                   "not a loss")
    bookie_check_interval_ms: int = option(1_000, "how often the auditor compares known bookies (cookies) with the "
                                                  "registered ones")
    periodic_bookie_check_interval_ms: int = option(86_400_000, "how often the auditor marks every ledger that "
                                                                "names a lost bookie, whatever it saw before")
    periodic_check_interval_ms: int = option(604_800_000, "how often the auditor asks every replica of every "
                                                          "closed ledger which entries it holds (check-all)")
    open_ledger_rereplication_grace_ms: int = option(30_000, "a marked ledger whose last segment is still OPEN this "
                                                             "long is recovered (fenced, closed) before its copy")
    rereplication_bytes_per_s_max: int = option(32 * MiB, "copy rate of one worker, so writers keep their latency")
    worker_backoff_ms: int = option(5_000, "a worker waits this long after a failed attempt before the next")
    lost_ledger_retry_ms: int = option(60_000, "a ledger with an entry no replica holds is tried again only after "
                                               "this long (it is reported as lost meanwhile), or at once when a "
                                               "bookie whose silence made it lost registers again")
    read_batch_entries: int = option(64, "entries a worker reads from one replica in one ReadEntries call")
    rereplication_entry_batch_size: int = option(256, "entries one worker has in flight at once (read, verified, "
                                                      "being added to the replacement), in batches of at most "
                                                      "read_batch_entries: the next batches are read while earlier "
                                                      "ones are added (BookKeeper's rereplicationEntryBatchSize)")
    ledger_verification_percentage: int = option(0, "percent (0..100) of the closed ledgers' entries the check of "
                                                    "all ledgers reads from every replica and verifies (digest, "
                                                    "same bytes); a damaged copy counts as missing (BookKeeper's "
                                                    "auditorLedgerVerificationPercentage)")


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """TLS on gRPC links, token authentication and authorization at brokers (PROTOCOL.md §8). Keys, passwords
    and tokens are read from the files named here (or the environment), never from the command line."""
    tls_enabled: bool = option(False, "every gRPC server of this process serves TLS only (plaintext refused) and its "
                                      "clients (broker -> bookie, autorecovery and admin -> bookie, CLI -> broker "
                                      "or bookie) connect with TLS 1.2+")
    tls_ca_file: str = option("", "PEM file of the CA(s) a peer's certificate must chain to")
    tls_cert_file: str = option("", "PEM certificate chain this process presents (server, and client for mTLS)")
    tls_key_file: str = option("", "PEM private key of tls_cert_file (unencrypted; keep it mode 0600)")
    tls_client_auth: bool = option(False, "mutual TLS: servers require a client certificate signed by the CA "
                                          "(BookKeeper's tlsClientAuthentication)")
    tls_hostname_verification: bool = option(True, "clients check that the server's certificate names the host "
                                                   "they dialled (BookKeeper's tlsHostnameVerificationEnabled)")
    tls_refresh_interval_ms: int = option(60_000, "how often certificate and key files are checked; a changed file "
                                                  "is used for new connections (BookKeeper's "
                                                  "tlsCertFilesRefreshDurationSeconds); 0 = never reload")
    bookie_authorized_roles: str = option("", "comma-separated roles: a bookie serves only clients whose "
                                              "certificate carries one of them (needs tls_client_auth; BookKeeper's "
                                              "authorizedRoles with BookieAuthZFactory); empty = any client")
    auth_enabled: bool = option(False, "brokers require a signed token (JWT, role = sub) on every call and answer "
                                       "UNAUTHENTICATED without one (Pulsar's authenticationEnabled)")
    authorization_enabled: bool = option(False, "brokers check the caller's role against super-users, tenant "
                                                "admins and grants: PERMISSION_DENIED naming role and action "
                                                "(Pulsar's authorizationEnabled)")
    token_secret_key_file: str = option("", "file of the HS256 secret key that signs and checks tokens "
                                              "(Pulsar's tokenSecretKey)")
    token_public_key_file: str = option("", "PEM public key (RS256 or ES256) that checks tokens (Pulsar's "
                                              "tokenPublicKey)")
    token_file: str = option("", "file of the token this process presents to brokers (the CLI, tools and "
                                 "brokers calling brokers); BKSIM_TOKEN in the environment does the same")
    super_user_roles: str = option("", "comma-separated roles that may do anything: create tenants, set tenant "
                                       "admins, use the raw ledger API (Pulsar's superUserRoles)")
    ledger_roles: str = option("", "comma-separated roles besides the super-users allowed the raw ledger API")


@dataclass(frozen=True, slots=True)
class Config:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    zookeeper: ZooKeeperConfig = field(default_factory=ZooKeeperConfig)
    bookie: BookieConfig = field(default_factory=BookieConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    topic: TopicConfig = field(default_factory=TopicConfig)
    autorecovery: AutoRecoveryConfig = field(default_factory=AutoRecoveryConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def validate(self) -> "Config":
        b = self.bookie
        _require(b.entry_bytes_max < b.frame_bytes_max, f"bookie.entry_bytes_max ({b.entry_bytes_max}) must be < "
                 f"bookie.frame_bytes_max ({b.frame_bytes_max}): an entry travels in one gRPC message")
        _require(b.frame_bytes_max <= FRAME_BYTES_MAX,
                 f"bookie.frame_bytes_max ({b.frame_bytes_max}) must be <= the bookie clients' frame max "
                 f"({FRAME_BYTES_MAX}, model.config.FRAME_BYTES_MAX): a broker's transport refuses a larger answer")
        _require(b.entry_bytes_max >= 64, "bookie.entry_bytes_max must be >= 64")
        _require(0 < b.disk_usage_lwm_threshold <= b.disk_usage_threshold <= 1.0,
                 "need 0 < bookie.disk_usage_lwm_threshold <= bookie.disk_usage_threshold <= 1")
        for name in ("group_bytes_max", "journal_file_bytes_max", "journal_queue_records_max", "write_cache_bytes_max",
                     "entry_log_bytes_max", "add_inflight_per_stream_max", "add_inflight_total_max",
                     "read_batch_entries_max", "list_entries_ids_max", "flush_interval_ms", "disk_check_interval_ms",
                     "requests_inflight_max", "index_write_buffer_bytes"):
            _require(getattr(b, name) > 0, f"bookie.{name} must be > 0")
        _require(b.group_wait_ms_max >= 0, "bookie.group_wait_ms_max must be >= 0")
        _require(0 <= b.write_cache_entry_overhead_bytes < b.write_cache_bytes_max // 2,
                 "bookie.write_cache_entry_overhead_bytes must be >= 0 and below half of bookie.write_cache_bytes_max")
        _require(b.add_inflight_per_stream_max <= b.add_inflight_total_max,
                 "bookie.add_inflight_per_stream_max must be <= bookie.add_inflight_total_max")
        _require(b.journal_backups_max >= 0, "bookie.journal_backups_max must be >= 0")
        _require(b.entry_log_page_cache_bytes >= -1, "bookie.entry_log_page_cache_bytes must be >= -1 (-1: all stay)")
        _require(b.gc_wait_time_ms > 0, "bookie.gc_wait_time_ms must be > 0")
        _require(0 <= b.minor_compaction_threshold <= 1.0 and 0 <= b.major_compaction_threshold <= 1.0 and (
            b.major_compaction_threshold == 0 or b.minor_compaction_threshold <= b.major_compaction_threshold),
                 "need bookie.minor_compaction_threshold <= bookie.major_compaction_threshold, both in [0, 1] "
                 "(0 = off)")
        _require(b.gc_wait_time_ms <= b.minor_compaction_interval_ms <= b.major_compaction_interval_ms,
                 "need bookie.gc_wait_time_ms <= minor_compaction_interval_ms <= major_compaction_interval_ms")
        _require(b.compaction_rate_bytes_per_s >= 0, "bookie.compaction_rate_bytes_per_s must be >= 0")
        _require(self.cluster.bookies >= 0, "cluster.bookies must be >= 0")
        _require(self.cluster.brokers >= 0, "cluster.brokers must be >= 0")
        r = self.broker
        for name in ("bookie_timeout_ms", "speculative_read_ms", "metadata_cas_attempts_max", "add_batch_entries_max",
                     "add_window_max", "append_inflight_max", "payload_bytes_max", "ledgers_open_max",
                     "read_window_max", "read_entries_max", "requests_inflight_max"):
            _require(getattr(r, name) > 0, f"broker.{name} must be > 0")
        _require(r.add_requests_per_bookie_max >= 0, "broker.add_requests_per_bookie_max must be >= 0")
        parse_address_overrides(r.bookie_address_overrides)  # raises ConfigError naming the bad pair
        # A throttled add is answered (OK, or TOO_MANY_REQUESTS) after its wait plus a journal sync: a broker that
        # gives up on the bookie before that replaces a healthy, busy bookie. BookKeeper's defaults get this wrong
        # (dbStorage_maxThrottleTimeMs 10 s > addEntryTimeoutSec 5 s); the defaults here keep the wait at half the
        # timeout. Bookies and brokers are separate processes, but each loads this one configuration (the same
        # file for `bksim cluster up` and compose), so each checks the pair.
        _require(b.write_cache_throttle_ms_max < r.bookie_timeout_ms,
                 f"bookie.write_cache_throttle_ms_max ({b.write_cache_throttle_ms_max}) must be < "
                 f"broker.bookie_timeout_ms ({r.bookie_timeout_ms}): a bookie holding an add for write-cache room "
                 f"would be timed out and replaced by the broker while healthy (half the timeout is the default)")
        t = self.topic
        for name in ("ensemble_size", "write_quorum_size", "ack_quorum_size", "ledger_entries_max", "ledger_bytes_max",
                     "ledger_age_ms_max", "pending_adds_max", "trim_interval_ms", "message_bytes_max",
                     "batch_messages_max", "producer_pending_max", "dedup_snapshot_entries", "dedup_producers_max",
                     "dispatch_read_entries_max", "consumer_unacked_max", "subscription_unacked_max",
                     "consumers_per_subscription_max", "subscriptions_per_topic_max", "key_shared_replica_points",
                     "delayed_messages_per_subscription_max", "key_shared_sticky_ranges_max",
                     "backlog_quota_check_interval_ms", "backlog_quota_hold_ms_max",
                     "cursor_persist_interval_ms", "cursor_ledger_entries_max", "cursor_snapshot_chunk_bytes",
                     "ranges_in_metadata_max", "redelivery_counts_max"):
            _require(getattr(t, name) > 0, f"topic.{name} must be > 0")
        _require(t.ack_quorum_size <= t.write_quorum_size <= t.ensemble_size,
                 "need topic.ack_quorum_size <= topic.write_quorum_size <= topic.ensemble_size")
        _require(0 <= t.ledger_age_ms_min <= t.ledger_age_ms_max, "need 0 <= topic.ledger_age_ms_min <= ledger_age_ms_max")
        for name in ("quarantine_window_ms", "quarantine_ms"):
            _require(getattr(r, name) > 0, f"broker.{name} must be > 0")
        _require(r.quarantine_errors >= 0, "broker.quarantine_errors must be >= 0")
        a = self.autorecovery
        _require(a.lost_bookie_recovery_delay_ms >= 0, "autorecovery.lost_bookie_recovery_delay_ms must be >= 0")
        for name in ("bookie_check_interval_ms", "periodic_bookie_check_interval_ms", "periodic_check_interval_ms",
                     "open_ledger_rereplication_grace_ms", "rereplication_bytes_per_s_max", "worker_backoff_ms",
                     "lost_ledger_retry_ms", "read_batch_entries", "rereplication_entry_batch_size"):
            _require(getattr(a, name) > 0, f"autorecovery.{name} must be > 0")
        _require(0 <= a.ledger_verification_percentage <= 100,
                 f"autorecovery.ledger_verification_percentage ({a.ledger_verification_percentage}) must be within "
                 f"0..100 (a percent of the closed ledgers' entries)")
        _require(self.zookeeper.operation_timeout_ms > 0, "zookeeper.operation_timeout_ms must be > 0")
        _require(self.zookeeper.read_tries_max >= 1, "zookeeper.read_tries_max must be >= 1")
        for name, port in (("bookie.http_port", b.http_port), ("broker.http_port", r.http_port),
                           ("cluster.bookie_http_port_base", self.cluster.bookie_http_port_base),
                           ("cluster.broker_http_port_base", self.cluster.broker_http_port_base)):
            _require(0 <= port < 65536, f"{name} must be within 0..65535 (0 = no HTTP)")
        _require(0 <= self.zookeeper.secure_port < 65536, "zookeeper.secure_port must be within 0..65535")
        self._validate_zookeeper_ensemble()
        _require(r.metrics_topics_max >= 0, "broker.metrics_topics_max must be >= 0 (0 = every topic in _other)")
        sec = self.security
        _require(sec.tls_refresh_interval_ms >= 0, "security.tls_refresh_interval_ms must be >= 0")
        if sec.tls_enabled or self.zookeeper.secure_port:
            _require(bool(sec.tls_ca_file and sec.tls_cert_file and sec.tls_key_file),
                     "TLS (security.tls_enabled or zookeeper.secure_port) needs security.tls_ca_file, tls_cert_file "
                     "and tls_key_file (`bksim certs create --out DIR` makes them)")
        _require(not sec.bookie_authorized_roles or (sec.tls_enabled and sec.tls_client_auth),
                 "security.bookie_authorized_roles needs security.tls_enabled and security.tls_client_auth: the "
                 "role comes from the client's certificate")
        _require(not sec.auth_enabled or bool(sec.token_secret_key_file or sec.token_public_key_file),
                 "security.auth_enabled needs security.token_secret_key_file or token_public_key_file")
        _require(not sec.authorization_enabled or sec.auth_enabled,
                 "security.authorization_enabled needs security.auth_enabled: a grant names an authenticated role")
        return self


    def _validate_zookeeper_ensemble(self) -> None:
        z, n = self.zookeeper, self.cluster.zookeepers
        _require(1 <= n <= ZOOKEEPERS_MAX, f"cluster.zookeepers must be within 1..{ZOOKEEPERS_MAX}")
        for name, base in (("port", z.port), ("quorum_port_base", z.quorum_port_base),
                           ("election_port_base", z.election_port_base), ("secure_port", z.secure_port)):
            if base or name != "secure_port":
                _require(0 < base and base + n - 1 < 65536,
                         f"zookeeper.{name} ({base}) + cluster.zookeepers - 1 must be within 1..65535")
        if z.connect:
            parse_connect(z.connect)
        if z.peers:
            peers = parse_peers(z.peers)
            _require(0 <= z.server_id <= len(peers),
                     f"zookeeper.server_id ({z.server_id}) must be within 1..{len(peers)} (the peers), or 0")
        else:
            _require(z.server_id == 0, "zookeeper.server_id needs zookeeper.peers (the ensemble it is a member of)")


ZOOKEEPERS_MAX = 7  # ZooKeeper ensembles are 1, 3, 5 (sometimes 7) servers: every server is in every write's quorum


def parse_connect(connect: str) -> list[tuple[str, int]]:
    """A ZooKeeper connect string "HOST:PORT[,HOST:PORT...]" as (host, port) pairs; raises ConfigError."""
    servers = []
    for item in connect.split(","):
        host, sep, port = item.strip().rpartition(":")
        _require(bool(sep and host and port.isdigit() and 0 < int(port) < 65536),
                 f"zookeeper.connect {connect!r}: {item.strip()!r} is not HOST:PORT (PORT within 1..65535)")
        servers.append((host, int(port)))
    return servers


def parse_peers(peers: str) -> list[tuple[str, int, int]]:
    """zookeeper.peers "HOST:QUORUM_PORT:ELECTION_PORT[,...]" as (host, quorum port, election port), server 1
    first; raises ConfigError."""
    out = []
    for item in peers.split(","):
        parts = item.strip().rsplit(":", 2)
        ok = len(parts) == 3 and bool(parts[0]) and all(p.isdigit() and 0 < int(p) < 65536 for p in parts[1:])
        _require(ok, f"zookeeper.peers {peers!r}: {item.strip()!r} is not HOST:QUORUM_PORT:ELECTION_PORT")
        out.append((parts[0], int(parts[1]), int(parts[2])))
    _require(len(out) <= ZOOKEEPERS_MAX, f"zookeeper.peers: at most {ZOOKEEPERS_MAX} servers")
    return out


SECTIONS = {"cluster": ClusterConfig, "zookeeper": ZooKeeperConfig, "bookie": BookieConfig, "broker": BrokerConfig,
            "topic": TopicConfig, "autorecovery": AutoRecoveryConfig, "security": SecurityConfig}


def parse_address_overrides(text: str) -> dict[str, str]:
    """"id=host:port,id=host:port" -> {id: "host:port"}; ConfigError naming the first malformed pair."""
    overrides: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        bookie_id, sep, address = pair.partition("=")
        host, colon, port = address.strip().rpartition(":")
        _require(bool(sep and bookie_id.strip() and host and colon and port.isdigit() and 0 < int(port) < 65536),
                 f"broker.bookie_address_overrides: {pair!r} is not BOOKIE_ID=HOST:PORT")
        overrides[bookie_id.strip()] = address.strip()
    return overrides


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def coerce(section: str, name: str, raw, source: str):
    """Convert `raw` (TOML value or environment string) to the option's type, or raise ConfigError."""
    cls = SECTIONS.get(section)
    if cls is None:
        raise ConfigError(f"{source}: unknown section [{section}] (known: {', '.join(SECTIONS)})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ConfigError(f"{source}: unknown option {section}.{name}")
    kind = type(fields[name].default)
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("1", "true", "yes", "on"):
                return True
            if str(raw).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is int and isinstance(raw, float) and not raw.is_integer():
            raise ValueError(raw)
        if kind is int:
            return int(raw)
        return kind(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {section}.{name} = {raw!r} is not a valid {kind.__name__}") from None


def build(values: dict[str, dict[str, object]]) -> Config:
    """Build a validated Config from {section: {option: already-coerced value}}."""
    parts = {s: cls(**values.get(s, {})) for s, cls in SECTIONS.items()}
    return Config(**parts).validate()


def describe() -> list[tuple[str, str, object, str]]:
    """(section, option, default, doc) for every option: for docs and `bksim config`."""
    rows = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            rows.append((section, f.name, f.default, f.metadata["doc"]))
    return rows
