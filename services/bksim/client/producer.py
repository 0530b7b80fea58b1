"""The producer: batching, sequence ids, partition routing, receipts, send timeouts and reconnects.

Shape. A `Producer` (the sync facade) has one `_PartitionProducer` per partition (one for a non-partitioned
topic). Application threads add messages to the partition's *open batch* under the producer's lock; a batch
is *sealed* when it reaches `batching_max_messages` or `batching_max_bytes`, when a message with a different
key arrives (one batch holds one key, so Key_Shared keeps per-key order), when `batching_max_publish_delay_ms`
has passed since its first message (a timer on the loop), or by `send()` / `flush()`. Sealed batches wait in
`unsent`; the loop writes each as one Send (one entry) on the partition's Produce stream and moves it to
`inflight`, where it waits for its SendReceipt (receipts come in Send order).

Sequence ids increase by one per message and per partition, from `initial_sequence_id`, else from the
broker's `last_sequence_id` + 1 for this producer name (so a producer with a stable name continues after what
the broker persisted, and dedup drops re-sent duplicates).

Reconnects. The stream's lifecycle (lookup, open, reconnect with back-off, close) is stream.py's
PartitionStream, shared with the consumer; the partition producer is its role. On NOT_OWNER, TOPIC_FENCED,
SERVICE_UNAVAILABLE (or the transport failing), ... the partition producer looks the topic up again and opens
a new stream to the owner, waiting between attempts (Backoff: bounded attempts, overall
`operation_timeout_ms`); its un-receipted Sends go again first, in order, with the same sequence ids. A
per-Send refusal (MESSAGE_TOO_LARGE, BAD_REQUEST) fails the oldest un-receipted batch and the rest go again.
Any other refusal, or giving up reconnecting, fails the producer: every pending message's callback gets the
error and later sends raise it.

Bounds. At most `max_pending_messages` messages (all partitions) wait for receipts: then send blocks
(`block_if_queue_full`, at most the send timeout) or raises TOO_MANY_REQUESTS. A batch older than
`send_timeout_ms` fails with TIMEOUT (it may still have been persisted; a receipt arriving later is ignored).
A message larger than `max_message_bytes` is refused before it is sent (MESSAGE_TOO_LARGE).

Delayed delivery: `deliver_at_ms` (ms since the epoch) or `deliver_after_ms` (from now, by this machine's
clock) sets the message's delivery time (Pulsar's deliverAt / deliverAfter); Shared and Key_Shared
subscriptions receive it only then, Exclusive and Failover at once. A delayed message is never batched: it
seals the open batch and goes alone in its own Send.

Message ids: MessageId(ledger, entry, partition, batch index); a Send of several messages is a batch (index i
for its message i), a Send of one message is not (index -1) — as the broker writes it. A duplicate dropped
by the broker's dedup gets MessageId(-1, -1, partition, -1).
"""
from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from typing import Callable

from bksim.client.errors import ClientError, from_error_pb
from bksim.client.stream import CLOSE_WAIT_S, PartitionStream, StreamKind
from bksim.client.types import MessageId, RoutingMode
from bksim.formats.murmur3 import murmur3_32
from bksim.gen import topic_pb2
from bksim.model.config import TopicConfig
from bksim.model.status import TopicStatus

BATCHING_MAX_MESSAGES_DEFAULT = 1000
BATCHING_MAX_BYTES_DEFAULT = 128 * 1024
BATCHING_MAX_PUBLISH_DELAY_MS_DEFAULT = 1
SEND_TIMEOUT_MS_DEFAULT = 30_000
MAX_PENDING_MESSAGES_DEFAULT = 1000
MAX_MESSAGE_BYTES_DEFAULT = TopicConfig().message_bytes_max  # the broker's default bound on one entry
MESSAGE_OVERHEAD_BYTES = 40  # entry bytes per message besides payload, key and properties (formats/message.py)
ENTRY_OVERHEAD_BYTES = 64    # entry header bytes besides the producer name
SEND_WAIT_GRACE_S = 5.0      # send() waits the send timeout plus this for the timeout to be reported

Callback = Callable[[ClientError | None, MessageId | None], None]


class _Batch:
    """Messages that become one Send (one entry). Built under the producer's lock, then loop-owned."""

    __slots__ = ("request", "callbacks", "bytes", "key", "created", "done", "first_seq")

    def __init__(self, key: str | None, now: float) -> None:
        self.request = topic_pb2.ProduceRequest()
        self.callbacks: list[Callback | None] = []
        self.bytes = ENTRY_OVERHEAD_BYTES
        self.key = key
        self.created = now
        self.done = False
        self.first_seq = -1

    @property
    def count(self) -> int:
        return len(self.callbacks)


def _message_bytes(payload: bytes, key: str | None, properties: dict[str, str] | None) -> int:
    """The bytes a message adds to its entry (about); BAD_REQUEST for properties that are not str -> str."""
    size = len(payload) + MESSAGE_OVERHEAD_BYTES + (len(key.encode()) if key else 0)
    if properties:
        for k, v in properties.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ClientError(TopicStatus.BAD_REQUEST, f"message properties must map str to str, not {k!r}: {v!r}")
            size += len(k.encode()) + len(v.encode()) + 6
    return size


def _deliver_at(at_ms: int | None, after_ms: int | None) -> int:
    """The delivery time of a send (0 = at once); BAD_REQUEST for both, or a negative value."""
    if at_ms is not None and after_ms is not None:
        raise ClientError(TopicStatus.BAD_REQUEST, "give deliver_at_ms or deliver_after_ms, not both")
    for name, value in (("deliver_at_ms", at_ms), ("deliver_after_ms", after_ms)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ClientError(TopicStatus.BAD_REQUEST, f"{name} must be an int >= 0, not {value!r}")
    if after_ms:
        return int(time.time() * 1000) + after_ms
    return at_ms or 0


class _Waiter:
    """What a blocking send() waits on."""

    __slots__ = ("event", "error", "message_id")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: ClientError | None = None
        self.message_id: MessageId | None = None

    def __call__(self, error: ClientError | None, message_id: MessageId | None) -> None:
        self.error = error
        self.message_id = message_id
        self.event.set()


class Producer:
    """Publishes to one topic (all its partitions). Create with `Client.create_producer`; thread-safe."""

    def __init__(self, client, topic: str, partitions: int, *, producer_name: str | None,
                 batching_enabled: bool, batching_max_messages: int, batching_max_bytes: int,
                 batching_max_publish_delay_ms: float, send_timeout_ms: int, max_pending_messages: int,
                 block_if_queue_full: bool, routing_mode: RoutingMode, initial_sequence_id: int | None,
                 max_message_bytes: int) -> None:
        for name, value in (("batching_max_messages", batching_max_messages), ("batching_max_bytes", batching_max_bytes),
                            ("max_pending_messages", max_pending_messages), ("max_message_bytes", max_message_bytes)):
            if value < 1:
                raise ClientError(TopicStatus.BAD_REQUEST, f"{name} must be >= 1, got {value}")
        if send_timeout_ms < 0 or batching_max_publish_delay_ms < 0:
            raise ClientError(TopicStatus.BAD_REQUEST, "send_timeout_ms and batching_max_publish_delay_ms must be >= 0")
        self._client = client
        self._loop = client._loop
        self._topic = topic
        self._partitioned = partitions > 0
        self._requested_name = producer_name or ""
        self._batching = batching_enabled
        self._batch_max_messages = batching_max_messages if batching_enabled else 1
        self._batch_max_bytes = batching_max_bytes
        self._batch_delay_s = batching_max_publish_delay_ms / 1000.0
        self._send_timeout_s = send_timeout_ms / 1000.0
        self._max_pending = max_pending_messages
        self._block = block_if_queue_full
        self._routing = routing_mode
        self._initial_seq = initial_sequence_id
        self._max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the same lock; waits for room and for receipts
        self._pending = 0       # messages added and not yet receipted or failed
        self._waiters = 0       # threads waiting on _cond
        self._error: ClientError | None = None  # set once: the producer failed
        self._closed = False
        count = partitions if self._partitioned else 1
        self._parts = [_PartitionProducer(self, f"{topic}-partition-{i}" if self._partitioned else topic,
                                          i if self._partitioned else -1) for i in range(count)]
        self._rr = random.randrange(count)  # round-robin position (batches without a key)
        self._single = random.randrange(count)  # SinglePartition's partition
        self._timeout_task: asyncio.Task | None = None

    # -- start -------------------------------------------------------------------------------------------------
    async def _start(self) -> None:
        """Connect every partition producer (partition 0 first: the others reuse its producer name)."""
        first = self._parts[0]
        await first.start(self._requested_name)
        rest = self._parts[1:]
        if rest:
            results = await asyncio.gather(*(p.start(first.name) for p in rest), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        if self._send_timeout_s > 0:
            self._timeout_task = asyncio.get_running_loop().create_task(self._expire_loop())

    # -- facts -------------------------------------------------------------------------------------------------
    def topic(self) -> str:
        return self._topic

    def producer_name(self) -> str:
        return self._parts[0].name

    def last_sequence_id(self) -> int:
        """The highest sequence id assigned so far (of any partition; -1 = none)."""
        with self._lock:
            return max(p.next_seq for p in self._parts) - 1

    @property
    def partitions(self) -> int:
        return len(self._parts) if self._partitioned else 0

    def pending_messages(self) -> int:
        return self._pending

    # -- sending -----------------------------------------------------------------------------------------------
    def send(self, payload: bytes, key: str | None = None, properties: dict[str, str] | None = None,
             event_time_ms: int = 0, sequence_id: int | None = None, *, deliver_at_ms: int | None = None,
             deliver_after_ms: int | None = None) -> MessageId:
        """Publish one message and wait for its receipt; returns its MessageId (raises ClientError).
        `deliver_at_ms` / `deliver_after_ms`: delayed delivery (see the module docstring); at most one."""
        waiter = _Waiter()
        self._add(payload, waiter, key, properties, event_time_ms, sequence_id, flush=True,
                  deliver_at=_deliver_at(deliver_at_ms, deliver_after_ms))
        timeout = self._send_timeout_s + SEND_WAIT_GRACE_S if self._send_timeout_s > 0 else None
        if not waiter.event.wait(timeout):
            raise ClientError(TopicStatus.TIMEOUT,
                              f"producer {self.producer_name()} on {self._topic}: no receipt within "
                              f"{timeout:.1f}s")
        if waiter.error is not None:
            raise waiter.error
        return waiter.message_id

    def send_async(self, payload: bytes, callback: Callback | None, key: str | None = None,
                   properties: dict[str, str] | None = None, event_time_ms: int = 0,
                   sequence_id: int | None = None, *, deliver_at_ms: int | None = None,
                   deliver_after_ms: int | None = None) -> None:
        """Publish one message; `callback(error, message_id)` runs on the client's thread when the receipt
        arrives (error None) or the message failed (message_id None). It must not block."""
        self._add(payload, callback, key, properties, event_time_ms, sequence_id, flush=False,
                  deliver_at=_deliver_at(deliver_at_ms, deliver_after_ms))

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every open batch and wait until each message added before this call has its receipt or
        failed (at most `timeout_s`, default the send timeout, else the operation timeout)."""
        timeout = timeout_s if timeout_s is not None else (self._send_timeout_s + SEND_WAIT_GRACE_S
                                                           if self._send_timeout_s > 0 else self._client._operation_timeout_s)
        with self._lock:
            for part in self._parts:
                self._seal(part)
            targets = [b for part in self._parts for b in (*part.inflight, *part.unsent) if not b.done]
            if not targets:
                return
            self._waiters += 1
            try:
                ok = self._cond.wait_for(lambda: all(b.done for b in targets), timeout)
            finally:
                self._waiters -= 1
        if not ok:
            raise ClientError(TopicStatus.TIMEOUT,
                              f"producer {self.producer_name()} on {self._topic}: flush did not finish "
                              f"within {timeout:.1f}s")

    def _add(self, payload, callback, key, properties, event_time_ms, sequence_id, flush: bool,
             deliver_at: int = 0) -> None:
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise ClientError(TopicStatus.BAD_REQUEST, f"payload must be bytes, not {type(payload).__name__}")
        if key is not None and not isinstance(key, str):
            raise ClientError(TopicStatus.BAD_REQUEST, f"key must be a str, not {type(key).__name__}")
        size = _message_bytes(payload, key, properties)
        if size > self._max_message_bytes:
            raise ClientError(TopicStatus.MESSAGE_TOO_LARGE,
                              f"message of {size} bytes (payload {len(payload)}) exceeds "
                              f"max_message_bytes {self._max_message_bytes} of producer on {self._topic}")
        arm = None
        with self._lock:
            self._check_usable()
            if self._pending >= self._max_pending:
                self._wait_for_room()
            part = self._route(key)
            if sequence_id is None:
                seq = part.next_seq
            elif sequence_id < part.next_seq:
                raise ClientError(TopicStatus.BAD_REQUEST,
                                  f"sequence_id {sequence_id} is below the next one of this producer "
                                  f"({part.next_seq}): sequence ids must increase")
            else:
                seq = sequence_id
            batch = part.open
            if batch is not None and (deliver_at or batch.key != key or batch.bytes + size > self._batch_max_bytes):
                self._seal(part)
                batch = None
            if batch is None:
                batch = part.open = _Batch(key, time.monotonic())
                arm = batch
            part.next_seq = seq + 1
            m = batch.request.send.messages.add(payload=bytes(payload), sequence_id=seq)
            if key is not None:
                m.key = key
                m.has_key = True
            if properties:
                m.properties.update(properties)
            if event_time_ms:
                m.event_time_ms = event_time_ms
            if deliver_at:
                m.deliver_at_ms = deliver_at
            if batch.first_seq < 0:
                batch.first_seq = seq
            batch.callbacks.append(callback)
            batch.bytes += size
            self._pending += 1
            if flush or deliver_at or len(batch.callbacks) >= self._batch_max_messages:
                self._seal(part)
                arm = None
        if arm is not None:
            if self._batch_delay_s > 0:
                self._loop.call(self._arm_timer, part, arm)
            else:
                with self._lock:
                    if part.open is arm:
                        self._seal(part)

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientError(TopicStatus.BAD_REQUEST, f"producer {self.producer_name()} on {self._topic} is closed")

    def _wait_for_room(self) -> None:
        """Under the lock: wait for pending room (block_if_queue_full) or raise TOO_MANY_REQUESTS."""
        if not self._block or self._loop.in_loop:  # a send callback must not block the thread that runs it
            raise ClientError(TopicStatus.TOO_MANY_REQUESTS,
                              f"producer {self.producer_name()} on {self._topic} has "
                              f"max_pending_messages={self._max_pending} messages waiting for "
                              f"receipts (block_if_queue_full={self._block}"
                              f"{', in a client callback' if self._block else ''})")
        # the oldest pending message fails within the send timeout (plus a tick), which makes room
        timeout = (self._send_timeout_s + SEND_WAIT_GRACE_S if self._send_timeout_s > 0
                   else self._client._operation_timeout_s)
        self._waiters += 1
        try:
            ok = self._cond.wait_for(lambda: self._pending < self._max_pending or self._error or self._closed, timeout)
        finally:
            self._waiters -= 1
        self._check_usable()
        if not ok:
            raise ClientError(TopicStatus.TIMEOUT,
                              f"producer {self.producer_name()} on {self._topic}: no room among "
                              f"max_pending_messages={self._max_pending} within {timeout:.1f}s")

    def _route(self, key: str | None) -> "_PartitionProducer":
        n = len(self._parts)
        if n == 1:
            return self._parts[0]
        if key is not None:
            return self._parts[murmur3_32(key) % n]
        if self._routing is RoutingMode.SinglePartition:
            return self._parts[self._single]
        return self._parts[self._rr]

    def _seal(self, part: "_PartitionProducer") -> None:
        """Under the lock: move the partition's open batch to `unsent` and wake its writer."""
        batch = part.open
        if batch is None:
            return
        part.open = None
        if not batch.count:
            return
        part.unsent.append(batch)
        if part.index == self._rr and len(self._parts) > 1:
            self._rr = (self._rr + 1) % len(self._parts)
        if not part.wake_scheduled:
            part.wake_scheduled = True
            self._loop.call(part.wake)

    def _arm_timer(self, part: "_PartitionProducer", batch: _Batch) -> None:  # loop thread
        self._loop.loop.call_later(self._batch_delay_s, self._on_timer, part, batch)

    def _on_timer(self, part: "_PartitionProducer", batch: _Batch) -> None:  # loop thread
        with self._lock:
            if part.open is batch:
                self._seal(part)

    # -- completion (loop thread) ------------------------------------------------------------------------------
    def _complete(self, batch: _Batch, error: ClientError | None, ids: list[MessageId] | None) -> None:
        with self._lock:
            if batch.done:
                return
            batch.done = True
            self._pending -= batch.count
            if self._waiters:
                self._cond.notify_all()
        for i, callback in enumerate(batch.callbacks):
            if callback is None:
                continue
            try:
                callback(error, None if ids is None else ids[i])
            except Exception:  # noqa: BLE001 - an application callback must not break the producer
                import logging
                logging.getLogger("bksim.client").exception("producer %s: send callback failed", self.producer_name())

    def _fail(self, error: ClientError) -> None:
        """The producer cannot go on: fail every pending message; later sends raise `error`."""
        with self._lock:
            if self._error is None and not self._closed:
                self._error = error
            batches = []
            for part in self._parts:
                if part.open is not None:
                    batches.append(part.open)
                    part.open = None
                batches += [b for b in (*part.inflight, *part.unsent) if not b.done]
            if self._waiters:
                self._cond.notify_all()
        for b in batches:
            self._complete(b, error, None)

    async def _expire_loop(self) -> None:
        """Fail batches older than the send timeout, oldest first (every tick)."""
        tick = min(1.0, max(0.01, self._send_timeout_s / 10))
        while True:
            await asyncio.sleep(tick)  # a periodic check, not synchronisation
            cutoff = time.monotonic() - self._send_timeout_s
            expired = []
            with self._lock:
                for part in self._parts:
                    for b in (*part.inflight, *part.unsent):
                        if b.created > cutoff:
                            break
                        if not b.done:
                            expired.append(b)
                    if part.open is not None and part.open.created <= cutoff:
                        self._seal(part)
            for b in expired:
                self._complete(b, ClientError(TopicStatus.TIMEOUT,
                                              f"producer {self.producer_name()} on {self._topic}: no "
                                              f"receipt within send_timeout_ms="
                                              f"{self._send_timeout_s * 1000:.0f} (the message may still "
                                              f"have been persisted)"), None)

    # -- close -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush (bounded), then end every stream; messages still pending fail."""
        if self._closed:
            return
        try:
            if self._error is None:
                self.flush()
        except ClientError:
            pass
        finally:
            with self._lock:
                self._closed = True
            try:
                self._loop.run(self._close(), CLOSE_WAIT_S * 2 + 1)
            except ClientError:
                pass
            self._client._forget(self)
            self._fail(ClientError(TopicStatus.BAD_REQUEST, f"producer on {self._topic} closed before the receipt"))

    async def _close(self) -> None:
        if self._timeout_task is not None:
            self._timeout_task.cancel()
        await asyncio.gather(*(p.stop() for p in self._parts), return_exceptions=True)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


PRODUCE_STREAM = StreamKind(method="Produce", open_name="ProducerOpen", ready_kind="ready", stream_name="produce",
                            ready_words="the producer was ready", busy_status=TopicStatus.NOT_ALLOWED)
# refusals of one Send: they fail the oldest un-receipted batch only, and the rest go again
PER_SEND_REFUSALS = frozenset({TopicStatus.MESSAGE_TOO_LARGE, TopicStatus.BAD_REQUEST})


class _PartitionProducer:
    """One partition's batches and the role they play on its Produce stream (stream.py; see the module
    docstring)."""

    def __init__(self, producer: Producer, topic: str, index: int) -> None:
        self.producer = producer
        self.topic = topic
        self.index = index
        self.open: _Batch | None = None                  # under the producer's lock
        self.unsent: collections.deque[_Batch] = collections.deque()   # under the lock
        self.inflight: collections.deque[_Batch] = collections.deque()  # changed under the lock, loop thread
        self.next_seq = 0                                # under the lock
        self.wake_scheduled = False                      # under the lock
        self._wake = asyncio.Event()
        self._request_id = 0
        self.stream = PartitionStream(producer._client, topic, PRODUCE_STREAM, self)

    @property
    def name(self) -> str:
        return self.stream.name

    def wake(self) -> None:  # loop thread
        with self.producer._lock:
            self.wake_scheduled = False
        self._wake.set()

    async def start(self, name: str) -> None:
        await self.stream.start(name)

    async def stop(self) -> None:
        await self.stream.stop()

    # -- the stream's role (loop thread) -----------------------------------------------------------------------
    def describe(self) -> str:
        return f"producer on {self.topic}"

    def open_request(self, name: str) -> topic_pb2.ProduceRequest:
        return topic_pb2.ProduceRequest(open=topic_pb2.ProducerOpen(topic=self.topic, producer_name=name))

    def opened(self, ready: topic_pb2.ProducerReady) -> str:
        """Sequence ids go on from `initial_sequence_id` on the first stream, else after what the broker
        persisted for this producer name (and never back)."""
        producer = self.producer
        with producer._lock:
            if self.stream.opened == 1 and producer._initial_seq is not None:
                self.next_seq = max(self.next_seq, producer._initial_seq)
            else:
                self.next_seq = max(self.next_seq, ready.last_sequence_id + 1)
        return ready.producer_name

    def writer(self, outbox: asyncio.Queue):
        self._wake.set()  # batches re-queued from the previous stream go first
        return self._pump(outbox)

    def received(self, response: topic_pb2.ProduceResponse) -> ClientError | None:
        kind = response.WhichOneof("kind")
        if kind == "receipt":
            return self._on_receipt(response.receipt)
        if kind == "error":
            return from_error_pb(response.error, self.stream.address)
        return None

    def ended(self, error: ClientError) -> None:
        pass

    def lost(self, error: ClientError) -> bool:
        """Un-receipted batches go again first, in order, with their sequence ids; a per-Send refusal fails
        only the oldest of them, and the rest go again at once."""
        if not error.retriable and error.status in PER_SEND_REFUSALS:
            head = next((b for b in self.inflight if not b.done), None)
            if head is not None:
                self.producer._complete(head, error, None)
                self._requeue()
                return True
        self._requeue()
        return False

    def fail(self, error: ClientError) -> None:
        self.producer._fail(error)

    def _requeue(self) -> None:
        with self.producer._lock:
            again = [b for b in self.inflight if not b.done]
            self.inflight.clear()
            self.unsent.extendleft(reversed(again))

    async def _pump(self, outbox: asyncio.Queue) -> None:
        lock = self.producer._lock
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.stream.stopping:
                return
            while True:
                with lock:
                    if not self.unsent:
                        break
                    batch = self.unsent.popleft()
                    if batch.done:
                        continue
                    self.inflight.append(batch)
                self._request_id += 1
                batch.request.send.request_id = self._request_id
                outbox.put_nowait(batch.request)

    def _on_receipt(self, receipt: topic_pb2.SendReceipt) -> ClientError | None:
        if not self.inflight:
            return ClientError(TopicStatus.INTERNAL,
                               f"broker {self.stream.address} sent receipt {receipt.request_id} for "
                               f"{self.topic} with no Send waiting")
        batch = self.inflight[0]
        if batch.request.send.request_id != receipt.request_id:
            return ClientError(TopicStatus.INTERNAL,
                               f"broker {self.stream.address} sent receipt {receipt.request_id} for "
                               f"{self.topic}, expected {batch.request.send.request_id}")
        with self.producer._lock:
            self.inflight.popleft()
        if batch.done:
            return None  # timed out meanwhile
        n = batch.count
        partition = receipt.partition if receipt.partition >= 0 else self.index
        if receipt.duplicate:
            ids = [MessageId(-1, -1, partition, -1)] * n
        elif n == 1 and receipt.batch_size <= 1:
            ids = [MessageId(receipt.ledger_id, receipt.entry_id, partition, -1)]
        else:
            ledger, entry = receipt.ledger_id, receipt.entry_id
            ids = [MessageId(ledger, entry, partition, i) for i in range(n)]
        self.producer._complete(batch, None, ids)
        return None
