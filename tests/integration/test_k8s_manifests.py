"""The Kubernetes manifests under deploy/k8s, checked without a cluster (none is reachable here).

- Schema: every resource validates against the Kubernetes K8S_VERSION OpenAPI schema with `kubernetes-validate`
  (pinned in the Makefile's PIP_DEV; its schemas ship in the package, so this runs offline) in strict mode, so a
  misspelt or misplaced field fails, not only a wrong type. A mutated copy (tmp_path) shows both failing.
- What the schema cannot know, checked against the code (`manifest_problems`, also shown failing on mutated
  copies): every BKSIM_ variable (env and the ConfigMap) is an option of bksim.model.config, and each container's
  environment, expanded as the kubelet does for a given pod, loads as a valid configuration; the ZooKeeper peers
  line names exactly the StatefulSet's pods by their stable DNS names (<pod>.<headless service>) with the ports
  the headless Service and the containers declare, and each pod's server id (from its host name, as
  deploy/container.py derives it) is its own line; the connect string of every bookie, broker and Job names all
  of those servers at the client port; bookie ids are the pods' stable names; every Service port leads to a
  containerPort of the pods it selects and that is the port the process is configured to listen on; the readiness
  probes probe the process's own role and port; the audit Job mounts every claim the bookie StatefulSet makes,
  read-only; the kustomization lists every manifest but the on-demand audit Job.
"""
from __future__ import annotations

import copy
import glob
import os
import re

import pytest
import yaml
from kubernetes_validate import utils as k8s_validate

from bksim.adapters.zk_client import client_hosts
from bksim.cli import config as cfgload
from bksim.model import config as schema

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S_DIR = os.path.join(REPO, "deploy", "k8s")
DEFAULT_TOML = os.path.join(REPO, "deploy", "bksim.toml")
K8S_VERSION = "1.31.0"  # the Kubernetes release whose schema the manifests must satisfy (gRPC probes: GA in 1.27)
ON_DEMAND = {"audit-job.yaml"}  # created with `kubectl create -f`, not part of `kubectl apply -k`
IN_IMAGE_CONTAINER_PY = "/opt/bksim/deploy/container.py"
WORKLOADS = ("StatefulSet", "Deployment", "Job")
DOWNWARD_API = {"POD_NAME": "metadata.name", "POD_IP": "status.podIP"}


def manifest_files() -> list[str]:
    return sorted(f for f in glob.glob(os.path.join(K8S_DIR, "*.yaml")) if os.path.basename(f) != "kustomization.yaml")


def load_documents(files: list[str]) -> list[dict]:
    docs = []
    for path in files:
        with open(path) as f:
            docs += [dict(d, _file=os.path.basename(path)) for d in yaml.safe_load_all(f) if d]
    return docs


def without_file(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "_file"}


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return load_documents(manifest_files())


# -- the Kubernetes schema ----------------------------------------------------------------------------------------

def test_validator_has_the_version_offline():
    """The pinned package carries the named version's strict schemas (nothing is downloaded)."""
    assert k8s_validate.major_minor(K8S_VERSION) in [k8s_validate.major_minor(v) for v in k8s_validate.all_versions()]


def test_every_manifest_validates_strictly(docs):
    kinds = {(d["kind"], d["_file"]) for d in docs}
    assert {k for k, _ in kinds} >= {"Namespace", "ConfigMap", "Service", "StatefulSet", "Deployment", "Job",
                                     "PodDisruptionBudget"}
    for doc in docs:
        name = doc["metadata"].get("name") or doc["metadata"].get("generateName")
        try:
            version = k8s_validate.validate(without_file(doc), K8S_VERSION, strict=True)
        except k8s_validate.ValidationError as e:
            pytest.fail(f"{doc['_file']} {doc['kind']}/{name}: {'.'.join(map(str, e.path))}: {e.message}")
        assert version == k8s_validate.major_minor(K8S_VERSION)


@pytest.mark.parametrize("mutate,field", [
    (lambda s: s.replace("readinessProbe:", "readinesProbe:", 1), "readinesProbe"),   # unknown field: strict only
    (lambda s: s.replace("replicas: 3", "replicas: three", 1), "three"),              # wrong type
    (lambda s: s.replace("containerPort: 3181", "containerPort: 3181\n              protocl: TCP", 1), "protocl"),
], ids=["unknown-field", "wrong-type", "misplaced-field"])
def test_schema_validation_fails_on_a_broken_manifest(tmp_path, mutate, field):
    with open(os.path.join(K8S_DIR, "bookie.yaml")) as f:
        text = f.read()
    broken = mutate(text)
    assert broken != text
    (tmp_path / "bookie.yaml").write_text(broken)
    (sts,) = [d for d in load_documents([str(tmp_path / "bookie.yaml")]) if d["kind"] == "StatefulSet"]
    with pytest.raises(k8s_validate.ValidationError) as caught:
        k8s_validate.validate(without_file(sts), K8S_VERSION, strict=True)
    assert field in str(caught.value.message)


def test_kustomization_lists_every_manifest_but_the_on_demand_audit_job():
    with open(os.path.join(K8S_DIR, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    assert kustomization["kind"] == "Kustomization"
    names = {os.path.basename(f) for f in manifest_files()}
    assert set(kustomization["resources"]) == names - ON_DEMAND
    assert ON_DEMAND <= names
    assert [i["name"] for i in kustomization.get("images", [])] == ["bksim"], "one image for every role"


# -- what the manifests say, checked against the code -------------------------------------------------------------

def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def workload(docs: list[dict], component: str) -> dict:
    (found,) = [d for d in docs if d["kind"] in WORKLOADS
                and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return found


def containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


def config_map_env(docs: list[dict], container: dict) -> dict[str, str]:
    env = {}
    for source in container.get("envFrom", []):
        (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == source["configMapRef"]["name"]]
        env.update(cm["data"])
    return env


def pod_env(docs: list[dict], container: dict, pod_name: str, pod_ip: str) -> dict[str, str]:
    """The container's environment in pod `pod_name` as the kubelet makes it: envFrom, then env in order, each
    value's $(VAR) expanded from the variables defined before it (Kubernetes' rule)."""
    env = config_map_env(docs, container)
    downward = {"metadata.name": pod_name, "status.podIP": pod_ip}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                      lambda m: env.get(m.group(1), m.group(0)), var["value"])
    return env


def load_config(env: dict[str, str]) -> schema.Config:
    bksim = {k: v for k, v in env.items() if k.startswith(cfgload.ENV_PREFIX) and k != cfgload.CONFIG_ENV}
    assert env.get(cfgload.CONFIG_ENV) == "/opt/bksim/deploy/bksim.toml", "the image's configuration file"
    return cfgload.load(DEFAULT_TOML, env=bksim)


def pods(doc: dict) -> list[str]:
    replicas = doc["spec"].get("replicas", 1) if doc["kind"] == "StatefulSet" else 1
    base = doc["metadata"].get("name") or doc["metadata"]["generateName"].rstrip("-")
    return [f"{base}-{i}" for i in range(replicas)]


def named_port(container: dict, name_or_number) -> int | None:
    for p in container.get("ports", []):
        if name_or_number in (p.get("name"), p["containerPort"]):
            return p["containerPort"]
    return None


def selects(service: dict, doc: dict) -> bool:
    labels = doc["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def manifest_problems(docs: list[dict]) -> list[str]:
    """Everything wrong with the manifests that the Kubernetes schema cannot see; [] when nothing is."""
    from importlib import util

    spec = util.spec_from_file_location("bksim_deploy_container", os.path.join(REPO, "deploy", "container.py"))
    container_py = util.module_from_spec(spec)
    spec.loader.exec_module(container_py)

    problems: list[str] = []
    options = {(s, n) for s, n, _, _ in schema.describe()}

    def check_names(where: str, names) -> None:
        for key in names:
            if key == cfgload.CONFIG_ENV or not key.startswith(cfgload.ENV_PREFIX):
                continue
            section, _, option = key[len(cfgload.ENV_PREFIX):].lower().partition("_")
            if (section, option) not in options:
                problems.append(f"{where}: {key} is not an option of bksim.model.config")

    for cm in of_kind(docs, "ConfigMap"):
        check_names(f"ConfigMap {cm['metadata']['name']}", cm["data"])

    # ZooKeeper: the StatefulSet's pods, by their stable names, are exactly the peers
    zk = workload(docs, "zookeeper")
    zk_hs = [s for s in of_kind(docs, "Service") if s["metadata"]["name"] == zk["spec"]["serviceName"]]
    if not zk_hs or zk_hs[0]["spec"].get("clusterIP") != "None" or not zk_hs[0]["spec"].get("publishNotReadyAddresses"):
        problems.append(f"ZooKeeper's serviceName {zk['spec']['serviceName']} is not a headless Service that "
                        f"publishes not-ready pods")
    zk_port_of = {p["name"]: p["port"] for p in (zk_hs[0]["spec"]["ports"] if zk_hs else [])}
    servers = []
    for i, pod in enumerate(pods(zk)):
        (c,) = containers(zk)
        config = load_config(pod_env(docs, c, pod, f"10.0.1.{i}")).zookeeper
        peers = schema.parse_peers(config.peers) if config.peers else []
        want = [(f"{p}.{zk['spec']['serviceName']}", zk_port_of.get("quorum"), zk_port_of.get("election"))
                for p in pods(zk)]
        if peers != want:
            problems.append(f"{pod}: zookeeper.peers {peers} is not the StatefulSet's pods {want}")
        try:
            server_id, _ = container_py.ensemble(config, pod)
        except SystemExit as e:  # what container.py would exit with in that pod
            server_id = str(e)
        if server_id != i + 1:
            problems.append(f"{pod}: server id {server_id}, not {i + 1}")
        for name, port in (("client", config.port), ("quorum", peers[i][1] if i < len(peers) else None),
                           ("election", peers[i][2] if i < len(peers) else None)):
            if named_port(c, name) != port:
                problems.append(f"{pod}: containerPort {name} {named_port(c, name)} is not the configured {port}")
        if config.port != zk_port_of.get("client"):
            problems.append(f"{pod}: client port {config.port}, the headless Service says {zk_port_of.get('client')}")
        servers.append(f"{pod}.{zk['spec']['serviceName']}:{config.port}")

    # every container: options exist, the environment loads, the connect string names every server
    for doc in (d for d in docs if d["kind"] in WORKLOADS):
        for c in containers(doc):
            where = f"{doc['_file']} {doc['kind']} {c['name']}"
            check_names(where, [v["name"] for v in c.get("env", [])])
            for var in c.get("env", []):
                if not var["name"].startswith(cfgload.ENV_PREFIX) and \
                        var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != DOWNWARD_API.get(var["name"]):
                    problems.append(f"{where}: {var['name']} is neither a bksim option nor {DOWNWARD_API}")
            for i, pod in enumerate(pods(doc)):
                config = load_config(pod_env(docs, c, pod, f"10.0.2.{i}"))
                hosts = sorted(f"{h}:{p}" for h, p in schema.parse_connect(client_hosts(config)))
                if hosts != sorted(servers):
                    problems.append(f"{where} ({pod}): connect string names {hosts}, not the servers {servers}")

    # bookies: stable ids, data on the claim templates
    bookie = workload(docs, "bookie")
    (bc,) = containers(bookie)
    mounts = {m["mountPath"]: m["name"] for m in bc.get("volumeMounts", [])}
    templates = [t["metadata"]["name"] for t in bookie["spec"].get("volumeClaimTemplates", [])]
    for i, pod in enumerate(pods(bookie)):
        b = load_config(pod_env(docs, bc, pod, f"10.0.3.{i}")).bookie
        if b.host != f"{pod}.{bookie['spec']['serviceName']}" or (b.bookie_id or f"{b.host}:{b.port}") != \
                f"{pod}.{bookie['spec']['serviceName']}:{b.port}":
            problems.append(f"{pod}: bookie id {b.bookie_id or b.host + ':' + str(b.port)} is not its stable name")
        for what, path in (("journal", b.journal_dir), ("ledgers", b.ledger_dir)):
            on = [name for mount, name in mounts.items() if path.startswith(mount + "/")]
            if not on or on[0] not in templates:
                problems.append(f"{pod}: {what} dir {path} is not below a volumeClaimTemplate's mount")

    # Services lead to the port each process is configured to listen on
    for service in of_kind(docs, "Service"):
        targets = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment") and selects(service, d)]
        if len(targets) != 1:
            problems.append(f"Service {service['metadata']['name']} selects {len(targets)} workloads")
            continue
        (c,) = containers(targets[0])
        config = load_config(pod_env(docs, c, pods(targets[0])[0], "10.0.4.1"))
        role = targets[0]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        listens = {"zookeeper": {"client": config.zookeeper.port},
                   "bookie": {"grpc": config.bookie.port, "http": config.bookie.http_port},
                   "broker": {"grpc": config.broker.port, "http": config.broker.http_port}}[role]
        for port in service["spec"]["ports"]:
            container_port = named_port(c, port.get("targetPort", port["port"]))
            if container_port is None:
                problems.append(f"Service {service['metadata']['name']} port {port['name']}: no such containerPort")
            elif port["name"] in listens and listens[port["name"]] != container_port:
                problems.append(f"Service {service['metadata']['name']} port {port['name']} leads to {container_port}, "
                                f"the {role} listens on {listens[port['name']]}")

    # readiness probes probe the process's own role and port
    for role in ("zookeeper", "bookie"):
        (c,) = containers(workload(docs, role))
        want = ["python", IN_IMAGE_CONTAINER_PY, "health", role]
        if c.get("readinessProbe", {}).get("exec", {}).get("command") != want:
            problems.append(f"{role}: readiness probe is not {' '.join(want)}")
    broker = workload(docs, "broker")
    (rc,) = containers(broker)
    broker_port = load_config(pod_env(docs, rc, "broker-0", "10.0.5.1")).broker.port
    if rc.get("readinessProbe", {}).get("grpc", {}).get("port") != broker_port:
        problems.append(f"broker: readiness is not a gRPC health probe on its port {broker_port}")

    # the audit Job reads every claim the bookies' StatefulSet makes, read-only
    audit = workload(docs, "audit")
    claims = {v["persistentVolumeClaim"]["claimName"]: v for v in audit["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    want = {f"{t}-{pod}" for t in templates for pod in pods(bookie)}
    if set(claims) != want:
        problems.append(f"audit Job mounts claims {sorted(claims)}, the bookies have {sorted(want)}")
    (ac,) = containers(audit)
    by_volume = {m["name"]: m for m in ac["volumeMounts"]}
    script = " ".join(ac["command"])
    for claim, volume in claims.items():
        mount = by_volume.get(volume["name"], {})
        if not (volume["persistentVolumeClaim"].get("readOnly") and mount.get("readOnly")):
            problems.append(f"audit Job: claim {claim} is not mounted read-only")
        if mount.get("mountPath", "?") not in script:
            problems.append(f"audit Job: {claim} (at {mount.get('mountPath')}) is not read by the command")
    if '--zookeeper "$BKSIM_ZOOKEEPER_CONNECT"' not in script:
        problems.append("audit Job: the metadata is not read through the connect string")
    return problems


def test_manifests_agree_with_the_configuration_schema_and_each_other(docs):
    assert manifest_problems(docs) == []


def _mutated(docs: list[dict], kind: str, name: str, fn) -> list[dict]:
    out = copy.deepcopy(docs)
    (doc,) = [d for d in out if d["kind"] == kind and d["metadata"].get("name") == name]
    fn(doc)
    return out


def _env(doc: dict, name: str) -> dict:
    (var,) = [v for c in containers(doc) for v in c.get("env", []) if v["name"] == name]
    return var


def _set_port(doc: dict, name: str, value: int) -> None:
    for p in doc["spec"]["ports"]:
        if p["name"] == name:
            p["port"] = value


@pytest.mark.parametrize("kind,name,fn,expected", [
    ("StatefulSet", "zk", lambda d: d["spec"].update(replicas=5), "is not the StatefulSet's pods"),
    ("StatefulSet", "zk", lambda d: _env(d, "BKSIM_ZOOKEEPER_PEERS").update(
        value="zk-0.zk-hs:2888:3888,zk-1.zk-hs:2888:3888,zk-2.zk-hs:2889:3888"), "is not the StatefulSet's pods"),
    ("ConfigMap", "bksim-env", lambda d: d["data"].update(BKSIM_ZOOKEEPER_CONNECT="zk-cs:2181"),
     "connect string names ['zk-cs:2181']"),
    ("ConfigMap", "bksim-env", lambda d: d["data"].update(BKSIM_ZOOKEPER_CONNECT="x:1"), "is not an option"),
    ("StatefulSet", "bookie", lambda d: _env(d, "BKSIM_BOOKIE_HOST").update(value="$(POD_IP)"),
     "is not its stable name"),
    ("StatefulSet", "bookie", lambda d: _env(d, "BKSIM_BOOKIE_JOURNAL_DIR").update(value="/tmp/journal"),
     "journal dir /tmp/journal is not below"),
    ("Service", "broker", lambda d: _set_port(d, "grpc", 6651) or d["spec"]["ports"][0].update(targetPort=6651),
     "no such containerPort"),
    ("Deployment", "broker", lambda d: containers(d)[0]["readinessProbe"]["grpc"].update(port=6651),
     "readiness is not a gRPC health probe"),
    ("StatefulSet", "bookie", lambda d: d["spec"].update(replicas=4), "audit Job mounts claims"),
])
def test_manifest_checks_fail_on_a_broken_copy(docs, kind, name, fn, expected):
    found = manifest_problems(_mutated(docs, kind, name, fn))
    assert any(expected in p for p in found), found
