"""bksim's topic client (`bksim.client`): produce to and consume from topics over the brokers' gRPC API
(proto/topic.proto), with Producer and Consumer objects like pulsar-client's Python API.

    from bksim.client import Client, SubscriptionType, InitialPosition

    with Client("127.0.0.1:6650") as client:
        client.create_tenant("acme"); client.create_namespace("acme/orders", retention_ms=-1)
        client.create_topic("persistent://acme/orders/new", partitions=4)
        producer = client.create_producer("persistent://acme/orders/new", producer_name="p1")
        message_id = producer.send(b"hello", key="customer-7")
        consumer = client.subscribe("persistent://acme/orders/new", "billing", SubscriptionType.Shared,
                                    initial_position=InitialPosition.Earliest)
        msg = consumer.receive(timeout_ms=5000)
        consumer.acknowledge(msg)
        reader = client.create_reader("persistent://acme/orders/new", InitialPosition.Earliest)  # non-durable
        msg = reader.read_next(timeout_ms=5000)

A sync facade over an asyncio core running on one background thread per Client (core.py); producer.py and
consumer.py say how batching, sequence ids, routing, permits, acks and reconnects work. Every failure is a
ClientError whose `.status` is a TopicStatus name and `.message` the broker's text.
"""
from bksim.client.client import Client
from bksim.client.consumer import Consumer
from bksim.client.dead_letter import DeadLetterPolicy
from bksim.client.errors import ClientError
from bksim.client.producer import Producer
from bksim.client.reader import Reader
from bksim.client.types import InitialPosition, KeySharedPolicy, Message, MessageId, RoutingMode, SubscriptionType

__all__ = ["Client", "Producer", "Consumer", "Reader", "Message", "MessageId", "SubscriptionType", "InitialPosition",
           "RoutingMode", "ClientError", "DeadLetterPolicy", "KeySharedPolicy"]
