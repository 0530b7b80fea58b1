"""The ZooKeeper ensemble options: the connect string clients derive, and what validation refuses."""
import dataclasses

import pytest

from bksim.adapters.zk_client import client_hosts
from bksim.model.config import ClusterConfig, Config, ZooKeeperConfig, parse_connect, parse_peers
from bksim.model.errors import ConfigError


def config(zookeepers: int = 1, **zk) -> Config:
    return Config(cluster=ClusterConfig(zookeepers=zookeepers), zookeeper=ZooKeeperConfig(**zk))


def test_one_server_is_host_and_port():
    assert client_hosts(config(port=2190)) == "127.0.0.1:2190"


def test_an_ensemble_names_every_server_on_consecutive_ports():
    assert client_hosts(config(3, port=2190)) == "127.0.0.1:2190,127.0.0.1:2191,127.0.0.1:2192"


def test_an_explicit_connect_string_wins():
    c = config(3, connect="zk-0.zk:2181,zk-1.zk:2181")
    assert client_hosts(c) == "zk-0.zk:2181,zk-1.zk:2181"
    assert parse_connect(c.zookeeper.connect) == [("zk-0.zk", 2181), ("zk-1.zk", 2181)]


@pytest.mark.parametrize("connect", ["zk", "zk:", ":2181", "zk:2181,", "zk:70000", "zk:2181/chroot"])
def test_a_malformed_connect_string_is_refused_naming_the_item(connect):
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        config(connect=connect).validate()


@pytest.mark.parametrize("zookeepers", [0, 8])
def test_ensemble_size_is_bounded(zookeepers):
    with pytest.raises(ConfigError, match="cluster.zookeepers"):
        config(zookeepers).validate()


def test_ports_of_the_last_server_must_exist():
    with pytest.raises(ConfigError, match="quorum_port_base"):
        config(3, quorum_port_base=65534).validate()
    assert dataclasses.replace(config(3), zookeeper=ZooKeeperConfig(quorum_port_base=65533)).validate()


def test_peers_parse_in_server_order():
    c = config(peers="zk-0.zk:2888:3888,zk-1.zk:2888:3888,zk-2.zk:2888:3888", server_id=2).validate()
    assert parse_peers(c.zookeeper.peers)[1] == ("zk-1.zk", 2888, 3888)


@pytest.mark.parametrize("peers, server_id, message", [
    ("zk-0:2888", 0, "is not HOST:QUORUM_PORT:ELECTION_PORT"),
    ("zk-0:2888:3888,zk-1:2888:0", 0, "is not HOST:QUORUM_PORT:ELECTION_PORT"),
    ("zk-0:2888:3888", 2, "server_id"),
    ("", 1, "server_id needs zookeeper.peers"),
])
def test_bad_peers_are_refused(peers, server_id, message):
    with pytest.raises(ConfigError, match=message):
        config(peers=peers, server_id=server_id).validate()
