"""The Helm chart deploy/helm/weir (issue 15), checked without a Kubernetes cluster.

Tools (tests/requirements.txt, installed into .venv by tests/setup.sh; a missing tool fails these
tests, it never skips them):
  * helm-python-sdk: Helm's own Go SDK (v4.2.3) built as a C library inside the wheel, called
    through ctypes. It lints the chart and renders it as `helm lint` / `helm template` do,
    values.schema.json included. No helm binary can be installed here (no get.helm.sh, no
    Debian package), so this is the Helm available.
  * kubernetes-validate: the Kubernetes OpenAPI schemas of each version as JSON, bundled in the
    wheel. Every rendered object is validated in strict mode (unknown fields are errors) against
    the oldest version the chart supports (Chart.yaml kubeVersion) and the newest bundled one.
  * cloudcoil.models.prometheus_operator: models generated from the prometheus-operator CRDs
    (v0.80.1); the ServiceMonitor must validate and survive a round trip unchanged (a field the
    CRD does not know would be dropped).

What the rendering must mean is checked against Weir itself: the agent's flags against
`weir agent --help` of $WEIR_BIN, the ConfigMap's TOML against config/weir.toml, and finally the
rendered pod command is run for real: two zones' Deployments, each "pod" started with the
chart's command, args, environment and ConfigMap (pod IPs 127.0.0.1 and 127.0.0.2, file://
buckets), must form one cluster whose agents report the node ids derived from their IPs, their
zones and their own addresses, answer /healthz and /readyz, and carry records between them.

What cannot be checked here: an install into a real cluster (scheduling, the kubelet's probes,
DNS, workload identity, the prometheus-operator picking the ServiceMonitor up)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from confluent_kafka import KafkaException

from conftest import _PDEATHSIG_PREFIX, REPO_ROOT, pick_free_port
from weirtest import (Rec, assert_acked_present, ck_admin, ck_consume, ck_create_topics,
                      ck_produce, unique, wait_until)

try:
    import helm_python
    from kubernetes_validate import utils as kube_validate
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor
    TOOLS_ERROR = None
except ImportError as exc:  # reported by the `tools` fixture: a failure, not a skip
    TOOLS_ERROR = exc

CHART = REPO_ROOT / "deploy" / "helm" / "weir"
CONFIG_REFERENCE = REPO_ROOT / "config" / "weir.toml"
RELEASE = "demo"
NAMESPACE = "streaming"
AGENT_LABELS = {"app.kubernetes.io/name": "weir", "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/component": "agent"}
# Flags the pod's start command adds to those in `args`.
SCRIPT_FLAGS = {"--node-id"}
# Read by the binary outside clap (main.rs: the log filter).
EXTRA_ENV = {"WEIR_LOG"}

# Three zones, one of them with its own replica count and agent zone, cloud buckets, monitoring
# and a network policy: what a production install looks like.
MULTI_ZONE = {
    "replicaCount": 2,
    "zones": [
        {"name": "us-east-1a", "agentZone": "use1-az4", "replicas": 3},
        {"name": "us-east-1b", "agentZone": "use1-az6"},
        {"name": "us-east-1c"},
    ],
    "config": {
        "storage": {
            "ingest_buckets": ["s3://weir-a--use1-az4--x-s3", "s3://weir-b--use1-az6--x-s3",
                               "s3://weir-c--use1-az1--x-s3"],
            "quorum": 2,
            "metadata_bucket": "s3://weir-meta",
            "compacted_bucket": "s3://weir-compacted",
            "options": {"region": "us-east-1"},
            "bucket_options": {
                "s3://weir-meta": {"endpoint": "https://s3.us-east-1.amazonaws.com"}},
            "read_hedge_after": "300ms",
            "error_rate": 0.0,
        },
        "produce": {"flush_interval": "20ms", "max_file_bytes": 16777216,
                    "init_producer_id_rate": 2.5},
        "kafka": {"num_partitions": 6, "max_inflight_request_bytes": 1073741824,
                  "auto_create_topics": False},
        "retention": {"default_ms": -1},
        "cluster": {"lease_renew": "1s"},
    },
    "metrics": {"serviceMonitor": {"enabled": True,
                                   "labels": {"release": "kube-prometheus-stack"}}},
    "serviceAccount": {"annotations": {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/weir"}},
    "credentials": {"existingSecret": "weir-buckets"},
    "networkPolicy": {"enabled": True},
    "env": [{"name": "AWS_REGION", "value": "us-east-1"}],
}
VALUE_SETS = {"default": {}, "multi-zone": MULTI_ZONE}


# ------------------------------------------------------------------------------------ helpers

@pytest.fixture(scope="module")
def tools():
    if TOOLS_ERROR is not None:
        pytest.fail(f"the chart tools are not installed ({TOOLS_ERROR}); run tests/setup.sh "
                    f"(tests/requirements.txt: helm-python-sdk, kubernetes-validate, "
                    f"cloudcoil.models.prometheus_operator)", pytrace=False)
    return helm_python


def render(values: dict) -> tuple[list[dict], str]:
    """`helm template demo deploy/helm/weir -n streaming` with `values`: (objects, NOTES.txt)."""
    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    notes = files.pop("weir/templates/NOTES.txt", "")
    objects = [doc for text in files.values() for doc in yaml.safe_load_all(text) if doc]
    return objects, notes


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def agent_container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def flag_value(args: list[str], flag: str) -> str | None:
    values = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]
    assert len(values) <= 1, f"{flag} given twice: {args}"
    return values[0] if values else None


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def config_toml(objects: list[dict]) -> dict:
    configmap = one(objects, "ConfigMap")
    return tomllib.loads(configmap["data"]["weir.toml"])


def kube_versions() -> list[str]:
    """The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest whose
    schemas kubernetes-validate bundles."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    oldest = re.match(r">=\s*(\d+\.\d+)", chart["kubeVersion"]).group(1) + ".0"
    return [oldest, kube_validate.latest_version()]


def help_flags_and_env(weir_bin: Path) -> tuple[set[str], set[str]]:
    out = subprocess.run([str(weir_bin), "agent", "--help"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return set(re.findall(r"--[a-z0-9][a-z0-9-]*", out)), set(re.findall(r"env: (WEIR_\w+)", out))


def posix_cksum(data: bytes) -> int:
    """POSIX `cksum`: CRC-32 (poly 0x04C11DB7, MSB first) over the data and its length."""
    crc = 0

    def feed(byte: int) -> None:
        nonlocal crc
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF

    for byte in data:
        feed(byte)
    length = len(data)
    while length:
        feed(length & 0xFF)
        length >>= 8
    return crc ^ 0xFFFFFFFF


def expected_node_id(ip: str) -> int:
    if ":" in ip:
        return posix_cksum(ip.encode()) % 2**31
    a, b, c, d = (int(part) for part in ip.split("."))
    return ((a << 24) | (b << 16) | (c << 8) | d) % 2**31


# ------------------------------------------------------------------------------ lint, schemas

@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_is_clean(tools, name):
    report = tools.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE)
    findings = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not findings, report
    # The one finding left is informational (no icon: there is none to point at).
    assert {m["error"] for m in report["messages"]} <= {"icon is recommended"}, report


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_manifests_validate_against_kubernetes_schemas(tools, name):
    objects, _ = render(VALUE_SETS[name])
    validated = set()
    for version in kube_versions():
        for obj in objects:
            if obj["apiVersion"] == "monitoring.coreos.com/v1":
                continue  # a CRD: below
            try:
                kube_validate.validate(obj, version, strict=True)
            except kube_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} is not a valid Kubernetes "
                            f"{version} object at {path}: {e.message}")
            validated.add(obj["kind"])
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget",
            "ServiceAccount"} <= validated
    for obj in of_kind(objects, "ServiceMonitor"):
        model = ServiceMonitor.model_validate(obj)
        assert model.model_dump(mode="json", by_alias=True, exclude_none=True) == obj, \
            "the ServiceMonitor has fields prometheus-operator's CRD does not define"


def test_helm_schema_validator_rejects_a_broken_manifest(tools):
    """The validator is live: a misspelt field and a wrong type are reported."""
    objects, _ = render({})
    deployment = one(objects, "Deployment")
    version = kube_versions()[-1]
    kube_validate.validate(deployment, version, strict=True)
    misspelt = yaml.safe_load(yaml.safe_dump(deployment))
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kube_validate.ValidationError):
        kube_validate.validate(misspelt, version, strict=True)
    wrong_type = yaml.safe_load(yaml.safe_dump(deployment))
    wrong_type["spec"]["replicas"] = "three"
    with pytest.raises(kube_validate.ValidationError):
        kube_validate.validate(wrong_type, version, strict=True)
    monitor = one(render(MULTI_ZONE)[0], "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["scrapeInterval"] = "30s"  # the CRD calls it interval
    model = ServiceMonitor.model_validate(monitor)
    assert model.model_dump(mode="json", by_alias=True, exclude_none=True) != monitor


@pytest.mark.parametrize("values, message", [
    ({"replicaCount": 2}, "more than one agent needs shared buckets"),
    ({"config": {"agent": {"node_id": 7}}}, "config.agent.node_id is set by the chart"),
    ({"config": {"cluster": {"control_listen": "0.0.0.0:1"}}}, "cluster.control_listen"),
    ({"zones": [{"name": "zone-a"}, {"name": "zone-a"}],
      "config": {"storage": {"ingest_buckets": ["s3://a"]}}}, "listed twice"),
    ({"cluster": {"enabled": False}, "replicaCount": 2,
      "config": {"storage": {"ingest_buckets": ["s3://a"]}}}, "must run as a cluster"),
    ({"log": {"format": "xml"}}, "/log/format"),
    ({"replicas": 3}, "additional properties 'replicas' not allowed"),
])
def test_helm_refuses_unsound_values(tools, values, message):
    with pytest.raises(tools.HelmError) as caught:
        render(values)
    assert message in str(caught.value)


# ------------------------------------------------------------------------------- semantics

def test_helm_default_is_one_agent_without_cluster(tools):
    objects, notes = render({})
    assert not of_kind(objects, "StatefulSet")
    deployment = one(objects, "Deployment", f"{RELEASE}-weir")
    assert deployment["spec"]["replicas"] == 1
    # Two single agents on one metadata log must never overlap, even during a rollout.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    args = agent_container(deployment)["args"]
    assert flag_value(args, "--control-listen") is None and flag_value(args, "--zone") is None
    assert not of_kind(objects, "ServiceMonitor") and not of_kind(objects, "NetworkPolicy")
    assert config_toml(objects) == {}
    assert "WARNING: no buckets are configured" in notes
    assert f"{RELEASE}-weir.{NAMESPACE}.svc:9092" in notes


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_pods_are_stateless_non_root_agents(tools, name):
    objects, _ = render(VALUE_SETS[name])
    assert not of_kind(objects, "StatefulSet") and not of_kind(objects, "PersistentVolumeClaim")
    for deployment in of_kind(objects, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        container = agent_container(deployment)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert pod["automountServiceAccountToken"] is False
        # Every path the agent may write is a volume: its data dir (file:// buckets) and /tmp.
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert flag_value(container["args"], "--data-dir") in mounts
        assert "/tmp" in mounts
        assert mounts["/etc/weir"]["readOnly"] is True
        env = {e["name"]: e for e in container["env"]}
        assert env["WEIR_CONFIG"]["value"] == "/etc/weir/weir.toml"
        assert env["MALLOC_ARENA_MAX"]["value"] == "2"
        configmap = one(objects, "ConfigMap")
        volumes = {v["name"]: v for v in pod["volumes"]}
        config_volume = volumes[mounts["/etc/weir"]["name"]]
        assert config_volume["configMap"]["name"] == configmap["metadata"]["name"]
        assert "weir.toml" in configmap["data"]
        assert container["image"] == "weir:0.1.0"
        assert container["resources"]["limits"]["memory"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_probes_use_healthz_and_readyz_on_the_http_port(tools, name):
    objects, _ = render(VALUE_SETS[name])
    for deployment in of_kind(objects, "Deployment"):
        container = agent_container(deployment)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["http"] == 9644 and ports["kafka"] == 9092
        assert flag_value(container["args"], "--http-listen") == "0.0.0.0:9644"
        assert flag_value(container["args"], "--listen") == "0.0.0.0:9092"
        for probe, path in [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                            ("readinessProbe", "/readyz")]:
            assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_each_pod_advertises_its_own_ip(tools, name):
    objects, _ = render(VALUE_SETS[name])
    for deployment in of_kind(objects, "Deployment"):
        container = agent_container(deployment)
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert flag_value(container["args"], "--advertised-host") == "$(POD_IP)"
        # Peers reach the control service at the advertised host too: no override.
        assert flag_value(container["args"], "--control-advertise") is None
        # The node id is computed from the same variable by the start command.
        assert container["command"][:2] == ["/bin/sh", "-c"]
        assert "POD_IP" in container["command"][2]
        assert 'exec weir agent --node-id "$id" "$@"' in container["command"][2]


def test_helm_multi_zone_gives_each_zone_a_deployment_and_its_zone(tools):
    objects, notes = render(MULTI_ZONE)
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    expected = {  # name -> (node zone label, agent zone, replicas)
        f"{RELEASE}-weir-us-east-1a": ("us-east-1a", "use1-az4", 3),
        f"{RELEASE}-weir-us-east-1b": ("us-east-1b", "use1-az6", 2),
        f"{RELEASE}-weir-us-east-1c": ("us-east-1c", "us-east-1c", 2),
    }
    assert set(deployments) == set(expected)
    selectors = []
    for name, (zone, agent_zone, replicas) in expected.items():
        deployment = deployments[name]
        pod = deployment["spec"]["template"]["spec"]
        args = agent_container(deployment)["args"]
        assert deployment["spec"]["replicas"] == replicas
        assert pod["nodeSelector"] == {"topology.kubernetes.io/zone": zone}
        assert flag_value(args, "--zone") == agent_zone
        assert flag_value(args, "--control-listen") == "0.0.0.0:9093"
        assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1,
                                                                   "maxUnavailable": 0}
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selects(selector, deployment["spec"]["template"]["metadata"]["labels"])
        selectors.append(selector)
        # Pinned to one zone, a zone spread would be meaningless: only the node spread is left.
        spread = pod["topologySpreadConstraints"]
        assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname"]
        assert selects(spread[0]["labelSelector"]["matchLabels"],
                       deployment["spec"]["template"]["metadata"]["labels"])
        assert {"name": "control", "containerPort": 9093, "protocol": "TCP"} in \
            agent_container(deployment)["ports"]
        env_from = agent_container(deployment)["envFrom"]
        assert {"secretRef": {"name": "weir-buckets"}} in env_from
    # No Deployment's selector matches another one's pods.
    for i, selector in enumerate(selectors):
        for j, other in enumerate(deployments.values()):
            if i != j:
                assert not selects(selector, other["spec"]["template"]["metadata"]["labels"])
    assert "running as one cluster" in notes
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c"):
        assert f"in zone {zone}" in notes


def test_helm_without_zones_spreads_over_zones_and_nodes(tools):
    values = {"replicaCount": 3, "config": {"storage": {"ingest_buckets": ["gs://weir-a"]}}}
    objects, _ = render(values)
    deployment = one(objects, "Deployment")
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["topology.kubernetes.io/zone",
                                                  "kubernetes.io/hostname"]
    assert all(c["matchLabelKeys"] == ["pod-template-hash"] for c in spread)
    assert flag_value(agent_container(deployment)["args"], "--control-listen") == "0.0.0.0:9093"
    assert "nodeSelector" not in deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_services_budget_and_monitor_select_the_agents(tools, name):
    objects, _ = render(VALUE_SETS[name])
    pod_labels = [d["spec"]["template"]["metadata"]["labels"]
                  for d in of_kind(objects, "Deployment")]
    cluster = name != "default"
    bootstrap = one(objects, "Service", f"{RELEASE}-weir")
    headless = one(objects, "Service", f"{RELEASE}-weir-agents")
    for service in (bootstrap, headless):
        assert all(selects(service["spec"]["selector"], labels) for labels in pod_labels)
    # Kafka only: the HTTP port (metrics, status page) stays off a possibly public Service.
    assert {(p["name"], p["port"], p["targetPort"]) for p in bootstrap["spec"]["ports"]} == \
        {("kafka", 9092, "kafka")}
    assert ("http", 9644) in {(p["name"], p["port"]) for p in headless["spec"]["ports"]}
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    headless_ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    assert headless_ports.get("control") == (9093 if cluster else None)
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert all(selects(pdb["spec"]["selector"]["matchLabels"], labels) for labels in pod_labels)
    monitors = of_kind(objects, "ServiceMonitor")
    assert len(monitors) == (1 if cluster else 0)
    for monitor in monitors:
        matched = [s for s in of_kind(objects, "Service")
                   if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert matched == [headless], "the ServiceMonitor must scrape every agent, ready or not"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        assert monitor["spec"]["endpoints"][0]["port"] == "http"
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for policy in of_kind(objects, "NetworkPolicy"):
        control = [rule for rule in policy["spec"]["ingress"]
                   if rule["ports"][0]["port"] == "control"]
        assert control and control[0]["from"] == [{"podSelector": {"matchLabels": AGENT_LABELS}}]
    account = one(objects, "ServiceAccount")
    if cluster:
        assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert all(d["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
               for d in of_kind(objects, "Deployment"))


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_config_is_toml_with_known_keys_only(tools, name):
    values = VALUE_SETS[name]
    objects, _ = render(values)
    rendered = config_toml(objects)
    reference = tomllib.loads(CONFIG_REFERENCE.read_text())
    for section, table in rendered.items():
        assert section in reference, f"[{section}] is not a section of config/weir.toml"
        for key in table:
            assert key in reference[section], f"{section}.{key} is not in config/weir.toml"
    # What was asked for arrives with the same value (integers stay integers: Helm reads every
    # number of a values file as a float, and a usize setting refuses 2.0).
    assert rendered == values.get("config", {})
    if name == "multi-zone":
        assert isinstance(rendered["storage"]["quorum"], int)
        assert isinstance(rendered["kafka"]["max_inflight_request_bytes"], int)
        assert rendered["produce"]["init_producer_id_rate"] == 2.5


def test_helm_config_strings_numbers_and_tables_survive_toml(tools):
    config = {
        "agent": {"failpoints": 'a "quoted" <&> \\ back\\slash, é, tab\tnewline\n'},
        "storage": {"ingest_buckets": ["s3://a/prefix?endpoint=http://x:9000&allow_http=true"],
                    "bucket_options": {"s3://a/prefix": {"allow_http": "true"}},
                    "options": {}, "error_rate": 0.25, "cache_bytes": 4294967296,
                    "pool": {"target_ready": 4, "load_concurrency": 2, "max_item_age": "1m"}},
        "retention": {"default_bytes": -1},
        "compaction": {"enabled": False},
    }
    assert config_toml(render({"config": config})[0]) == config


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_agent_flags_and_env_are_known_to_the_binary(tools, weir_bin, name):
    objects, _ = render(VALUE_SETS[name])
    flags, clap_env = help_flags_and_env(weir_bin)
    reference = tomllib.loads(CONFIG_REFERENCE.read_text())
    config_env = {f"WEIR_{section}_{key}".upper()
                  for section, table in reference.items() for key in table}
    for deployment in of_kind(objects, "Deployment"):
        container = agent_container(deployment)
        used = {arg for arg in container["args"] if arg.startswith("--")} | SCRIPT_FLAGS
        unknown = used - flags
        assert not unknown, f"`weir agent --help` has no {sorted(unknown)}"
        names = {e["name"] for e in container["env"] if e["name"].startswith("WEIR_")}
        unknown_env = names - clap_env - config_env - EXTRA_ENV
        assert not unknown_env, f"the agent reads no {sorted(unknown_env)}"


# ------------------------------------------------------------------ the pod command, for real

def run_start_command(container: dict, env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(_PDEATHSIG_PREFIX + container["command"] + container["args"],
                            env=env, cwd=cwd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("ip", ["10.1.2.3", "192.168.0.1", "255.255.255.255", "100.64.0.10",
                                "fd00:10:244:1::a", "2001:db8::1"])
def test_helm_start_command_derives_the_node_id_from_the_pod_ip(tools, tmp_path, ip):
    """The start command under /bin/sh (dash, as in the bookworm-slim image) with a stand-in
    `weir` that records its arguments."""
    objects, _ = render({})
    container = agent_container(one(objects, "Deployment"))
    fake = tmp_path / "bin" / "weir"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    fake.chmod(0o755)
    out = tmp_path / "args"
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "POD_IP": ip, "ARGS_OUT": str(out)}
    done = subprocess.run(container["command"] + ["--listen", "x"], env=env, timeout=30,
                          capture_output=True)
    assert done.returncode == 0, done.stderr
    argv = out.read_text().splitlines()
    assert argv[:2] == ["agent", "--node-id"] and argv[3:] == ["--listen", "x"]
    node_id = int(argv[2])
    assert node_id == expected_node_id(ip) and 0 <= node_id < 2**31
    missing = subprocess.run(container["command"], env={"PATH": env["PATH"]}, timeout=30,
                             capture_output=True)
    assert missing.returncode != 0 and b"POD_IP is not set" in missing.stderr


def http_get(url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_helm_pods_run_as_one_cluster(tools, weir_bin, tmp_path):
    """Two zones' Deployments, one pod each, started the way the kubelet would start them: the
    chart's command and args ($(VAR) expanded from the pod's env), its env (downward API:
    status.podIP, metadata.name), its ConfigMap at WEIR_CONFIG and its data dir. The pods'
    network namespaces become loopback addresses: pod IP 127.0.0.1 and 127.0.0.2, each agent
    binding its listeners on its own IP (the chart binds 0.0.0.0 with fixed ports, which two
    processes on one host cannot share). Buckets are file:// directories."""
    buckets = tmp_path / "buckets"
    values = {
        "zones": [{"name": "zone-a", "replicas": 1},
                  {"name": "zone-b", "agentZone": "b", "replicas": 1}],
        "config": {
            "storage": {"ingest_buckets": [f"file://{buckets}/ingest-{i}" for i in range(3)],
                        "quorum": 2,
                        "metadata_bucket": f"file://{buckets}/meta",
                        "compacted_bucket": f"file://{buckets}/compacted"},
            "produce": {"flush_interval": "5ms"},
            # Short leases: the second agent registers within seconds.
            "cluster": {"lease_renew": "200ms", "lease_timeout": "2s", "forward_timeout": "3s",
                        "agent_timeout": "2s"},
        },
    }
    objects, _ = render(values)
    weir_toml = tmp_path / "etc-weir" / "weir.toml"
    weir_toml.parent.mkdir()
    weir_toml.write_text(one(objects, "ConfigMap")["data"]["weir.toml"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "weir").symlink_to(weir_bin)

    pods = []  # (ip, zone, kafka port, http port, process, log)
    deployments = sorted(of_kind(objects, "Deployment"), key=lambda d: d["metadata"]["name"])
    assert len(deployments) == 2
    try:
        for index, deployment in enumerate(deployments):
            ip = f"127.0.0.{index + 1}"
            container = dict(agent_container(deployment))
            pod_name = f"{deployment['metadata']['name']}-7d9f8-x{index}"
            env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RUST_LOG": "info"}
            for var in container["env"]:
                if "value" in var:
                    value = var["value"]
                else:
                    value = {"status.podIP": ip, "metadata.name": pod_name}[
                        var["valueFrom"]["fieldRef"]["fieldPath"]]
                env[var["name"]] = value
            assert env["WEIR_CONFIG"] == "/etc/weir/weir.toml"
            env["WEIR_CONFIG"] = str(weir_toml)  # the ConfigMap's mount
            args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
                    for arg in container["args"]]
            ports = {}
            for flag in ("--listen", "--http-listen", "--control-listen"):
                position = args.index(flag) + 1
                assert args[position].startswith("0.0.0.0:")
                ports[flag] = pick_free_port()
                args[position] = f"{ip}:{ports[flag]}"
            data_dir = tmp_path / f"pod{index}-data"  # the data volume
            data_dir.mkdir()
            args[args.index("--data-dir") + 1] = str(data_dir)
            container["args"] = args
            zone = flag_value(args, "--zone")
            log = tmp_path / f"pod{index}.log"
            process = run_start_command(container, env, data_dir, log)
            pods.append((ip, zone, ports["--listen"], ports["--http-listen"], process, log))

        def logs() -> str:
            return "\n".join(f"--- pod {ip} ({log}):\n{log.read_text()[-6000:]}"
                             for ip, _, _, _, _, log in pods)

        def all_up() -> bool:
            for _, _, _, _, process, _ in pods:
                assert process.poll() is None, f"an agent exited:\n{logs()}"
            return all(port_open(ip, port) for ip, _, port, _, _, _ in pods)

        wait_until(all_up, 60, "both agents listening for Kafka clients")
        want = {expected_node_id(ip): (ip, port, zone) for ip, zone, port, _, _, _ in pods}
        assert want == {2130706433: ("127.0.0.1", pods[0][2], "zone-a"),
                        2130706434: ("127.0.0.2", pods[1][2], "b")}
        for ip, _, port, _, _, _ in pods:
            admin = ck_admin(f"{ip}:{port}")
            seen = {}

            def listed() -> bool:
                try:
                    nodes = admin.describe_cluster(request_timeout=10).result(timeout=20).nodes
                except KafkaException as e:  # not answering yet: asked again
                    seen.update(error=str(e))
                    return False
                seen.update(nodes={n.id: (n.host, n.port, n.rack) for n in nodes})
                return seen["nodes"] == want

            try:
                wait_until(listed, 60, f"DescribeCluster at {ip} listing both agents")
            except AssertionError:
                raise AssertionError(f"{ip} lists {seen}, want {want}\n{logs()}") from None
        for ip, _, _, http_port, _, _ in pods:
            base = f"http://{ip}:{http_port}"
            assert http_get(f"{base}/healthz")[0] == 200, logs()
            wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, 60, f"{base}/readyz")
        topic = unique("helm")
        first, second = (f"{ip}:{port}" for ip, _, port, _, _, _ in pods)
        ck_create_topics(first, {topic: 2})
        acked = ck_produce(second, [Rec(topic, i % 2, f"k{i}".encode(), f"v{i}".encode())
                                    for i in range(20)])
        assert_acked_present(acked, ck_consume(first, topic, [0, 1]))
    finally:
        codes = []
        for _, _, _, _, process, _ in pods:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, _, _, _, process, _ in pods:
            try:
                codes.append(process.wait(timeout=30))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
    # SIGTERM reached the agent itself (the shell exec'd it) and it stopped cleanly.
    assert codes == [0] * len(pods), f"exit codes {codes}\n" + "\n".join(
        log.read_text()[-3000:] for *_, log in pods)
