"""The deploy files (issue 15): docker/Dockerfile, .dockerignore, docker/compose.yaml,
docker/prometheus.yml, docker/grafana/provisioning/ and the dashboard deploy/grafana/weir.json.

No Docker engine runs here, so the image is never built. What is checked instead:
* hadolint (a pinned wheel, tests/requirements.txt) finds nothing in the Dockerfile;
* the compose, Prometheus and Grafana files parse, everything they mount or build from exists,
  and their ports and paths agree with the Dockerfile's;
* every dashboard query parses as PromQL (promql-parser), and every metric it selects is one a
  real agent exports: scraped from its /metrics after produce, fetch and a group commit;
* the image's command line, environment, config file and health check, read from the
  Dockerfile, run outside a container against the built binary (ports on 127.0.0.1, a tmp data
  dir): it starts, answers Kafka and /healthz, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import promql_parser
import pytest
import yaml
from confluent_kafka import TopicPartition

from conftest import _AGENTS_BY_TEST, IN_CI, REPO_ROOT, Agent, pick_free_port, teardown_all
from weirtest import (Rec, ck_admin, ck_consume, ck_consumer, ck_produce, unique, wait_until)

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
COMPOSE = REPO_ROOT / "docker" / "compose.yaml"
PROMETHEUS = REPO_ROOT / "docker" / "prometheus.yml"
PROVISIONING = REPO_ROOT / "docker" / "grafana" / "provisioning"
DASHBOARDS = sorted((REPO_ROOT / "deploy" / "grafana").glob("*.json"))
HTTP_TIMEOUT_S = 5.0


# ------------------------------------------------------------------------- the Dockerfile

@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    args: str     # the rest, continuation lines joined
    stage: int    # index of the FROM it follows


def dockerfile(path: Path = DOCKERFILE) -> list[Instruction]:
    """The instructions of a Dockerfile: continuations joined, comments dropped (also comment
    lines inside a continuation, as Docker does). Enough for this repository's file."""
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, args.strip(), stage))
    assert not pending, f"{path}: a continuation runs past the end of the file"
    return out


def runtime_stage(instructions: list[Instruction]) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def image_env(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in stage:
        if ins.keyword != "ENV":
            continue
        tokens = shlex.split(ins.args)
        if "=" not in tokens[0]:  # legacy `ENV KEY value`
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            env[key] = value
    return env


def exec_form(ins: Instruction | None) -> list[str]:
    if ins is None:
        return []
    args = ins.args
    if ins.keyword == "HEALTHCHECK":
        args = args.split(" CMD ", 1)[1]
    value = json.loads(args)
    assert isinstance(value, list), f"{ins.keyword} is not in exec (JSON) form: {ins.args}"
    return value


def last(stage: list[Instruction], keyword: str) -> Instruction | None:
    found = [i for i in stage if i.keyword == keyword]
    return found[-1] if found else None


def copies(stage: list[Instruction]) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context (not --from another stage)."""
    out = []
    for ins in stage:
        if ins.keyword != "COPY":
            continue
        tokens = shlex.split(ins.args)
        if any(t.startswith("--from") for t in tokens):
            continue
        tokens = [t for t in tokens if not t.startswith("--")]
        out.append((tokens[:-1], tokens[-1]))
    return out


def exposed_ports(stage: list[Instruction]) -> set[int]:
    ports = set()
    for ins in stage:
        if ins.keyword == "EXPOSE":
            ports |= {int(p.split("/")[0]) for p in ins.args.split()}
    return ports


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_hadolint_finds_nothing_in_the_dockerfile():
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.is_file():
        found = shutil.which("hadolint")
        if not found:
            msg = "hadolint not found next to the venv's python or on PATH (tests/setup.sh)"
            if IN_CI:
                pytest.fail(msg, pytrace=False)
            pytest.skip(msg)
        hadolint = Path(found)
    run = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True,
                         text=True, timeout=60)
    # Any finding at any level (error, warning, info, style) fails; the file justifies its one
    # inline ignore.
    assert run.returncode == 0 and not run.stdout.strip() and not run.stderr.strip(), \
        f"hadolint (exit {run.returncode}):\n{run.stdout}{run.stderr}"


def test_the_image_runs_the_agent_as_a_user_with_its_data_in_a_volume():
    instructions = dockerfile()
    stage = runtime_stage(instructions)
    env = image_env(stage)
    assert exec_form(last(stage, "ENTRYPOINT")) == ["weir", "agent"]
    # Numeric and not root, so Kubernetes' runAsNonRoot can check it.
    user = last(stage, "USER").args.split(":")[0]
    assert user.isdigit() and int(user) != 0, user
    assert env.get("MALLOC_ARENA_MAX") == "2"
    assert env["WEIR_DATA_DIR"] in {v for i in stage if i.keyword == "VOLUME"
                                    for v in json.loads(i.args)}
    # Both listeners on every interface, on the ports the image exposes.
    for key in ("WEIR_LISTEN", "WEIR_HTTP_LISTEN"):
        assert env[key].startswith("0.0.0.0:"), (key, env[key])
    assert exposed_ports(stage) == {port_of(env["WEIR_LISTEN"]), port_of(env["WEIR_HTTP_LISTEN"])}
    # The config file the agent reads is one the image copies from the repository.
    destinations = {dest: sources for sources, dest in copies(stage)}
    assert env["WEIR_CONFIG"] in destinations, (env["WEIR_CONFIG"], destinations)
    for source in destinations[env["WEIR_CONFIG"]]:
        assert (REPO_ROOT / source).is_file(), source
    # A RUSTFLAGS would replace .cargo/config.toml's rustflags (the cfg weir-storage-gcs needs).
    for ins in instructions:
        if ins.keyword in ("ENV", "ARG", "RUN"):
            assert "RUSTFLAGS" not in ins.args, ins
    health = exec_form(last(stage, "HEALTHCHECK"))
    assert "/healthz" in " ".join(health)


# ------------------------------------------------------------------------- .dockerignore

def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether Docker's context filter leaves `path` (relative, '/'-separated) out: the last
    matching pattern wins, '!' re-includes, a pattern matching a directory covers everything
    under it; '**' spans directories, '*' and '?' do not."""
    def regex(pattern: str) -> re.Pattern:
        out = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                out += ".*"
                i += 2
            else:
                out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
                i += 1
        return re.compile(out + "(?:/.*)?")

    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        if regex(pattern.strip("/")).fullmatch(path):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_what_the_build_copies():
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
    needed = ["Cargo.toml", "Cargo.lock", "rust-toolchain.toml", ".cargo/config.toml",
              "config/weir.toml", "crates/weir/src/main.rs",
              "third_party/kafka-protocol/Cargo.toml"]
    needed += [str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.glob("crates/*/Cargo.toml")]
    for sources, _ in copies(dockerfile()):
        needed += [s for s in sources if s != "."]
    for path in needed:
        assert (REPO_ROOT / path).exists(), f"{path} is copied by the Dockerfile but missing"
        assert not dockerignore_excludes(patterns, path), f".dockerignore excludes {path}"
    for bulk in (".git/HEAD", "target/debug/weir", ".venv/bin/python",
                 "tests/cloud/node_modules/x", "fuzz/target/x", "crates/a/__pycache__/b.pyc"):
        assert dockerignore_excludes(patterns, bulk), f".dockerignore lets {bulk} through"


# --------------------------------------------------------------- compose, Prometheus, Grafana

def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(host path, container path) of a service's bind mounts; named volumes are left out."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                out.append((volume["source"], volume["target"]))
            continue
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/", "~")):
            out.append((source, target))
    return out


def test_compose_builds_and_mounts_only_what_the_repository_has():
    doc = compose()
    base = COMPOSE.parent
    declared = set(doc.get("volumes") or {})
    for name, service in doc["services"].items():
        build = service.get("build")
        if build:
            context = (base / build["context"]).resolve()
            assert context.is_dir(), (name, context)
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), (name, build)
        for source, _ in bind_mounts(service):
            assert (base / source).exists(), f"{name} mounts {source}, which does not exist"
        for volume in service.get("volumes", []):
            if isinstance(volume, str) and not volume.startswith((".", "/", "~")):
                assert volume.split(":")[0] in declared, f"{name}: undeclared volume {volume}"


def test_compose_runs_the_agent_as_the_dockerfile_expects():
    stage = runtime_stage(dockerfile())
    env = image_env(stage)
    (weir,) = [s for s in compose()["services"].values()
             if s.get("build", {}).get("dockerfile") == "docker/Dockerfile"]
    published = {}
    for mapping in weir["ports"]:
        host, _, container = str(mapping).rpartition(":")
        published[int(container)] = int(host.rsplit(":", 1)[-1])
    assert set(published) == exposed_ports(stage)
    # Clients reach the port the agent advertises, which is the port it binds: same number.
    kafka = port_of(env["WEIR_LISTEN"])
    assert published[kafka] == kafka
    assert weir["environment"].get("WEIR_AGENT_ADVERTISED_HOST"), \
        "without an advertised host the agent advertises 127.0.0.1 inside the container"
    assert any(target == env["WEIR_DATA_DIR"] for target in
               (str(v).split(":")[1] for v in weir["volumes"])), weir["volumes"]


def test_prometheus_scrapes_the_port_the_image_exposes():
    env = image_env(runtime_stage(dockerfile()))
    http_port = port_of(env["WEIR_HTTP_LISTEN"])
    services = compose()["services"]
    config = yaml.safe_load(PROMETHEUS.read_text())
    targets = [t for job in config["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc["targets"]]
    assert targets
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert host in services and int(port) == http_port, target
    prometheus = next(s for s in services.values() if "prom/prometheus" in s.get("image", ""))
    mounted = {target: (COMPOSE.parent / source).resolve()
               for source, target in bind_mounts(prometheus)}
    assert mounted.get("/etc/prometheus/prometheus.yml") == PROMETHEUS.resolve()


def test_grafana_provisions_the_datasource_and_the_dashboards_of_the_repository():
    services = compose()["services"]
    grafana = next(s for s in services.values() if "grafana/grafana" in s.get("image", ""))
    mounted = {target: (COMPOSE.parent / source).resolve()
               for source, target in bind_mounts(grafana)}
    assert mounted["/etc/grafana/provisioning"] == PROVISIONING.resolve()
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"

    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    (datasource,) = sources["datasources"]
    assert datasource["type"] == "prometheus"
    host, port = datasource["url"].split("//")[1].rstrip("/").split(":")
    assert host in services and int(port) == 9090, datasource["url"]
    scrape = yaml.safe_load(PROMETHEUS.read_text())["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape

    providers = yaml.safe_load((PROVISIONING / "dashboards" / "weir.yaml").read_text())
    (provider,) = providers["providers"]
    path = provider["options"]["path"]
    assert mounted[path] == (REPO_ROOT / "deploy" / "grafana").resolve()
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and (mounted[path] / home[len(path) + 1:]).is_file()


# ------------------------------------------------------------------------------ dashboard

GRAFANA_BUILTINS = {"__rate_interval": "1m", "__range": "1h", "__interval": "15s"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def dashboards() -> list[tuple[Path, dict]]:
    assert DASHBOARDS, "no dashboards in deploy/grafana/"
    return [(p, json.loads(p.read_text())) for p in DASHBOARDS]


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return out


def as_promql(expr: str) -> str:
    """A Grafana query with its variables replaced by values PromQL accepts."""
    for name, value in GRAFANA_BUILTINS.items():
        expr = expr.replace("$" + name, value).replace("${" + name + "}", value)
    # Template variables are used inside label matchers' strings only.
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    names = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        elif isinstance(node, promql_parser.MatrixSelector):
            visit(node.vector_selector)

    promql_parser.walk(promql_parser.parse(as_promql(expr)), visit)
    return names


def strip_histogram_suffix(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def dashboard_metrics() -> set[str]:
    names = set()
    for _, dashboard in dashboards():
        for panel in all_panels(dashboard):
            for target in panel.get("targets", []):
                names |= metric_names(target["expr"])
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                names |= set(re.findall(r"\b(?:weir|process)_\w+", variable["definition"]))
    return names


def test_every_dashboard_panel_has_a_query_that_parses_as_promql():
    for path, dashboard in dashboards():
        assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        datasource_vars = [n for n, v in variables.items() if v["type"] == "datasource"]
        assert len(datasource_vars) == 1 and \
            variables[datasource_vars[0]]["query"] == "prometheus", variables
        # Every query goes through the variable, so the dashboard imports into any Grafana.
        ds = {"type": "prometheus", "uid": "${%s}" % datasource_vars[0]}
        ids = [p["id"] for p in all_panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for panel in all_panels(dashboard):
            where = f"{path.name} panel {panel['id']} {panel.get('title')!r}"
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, where
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == ds, where
            assert panel.get("targets"), f"{where}: no query"
            for target in panel["targets"]:
                expr = target.get("expr", "").strip()
                assert expr, f"{where}: empty query {target.get('refId')}"
                assert target.get("datasource", ds) == ds, where
                used = set(re.findall(r"\$\{?(\w+)\}?", expr)) - set(GRAFANA_BUILTINS)
                undefined = used - set(variables)
                assert not undefined, f"{where}: undefined variables {undefined}"
                try:
                    promql_parser.parse(as_promql(expr))
                except ValueError as e:
                    pytest.fail(f"{where}: {e}\n  {expr}", pytrace=False)
        assert_no_overlap(path, [p for p in dashboard["panels"]])


def assert_no_overlap(path: Path, panels: list[dict]) -> None:
    cells = {}
    for panel in panels:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                other = cells.setdefault((x, y), panel["id"])
                assert other == panel["id"], \
                    f"{path.name}: panels {other} and {panel['id']} overlap at {(x, y)}"


def test_the_dashboard_covers_the_metrics_of_the_spec():
    # The rows the dashboard promises in docs/operations.md, each by one metric it plots.
    names = {strip_histogram_suffix(n) for n in dashboard_metrics()}
    for wanted in ("weir_produced_bytes_total", "weir_fetched_records_total",
                   "weir_produce_stage_duration_seconds", "weir_fetch_duration_seconds",
                   "weir_object_store_requests_total", "weir_object_store_cost_dollars_total",
                   "weir_object_store_cost_per_gib_dollars", "weir_consumer_group_lag",
                   "weir_kafka_requests_total", "weir_control_leader",
                   "weir_control_log_slot_duration_seconds", "weir_memory_in_use_bytes",
                   "weir_memory_budget_bytes", "weir_kafka_connections", "weir_ready"):
        assert wanted in names, wanted


# --------------------------------------------------------------------- against a real agent

def http_get(port: int, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET http://127.0.0.1:port/path; errors are answers too."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                    timeout=HTTP_TIMEOUT_S) as response:
            return (response.status, response.headers.get("Content-Type", ""),
                    response.read().decode(errors="replace"))
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode(errors="replace")


def scrape(port: int) -> dict[str, list[tuple[str, float]]]:
    """{metric name: [(labels text, value)]} from /metrics (Prometheus text format)."""
    status, _, body = http_get(port, "/metrics")
    assert status == 200, f"/metrics answered {status}: {body[:500]}"
    series: dict[str, list[tuple[str, float]]] = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        assert match, f"unparsable /metrics line: {line!r}"
        series.setdefault(match.group(1), []).append((match.group(2) or "", float(match.group(3))))
    return series


def exercise(bootstrap: str, group: str) -> tuple[str, int]:
    """Produce, fetch and commit a group offset, so the labelled series (per topic, stage,
    bucket, API, group) exist. Returns (topic, the group's expected lag)."""
    topic = unique("deploy")
    records = [Rec(topic, 0, None, b"v%d" % i) for i in range(20)]
    ck_produce(bootstrap, records)
    got = ck_consume(bootstrap, topic, [0])
    assert [g.value for g in got[0]] == [r.value for r in records]
    consumer = ck_consumer(bootstrap, {"group.id": group})
    try:
        # A standalone commit (assign, no subscribe): committed offsets, no membership.
        consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    finally:
        consumer.close()
    return topic, len(records) - 5


def test_every_metric_on_the_dashboard_is_exported_by_the_agent(agent):
    port = agent.http_port  # the agent fixture's --http-listen 127.0.0.1:PORT
    group = unique("deploy-group")
    _, lag = exercise(agent.bootstrap, group)
    wanted = {strip_histogram_suffix(n) for n in dashboard_metrics()}
    state = {}

    def all_there() -> bool:
        series = scrape(port)
        exported = {strip_histogram_suffix(n) for n in series}
        state["missing"] = sorted(wanted - exported)
        state["lag"] = [v for labels, v in series.get("weir_consumer_group_lag", [])
                        if f'group="{group}"' in labels]
        return not state["missing"] and state["lag"] == [lag]

    try:
        wait_until(all_there, 60, "every dashboard metric on /metrics")
    except AssertionError as e:
        pytest.fail(f"{e}\nmetrics the dashboard plots that the agent does not export: "
                    f"{state.get('missing')}; weir_consumer_group_lag{{group={group!r}}} = "
                    f"{state.get('lag')} (expected [{lag}])", pytrace=False)


class ImageAgent(Agent):
    """The agent as the image runs it: the Dockerfile's ENTRYPOINT and CMD, nothing added."""

    def __init__(self, binary: Path, argv: list[str], port: int, data_dir: Path, log_path: Path):
        super().__init__(binary, port, data_dir, log_path)
        self.argv = argv

    def command(self) -> list[str]:
        return [str(self.binary), *self.argv[1:]]


def healthcheck(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=30)


def test_the_image_command_runs_outside_a_container(request, weir_bin, tmp_path, monkeypatch):
    instructions = dockerfile()
    stage = runtime_stage(instructions)
    env = image_env(stage)
    argv = exec_form(last(stage, "ENTRYPOINT")) + exec_form(last(stage, "CMD"))
    assert argv[0] == "weir", argv
    kafka_port, http_port = pick_free_port(), pick_free_port()
    data_dir = tmp_path / "var-lib-weir"
    replaced = {"WEIR_LISTEN": f"127.0.0.1:{kafka_port}",
                "WEIR_HTTP_LISTEN": f"127.0.0.1:{http_port}",
                "WEIR_DATA_DIR": str(data_dir)}
    assert set(replaced) <= set(env), f"the image sets none of {set(replaced) - set(env)}"
    env.update(replaced)
    # Paths the image copies from the repository (the config file) are read from there.
    for sources, dest in copies(stage):
        for key, value in env.items():
            if value == dest and len(sources) == 1:
                env[key] = str(REPO_ROOT / sources[0])
    # The agent sees the image's WEIR_ variables and no others from this test run.
    for key in list(os.environ):
        if key.startswith("WEIR_") and key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    agents = []
    _AGENTS_BY_TEST[request.node.nodeid] = agents  # logs on the report of a failure
    agent = ImageAgent(weir_bin, argv, kafka_port, data_dir, tmp_path / "agent.log")
    agents.append(agent)
    try:
        agent.start()
        # Kafka: Metadata advertises the listen address, and a round trip works.
        brokers = ck_admin(agent.bootstrap).list_topics(timeout=30).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", kafka_port)]
        topic = unique("image")
        records = [Rec(topic, 0, b"k%d" % i, b"v%d" % i) for i in range(10)]
        ck_produce(agent.bootstrap, records)
        got = ck_consume(agent.bootstrap, topic, [0])
        assert [(g.key, g.value) for g in got[0]] == [(r.key, r.value) for r in records]

        # HTTP: the endpoints the image's users and its health check rely on.
        status, _, body = http_get(http_port, "/healthz")
        assert (status, body.strip()) == (200, "ok"), (status, body)
        wait_until(lambda: http_get(http_port, "/readyz")[0] == 200, 30, "/readyz 200")
        status, content_type, _ = http_get(http_port, "/")
        assert status == 200 and content_type.startswith("text/html"), (status, content_type)

        # The HEALTHCHECK command itself: passes against the agent, fails with nothing there.
        check = exec_form(last(stage, "HEALTHCHECK"))
        run = healthcheck(check, env)
        assert run.returncode == 0, f"health check failed: {run.stdout}{run.stderr}"
        nobody = healthcheck(check, {**env, "WEIR_HTTP_LISTEN": f"127.0.0.1:{pick_free_port()}"})
        assert nobody.returncode != 0, "the health check passes with no agent listening"

        # The image stops the agent with SIGTERM (docker stop): a clean exit.
        assert agent.stop() == 0
    finally:
        teardown_all(agents)
