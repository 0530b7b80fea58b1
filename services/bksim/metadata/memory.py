"""InMemoryMetadataStore: ZooKeeper's data model in a dict, for unit tests and the deterministic simulator.

It implements the MetadataStore contract (ports/metadata.py) exactly as ZooKeeper does; the same contract
tests run against it and against a real ZooKeeper (tests/metadata_contract.py):

- versions start at 0 and grow by 1 per `set`; `set`/`delete` with a version other than the node's (and
  not -1) raise BadVersionError; NoNodeError for a missing node or (create) parent; NodeExistsError;
  NotEmptyError; NoChildrenForEphemeralsError; in ZooKeeper's order of checks;
- a sequential name ends with the parent's create counter as "%010d" (ZooKeeper counts every child
  created under the parent, sequential or not, and never deletes; a failed create does not count);
- sessions: `session(name)` opens one more session on the same tree and returns its `SessionView` (a
  MetadataStore). Ephemeral nodes belong to the session that created them. `expire(view)` deletes that
  session's ephemeral nodes and makes every later call through the view raise SessionExpiredError.
  The store itself is also a MetadataStore: the calls go through its own session, `default_session`.

Deterministic: no clock, no threads, no randomness; children are returned sorted, session ids are
1, 2, 3, ... in opening order. The async methods never suspend (they finish at their first step), so a
simulator that runs them on its own loop sees no interleaving inside one call.

Not modelled: watches, ACLs, the /zookeeper system node, data size limits, ConnectionLoss (a caller that
wants one injects it around the store).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bksim.model.errors import (BadVersionError, NoChildrenForEphemeralsError, NodeExistsError, NoNodeError,
                                NotEmptyError, SessionExpiredError)
from bksim.ports.metadata import ANY_VERSION

ROOT = "/"
SEQUENCE_FORMAT = "{:010d}"
PERSISTENT_OWNER = 0  # ZooKeeper's ephemeralOwner of a persistent node


@dataclass(frozen=True, slots=True)
class NodeStat:
    """What ZooKeeper's Stat says about a node (the fields this model keeps)."""
    version: int
    cversion: int  # child creates + child deletes, as ZooKeeper reports it
    ephemeral_owner: int  # session id, 0 for a persistent node
    num_children: int


@dataclass(slots=True)
class _Node:
    data: bytes
    ephemeral_owner: int = PERSISTENT_OWNER
    version: int = 0
    child_creates: int = 0  # the sequential counter
    child_deletes: int = 0
    children: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Session:
    session_id: int
    name: str
    alive: bool = True
    ephemerals: set[str] = field(default_factory=set)


def validate_path(path: str, sequential: bool = False) -> None:
    """ZooKeeper's path rules: absolute, no empty/'.'/'..' components, no trailing '/' (except '/' itself,
    and a sequential prefix may end with '/'), no NUL. ValueError otherwise (a caller bug)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"path {path!r} must be a string starting with '/'")
    if path == ROOT:
        return
    body = path[1:-1] if sequential and path.endswith("/") else path[1:]
    for part in body.split("/"):
        if part in ("", ".", "..") or "\0" in part:
            raise ValueError(f"invalid path {path!r} (empty, '.' or '..' component, trailing '/' or NUL)")


def _parent(path: str) -> str:
    parent = path.rsplit("/", 1)[0]
    return parent or ROOT


def _name(path: str) -> str:
    return path.rsplit("/", 1)[1]


class InMemoryMetadataStore:
    """One ZooKeeper ensemble's tree, shared by every session opened on it."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {ROOT: _Node(b"")}
        self._sessions: dict[int, _Session] = {}
        self.default_session = self.session("default")

    # -- sessions ------------------------------------------------------------------------------------------

    def session(self, name: str) -> "SessionView":
        """Open a new session (its id is the next integer); `name` is a label for logs and traces."""
        session_id = len(self._sessions) + 1
        self._sessions[session_id] = _Session(session_id, name)
        return SessionView(self, session_id, name)

    def expire(self, view: "SessionView") -> list[str]:
        """Expire `view`'s session: delete its ephemeral nodes (returned, sorted) and refuse its later calls."""
        session = self._sessions[view.session_id]
        assert session.alive or not session.ephemerals
        session.alive = False
        removed = sorted(session.ephemerals, reverse=True)  # children before parents (none exist: ephemeral)
        for path in removed:
            self._remove(path)
        session.ephemerals.clear()
        return sorted(removed)

    def is_alive(self, view: "SessionView") -> bool:
        return self._sessions[view.session_id].alive

    # -- inspection (not part of the port) ------------------------------------------------------------------

    def stat(self, path: str) -> NodeStat | None:
        validate_path(path)
        node = self._nodes.get(path)
        if node is None:
            return None
        return NodeStat(node.version, node.child_creates + node.child_deletes, node.ephemeral_owner,
                        len(node.children))

    def paths(self) -> list[str]:
        """Every node's path, sorted (for traces and snapshots)."""
        return sorted(self._nodes)

    # -- the port, through the default session --------------------------------------------------------------

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        return self._create(self.default_session.session_id, path, data, ephemeral, sequential, make_parents)

    async def get(self, path: str) -> tuple[bytes, int]:
        return self._get(self.default_session.session_id, path)

    async def set(self, path: str, data: bytes, version: int) -> int:
        return self._set(self.default_session.session_id, path, data, version)

    async def delete(self, path: str, version: int = ANY_VERSION) -> None:
        self._delete(self.default_session.session_id, path, version)

    async def children(self, path: str) -> list[str]:
        return self._children(self.default_session.session_id, path)

    async def children_with_cversion(self, path: str) -> tuple[list[str], int]:
        return self._children_with_cversion(self.default_session.session_id, path)

    async def exists(self, path: str) -> int | None:
        return self._exists(self.default_session.session_id, path)

    async def sync(self, path: str) -> None:
        self._sync(self.default_session.session_id, path)

    # -- operations (synchronous; every one first checks its session) ---------------------------------------

    def _check_session(self, session_id: int) -> _Session:
        session = self._sessions[session_id]
        if not session.alive:
            raise SessionExpiredError(message=f"session {session_id} ({session.name}) expired: its ephemeral "
                                              f"nodes are gone; open a new session")
        return session

    def _create(self, session_id: int, path: str, data: bytes, ephemeral: bool, sequential: bool,
                make_parents: bool) -> str:
        session = self._check_session(session_id)
        validate_path(path, sequential)
        if not isinstance(data, bytes):
            raise TypeError(f"node data must be bytes, got {type(data).__name__}")
        if path == ROOT:
            raise NodeExistsError(path)
        parent_path = _parent(path)
        if parent_path not in self._nodes:
            if not make_parents:
                raise NoNodeError(path, f"parent {parent_path} does not exist")
            self._make_parents(parent_path)
        parent = self._nodes[parent_path]
        if sequential:
            path = path + SEQUENCE_FORMAT.format(parent.child_creates)
        if path in self._nodes:
            raise NodeExistsError(path)
        if parent.ephemeral_owner != PERSISTENT_OWNER:
            raise NoChildrenForEphemeralsError(path, f"parent {parent_path} is ephemeral")
        owner = session_id if ephemeral else PERSISTENT_OWNER
        self._nodes[path] = _Node(data, ephemeral_owner=owner)
        parent.children.add(_name(path))
        parent.child_creates += 1
        if ephemeral:
            session.ephemerals.add(path)
        return path

    def _make_parents(self, path: str) -> None:
        """Create `path` and its missing ancestors as persistent empty nodes (kazoo's makepath)."""
        missing = []
        while path not in self._nodes:
            missing.append(path)
            path = _parent(path)
        for p in reversed(missing):
            parent = self._nodes[_parent(p)]
            if parent.ephemeral_owner != PERSISTENT_OWNER:
                raise NoChildrenForEphemeralsError(p, f"parent {_parent(p)} is ephemeral")
            self._nodes[p] = _Node(b"")
            parent.children.add(_name(p))
            parent.child_creates += 1

    def _node(self, path: str) -> _Node:
        validate_path(path)
        node = self._nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        return node

    def _get(self, session_id: int, path: str) -> tuple[bytes, int]:
        self._check_session(session_id)
        node = self._node(path)
        return node.data, node.version

    def _set(self, session_id: int, path: str, data: bytes, version: int) -> int:
        self._check_session(session_id)
        if not isinstance(data, bytes):
            raise TypeError(f"node data must be bytes, got {type(data).__name__}")
        node = self._node(path)
        if version != ANY_VERSION and version != node.version:
            raise BadVersionError(path, f"bad version: expected {version}, the node is at {node.version} "
                                        f"(re-read and re-decide)")
        node.data = data
        node.version += 1
        return node.version

    def _delete(self, session_id: int, path: str, version: int) -> None:
        self._check_session(session_id)
        if path == ROOT:
            raise ValueError("the root node cannot be deleted")
        node = self._node(path)
        if version != ANY_VERSION and version != node.version:
            raise BadVersionError(path, f"bad version: expected {version}, the node is at {node.version}")
        if node.children:
            raise NotEmptyError(path, f"node has {len(node.children)} children")
        self._remove(path)

    def _remove(self, path: str) -> None:
        node = self._nodes.pop(path)
        assert not node.children, path
        parent = self._nodes[_parent(path)]
        parent.children.discard(_name(path))
        parent.child_deletes += 1
        if node.ephemeral_owner != PERSISTENT_OWNER:
            self._sessions[node.ephemeral_owner].ephemerals.discard(path)

    def _children(self, session_id: int, path: str) -> list[str]:
        self._check_session(session_id)
        return sorted(self._node(path).children)

    def _children_with_cversion(self, session_id: int, path: str) -> tuple[list[str], int]:
        self._check_session(session_id)
        node = self._node(path)
        return sorted(node.children), node.child_creates + node.child_deletes

    def _exists(self, session_id: int, path: str) -> int | None:
        self._check_session(session_id)
        validate_path(path)
        node = self._nodes.get(path)
        return None if node is None else node.version

    def _sync(self, session_id: int, path: str) -> None:
        self._check_session(session_id)  # one copy of the data: every read is already up to date
        validate_path(path)


class SessionView:
    """One session on an InMemoryMetadataStore: a MetadataStore whose ephemeral nodes die with it."""

    __slots__ = ("_store", "session_id", "name")

    def __init__(self, store: InMemoryMetadataStore, session_id: int, name: str) -> None:
        self._store = store
        self.session_id = session_id
        self.name = name

    def __repr__(self) -> str:
        return f"SessionView({self.session_id}, {self.name!r})"

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequential: bool = False,
                     make_parents: bool = False) -> str:
        return self._store._create(self.session_id, path, data, ephemeral, sequential, make_parents)

    async def get(self, path: str) -> tuple[bytes, int]:
        return self._store._get(self.session_id, path)

    async def set(self, path: str, data: bytes, version: int) -> int:
        return self._store._set(self.session_id, path, data, version)

    async def delete(self, path: str, version: int = ANY_VERSION) -> None:
        self._store._delete(self.session_id, path, version)

    async def children(self, path: str) -> list[str]:
        return self._store._children(self.session_id, path)

    async def children_with_cversion(self, path: str) -> tuple[list[str], int]:
        return self._store._children_with_cversion(self.session_id, path)

    async def exists(self, path: str) -> int | None:
        return self._store._exists(self.session_id, path)

    async def sync(self, path: str) -> None:
        self._store._sync(self.session_id, path)
