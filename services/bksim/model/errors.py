"""The error tree: every operating error is a BksimError, drawn here once (classes defined in other modules
name their module; a module raises only the errors of its own layer or below).

    BksimError                      operating errors: expected, handled, reported with a clear message
    ├── ConfigError                 a configuration value is missing, malformed or out of range
    ├── BookieError(status)         an operation answered with a non-OK StatusCode (PROTOCOL.md §2.1)
    ├── BookieUnreachable(bookie, why, code)  no answer from a bookie (refused, broken, deadline, closed):
    │                               the outcome of an unanswered add is unknown; `code` is the gRPC code
    │                               name when a gRPC call failed (adapters/bookie_client.py raises it too)
    ├── BookieAdminError(code)      a bookie refused an operator call (BookieAdmin: run GC, GC status), nothing
    │                               changed; `code` is the gRPC code name (adapters/bookie_client.py)
    ├── FormatError                 bytes that do not parse (bad magic, short record, bad CRC)
    │   ├── JournalCorruptError     journal damage that is not a torn tail: the bookie refuses to start
    │   ├── MetadataFormatError     ledger metadata bytes that are not JSON of a known format_version
    │   └── CodecError              a cursor znode or cursor-ledger entry that does not decode
    │                               (topics/cursor_codec.py)
    ├── CookieError                 directories and ZooKeeper disagree on the bookie's identity
    ├── MetadataError(path)         the metadata store (ZooKeeper, or the in-memory twin) refused an operation
    │   ├── NoNodeError             the node does not exist (for create: its parent does not)
    │   ├── NodeExistsError         create of a path that exists
    │   ├── BadVersionError         a compare-and-set lost: the node's version is not the expected one;
    │   │                           re-read and re-decide, never overwrite (PROTOCOL.md §3)
    │   ├── NotEmptyError           delete of a node that has children
    │   ├── NoChildrenForEphemeralsError  create under an ephemeral node
    │   ├── SessionExpiredError     the session of the caller is gone: its ephemeral nodes were deleted and
    │   │                           every later call through it fails; open a new session
    │   └── ConnectionLossError     no answer in time: the outcome of a write is UNKNOWN (re-read first)
    ├── LedgerStateError            a ledger metadata transition the current state forbids (e.g. closing a
    │                               ledger that is CLOSED with other values)
    ├── QuorumError                 quorum sizes that break E >= Qw >= Qa >= 1 (ledger/quorum.py)
    ├── WriterError                 an event the ledger writer cannot take in its state (ledger/writer.py)
    ├── ManagedLedgerStateError     a managed-ledger state move its transition table does not list
    │                               (topics/managed_ledger.py)
    ├── LedgerError(status)         a ledger operation failed: a LedgerStatus (model/status.py,
    │                               proto/broker.proto) a client can act on
    ├── TopicError(status)          a topic operation failed: a TopicStatus (proto/topic.proto), with the
    │                               owner's address for NOT_OWNER (topics/errors.py)
    ├── BrokerCallError(status, grpc_code)  a call to a broker failed: the LedgerStatus or TopicStatus name of
    │                               its answer, or the gRPC code when it did not answer
    │                               (adapters/broker_client.py)
    ├── ClientError(status)         a topic client call failed: a TopicStatus (client/errors.py)
    ├── TokenError(reason)          a token or token key that cannot be used: missing, malformed, expired, bad
    │                               signature, wrong algorithm; never holds the token (security/tokens.py)
    ├── PermissionDenied            a role may not do an action on a resource (security/authz.py)
    ├── GrantError                  a grant that cannot be stored: unknown action, bad role (security/authz.py)
    ├── RegistrationError           ZooKeeper unreachable, or it refused a bookie's registration
    │                               (adapters/registration.py)
    ├── ZooKeeperError              the ZooKeeper server did not start or become ready
    │                               (adapters/zookeeper_server.py)
    ├── ClusterError                a local cluster process did not start, become ready or stop
    │                               (adapters/local_cluster.py)
    ├── MonitorError                the monitoring Prometheus could not be configured, started, reached or
    │                               stopped (adapters/prometheus_server.py)
    ├── SparkStandaloneError        the audit's Spark standalone master or workers could not be started,
    │                               reached or stopped (adapters/spark_standalone.py)
    ├── SimulationError             the simulated world used in a way it does not support (sim/loop.py)
    │   ├── SimThreadsRefused       run_in_executor or asyncio.to_thread under the simulator
    │   ├── SimDeadlock             no runnable task and no timer while tasks wait
    │   └── SimLivelock             tasks spin without virtual time moving
    ├── AuditInputError             audit input that cannot be used: a missing path, an unreadable
    │                               snapshot, files whose bookie cannot be told (audit/snapshot.py)
    ├── ChaosError                  a chaos run that cannot go on (chaos/actions.py)
    └── command errors              a CLI command refused its arguments or could not finish:
                                    LedgerCommandError (cli/ledger_cmd.py), TopicCommandError
                                    (cli/topic_cmd.py), ComposeError (deploy/compose.py),
                                    BookieFormatError (`bksim bookie format` refused, nothing changed:
                                    adapters/bookie_cookies.py), DecommissionError (`bksim bookie
                                    decommission` refused, nothing changed, or not done in time:
                                    autorecovery/admin.py)

Servers map LedgerError and TopicError to gRPC codes with one table each (adapters/broker_client.py
GRPC_CODE_NAME, adapters/topic_server.py TOPIC_GRPC_CODE_NAME); the status name travels in the
"bksim-status" trailer.

Bugs (a broken invariant) are not in this tree: they are ``assert`` statements and InvariantError
(model/invariants.py, an AssertionError raised by the state machines' check_invariants()), and crash
loudly. Outside the tree too: the simulator's InvariantViolation (sim/bookie_checks.py: a finding about the
code under simulation, reported by the scenario) and the simulated disk's ProcessCrashed (sim/disk.py: an
OSError, because to the engine a crash looks like failing I/O).
"""
from __future__ import annotations

from bksim.model.status import LedgerStatus, StatusCode


class BksimError(Exception):
    """Base of every operating error."""


class ConfigError(BksimError):
    pass


class BookieError(BksimError):
    def __init__(self, status: StatusCode, message: str = "") -> None:
        self.status = StatusCode(status)
        self.message = message
        super().__init__(f"{self.status.name}: {message}" if message else self.status.name)


class FormatError(BksimError):
    pass


class JournalCorruptError(FormatError):
    pass


class CookieError(BksimError):
    pass


class MetadataFormatError(FormatError):
    pass


class MetadataError(BksimError):
    """An operation of the metadata store failed; `path` names the node (ZooKeeper's error codes)."""

    default_message = "metadata store error"

    def __init__(self, path: str = "", message: str = "") -> None:
        self.path = path
        self.message = message or self.default_message
        super().__init__(f"{path}: {self.message}" if path else self.message)


class NoNodeError(MetadataError):
    default_message = "no such node"


class NodeExistsError(MetadataError):
    default_message = "node exists"


class BadVersionError(MetadataError):
    default_message = "bad version (another writer changed the node: re-read and re-decide)"


class NotEmptyError(MetadataError):
    default_message = "node has children"


class NoChildrenForEphemeralsError(MetadataError):
    default_message = "ephemeral nodes cannot have children"


class SessionExpiredError(MetadataError):
    default_message = "session expired (its ephemeral nodes are gone)"


class ConnectionLossError(MetadataError):
    default_message = "no answer from the metadata store: the outcome is unknown"


class LedgerStateError(BksimError):
    pass


class BookieUnreachable(BksimError):
    """A bookie did not answer (connection refused or broken, deadline passed, stream ended, transport closed).
    The outcome of an add that got no answer is unknown: it may be on the bookie's disk. `bookie`: its id or
    address ("" when unknown); `why`: what happened; `code`: the gRPC status code name when a gRPC call failed
    ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", ...), "" otherwise."""

    def __init__(self, bookie: str, why: str, *, code: str = "") -> None:
        self.bookie = bookie
        self.why = why
        self.code = code
        super().__init__(f"bookie {bookie}: {why}" if bookie else why)


class LedgerError(BksimError):
    """A ledger operation failed with a status a client can act on (`status`: a LedgerStatus other than OK:
    NOT_ENOUGH_BOOKIES, NO_SUCH_LEDGER, LEDGER_CLOSED, NOT_WRITER, FENCED, BAD_REQUEST, ...)."""

    def __init__(self, status: LedgerStatus | str, message: str) -> None:
        self.status = LedgerStatus(status)
        if self.status is LedgerStatus.OK:
            raise ValueError(f"a LedgerError needs a failure status, not OK ({message})")
        self.message = message
        super().__init__(f"{self.status}: {message}")
