"""docker-compose.yml and ops/Dockerfile, checked for structure (no Docker engine here)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from firstfault.streams.config import StreamConfig

ROOT = Path(__file__).resolve().parents[1]
FIRSTFAULT_SERVICES = ("extractor-1", "extractor-2", "correlator-1", "correlator-2", "service")
# profile `connectors`: module each runs
CONNECTOR_SERVICES = {"slurm-connector": "firstfault.connectors.slurm",
                      "slurm-tail": "firstfault.connectors.slurm_tail",
                      "alerts": "firstfault.connectors.sinks.alerts",
                      "recovery": "firstfault.connectors.sinks.recovery"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _cmd(svc: dict) -> list[str]:
    cmd = svc.get("command", [])
    return cmd if isinstance(cmd, list) else cmd.split()


def test_every_service_is_there(compose):
    assert set(compose["services"]) == {"kafka", "redis", *FIRSTFAULT_SERVICES, *CONNECTOR_SERVICES}


def test_two_of_each_worker_running_the_worker_modules(compose):
    svcs = compose["services"]
    extractors = [n for n, s in svcs.items() if _cmd(s)[:3] == ["python", "-m", "firstfault.streams.extractor"]]
    correlators = [n for n, s in svcs.items() if _cmd(s)[:3] == ["python", "-m", "firstfault.streams.correlator"]]
    assert sorted(extractors) == ["extractor-1", "extractor-2"]
    assert sorted(correlators) == ["correlator-1", "correlator-2"]
    # members of one group each: same group / app id
    assert len({svcs[n]["environment"]["FIRSTFAULT_EXTRACTOR_GROUP"] for n in extractors}) == 1
    assert len({svcs[n]["environment"]["FIRSTFAULT_APP_ID"] for n in correlators}) == 1
    assert _cmd(svcs["service"]) == ["firstfault", "serve", "--host", "0.0.0.0"]


def test_one_dockerfile_builds_every_firstfault_service(compose):
    for name in FIRSTFAULT_SERVICES:
        build = compose["services"][name]["build"]
        assert build == {"context": ".", "dockerfile": "ops/Dockerfile"}, name
    docker = (ROOT / "ops" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\s*$", docker, re.M)
    # The wheel is built in a stage with a compiler (the raw topic's C decoder) and must carry it.
    assert re.search(r"^FROM python:3\.11-slim AS build\s*$", docker, re.M)
    assert re.search(r"^COPY pyproject\.toml setup\.py ", docker, re.M)
    assert re.search(r"^RUN pip wheel .*\n.*ls /wheels/firstfault-\*-cp311-\*\.whl", docker, re.M)
    assert re.search(r"^RUN pip install /wheels/firstfault-", docker, re.M)
    ignore = (ROOT / "ops" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!setup.py" in ignore and "**/*.so" in ignore
    assert re.search(r"^USER (?!root)", docker, re.M)


def test_firstfault_services_are_configured_only_through_firstfault_variables(compose):
    known = {f"FIRSTFAULT_{v}" for v in ("KAFKA_BOOTSTRAP", "REDIS_URL", "TOPIC_PREFIX", "PARTITIONS")}
    for name in FIRSTFAULT_SERVICES:
        svc = compose["services"][name]
        env = svc["environment"]
        assert isinstance(env, dict) and env, name
        assert all(k.startswith("FIRSTFAULT_") for k in env), (name, [k for k in env if not k.startswith("FIRSTFAULT_")])
        assert known <= set(env), name
        assert not {"env_file", "entrypoint"} & set(svc), name
        assert env["FIRSTFAULT_KAFKA_BOOTSTRAP"] == "kafka:9092"
        assert env["FIRSTFAULT_REDIS_URL"].startswith("redis://redis:6379")
        # what the workers read parses into a valid stream config
        StreamConfig.from_env({k: str(v) for k, v in env.items()})
        assert not any("TOKEN" in k and not k.endswith("_FILE") for k in env), "tokens come from files"


def test_tokens_come_from_secret_files(compose):
    svc = compose["services"]["service"]
    env = svc["environment"]
    for kind in ("read", "write"):
        assert env[f"FIRSTFAULT_{kind.upper()}_TOKENS_FILE"] == f"/run/secrets/{kind}_tokens"
        assert f"{kind}_tokens" in svc["secrets"]
        assert "file" in compose["secrets"][f"{kind}_tokens"]


def test_service_and_worker_store_prefixes_agree(compose):
    env = compose["services"]["service"]["environment"]
    assert env["FIRSTFAULT_REDIS_PREFIX"] == env["FIRSTFAULT_TOPIC_PREFIX"]


def test_startup_order_waits_for_healthy_dependencies(compose):
    svcs = compose["services"]
    for name in FIRSTFAULT_SERVICES:
        deps = svcs[name]["depends_on"]
        assert deps["redis"]["condition"] == "service_healthy", name
        if name != "service":
            assert deps["kafka"]["condition"] == "service_healthy", name
        for dep, how in deps.items():
            if how["condition"] == "service_healthy":
                assert "healthcheck" in svcs[dep], f"{name} waits for {dep} to be healthy, but it has no healthcheck"


def test_healthchecks(compose):
    svcs = compose["services"]
    for name in ("kafka", "redis", "service"):
        test = svcs[name]["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    assert "/healthz" in " ".join(svcs["service"]["healthcheck"]["test"])
    assert "redis-cli" in svcs["redis"]["healthcheck"]["test"]


def test_kafka_is_single_node_kraft(compose):
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = str(env["KAFKA_NODE_ID"])
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node}@kafka:9093"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in env["KAFKA_LISTENERS"]
    assert "kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert not any("ZOOKEEPER" in k for k in env)
    for k in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
        assert int(env[k]) == 1
    assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) >= 10 * 1024 * 1024


def _healthz_port(svc: dict) -> int:
    """The port a service's healthcheck asks /healthz on (it must ask /healthz)."""
    test = " ".join(svc["healthcheck"]["test"])
    m = re.search(r"http://127\.0\.0\.1:(\d+)/healthz", test)
    assert m, test
    return int(m.group(1))


def test_workers_and_connectors_are_checked_on_their_metrics_port(compose):
    from firstfault.streams.health import LIVE_PATH

    assert LIVE_PATH == "/healthz"
    svcs = compose["services"]
    for name in ("extractor-1", "extractor-2", "correlator-1", "correlator-2", *CONNECTOR_SERVICES):
        env = svcs[name]["environment"]
        assert _healthz_port(svcs[name]) == int(env["FIRSTFAULT_METRICS_PORT"]), name


def test_connectors_profile(compose):
    import importlib

    svcs = compose["services"]
    for name, module in CONNECTOR_SERVICES.items():
        svc = svcs[name]
        assert svc["profiles"] == ["connectors"], name
        assert _cmd(svc)[:3] == ["python", "-m", module] and callable(importlib.import_module(module).main), name
        env = svc["environment"]
        assert isinstance(env, dict) and all(k.startswith("FIRSTFAULT_") for k in env), name
        assert not {"env_file", "entrypoint"} & set(svc), name
        assert env["FIRSTFAULT_KAFKA_BOOTSTRAP"] == "kafka:9092"
        assert env["FIRSTFAULT_TOPIC_PREFIX"] == svcs["extractor-1"]["environment"]["FIRSTFAULT_TOPIC_PREFIX"]
        assert svc["depends_on"]["kafka"]["condition"] == "service_healthy", name
        assert not any(re.search(r"TOKEN|PASSWORD|ROUTING_KEY|SLACK_URL|SECRET", k) for k in env), name
        StreamConfig.from_env({k: str(v) for k, v in env.items()})
    for name in ("alerts", "recovery"):
        assert svcs[name]["build"] == {"context": ".", "dockerfile": "ops/Dockerfile"}, name
    # The Kubernetes connector is for a cluster only; every service of the default profile stays as it was.
    assert not any("firstfault.connectors.kubernetes" in _cmd(s) for s in svcs.values())
    assert not any("profiles" in svcs[n] for n in ("kafka", "redis", *FIRSTFAULT_SERVICES))


def test_recovery_is_a_dry_run_with_a_kept_audit_log(compose):
    svc = compose["services"]["recovery"]
    env = svc["environment"]
    assert "--follow" in _cmd(svc) and "--execute" not in _cmd(svc)
    assert env.get("FIRSTFAULT_RECOVERY_EXECUTE", "0") != "1"
    assert int(env["FIRSTFAULT_RECOVERY_FLEET_SIZE"]) > 0                 # else every decision is refused
    volume = next(v for v in svc["volumes"] if v.split(":")[0] in compose["volumes"])
    assert env["FIRSTFAULT_RECOVERY_AUDIT_LOG"].startswith(volume.split(":")[1] + "/")
    slurm = compose["services"]["slurm-connector"]
    state_volume = next(v for v in slurm["volumes"] if v.split(":")[0] in compose["volumes"])
    assert slurm["environment"]["FIRSTFAULT_SLURM_STATE"].startswith(state_volume.split(":")[1] + "/")


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}``: the variable when set and not empty, else the default."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m.group(1)) or (m.group(2) or ""), text)


class _Reads(dict):
    """An environment that remembers which names were asked for."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


@pytest.mark.parametrize("name", ["slurm-connector", "slurm-tail"])
def test_slurm_services_set_only_what_their_module_reads(compose, name, monkeypatch):
    """What `up --slurm` runs, in compose: every variable set is one the module (its flags' defaults,
    the stream config) reads, so a misspelt or stale one fails here rather than being ignored."""
    import importlib

    svc = compose["services"][name]
    module = importlib.import_module(CONNECTOR_SERVICES[name])
    env = _Reads({k: str(v) for k, v in svc["environment"].items()})
    monkeypatch.setattr(os, "environ", env)
    args = module.build_parser().parse_args([])
    StreamConfig.from_env(env)
    assert set(svc["environment"]) <= env.read, set(svc["environment"]) - env.read
    assert args.metrics_port == int(svc["environment"]["FIRSTFAULT_METRICS_PORT"])
    # the same Slurm client image for both: each runs Slurm commands against the site's controller
    assert svc["image"] == "${FIRSTFAULT_SLURM_IMAGE:-firstfault:local}"


def test_slurm_tail_reads_the_jobs_files_where_squeue_says_they_are(compose, monkeypatch):
    svc = compose["services"]["slurm-tail"]
    env = svc["environment"]
    # the jobs' file system, read-only, at the same path inside as on the host (squeue's StdOut paths)
    [mount] = svc["volumes"]
    for site in ({}, {"FIRSTFAULT_SLURM_JOBS_DIR": "/scratch"}):
        source, target, mode = _interpolate(mount, site).split(":")
        assert source == target == site.get("FIRSTFAULT_SLURM_JOBS_DIR", "/home") and mode == "ro", mount
    # empty pattern: each job's own StdOut
    monkeypatch.setattr(os, "environ", {"FIRSTFAULT_SLURM_OUTPUT": ""})
    from firstfault.connectors import slurm_tail

    assert env["FIRSTFAULT_SLURM_OUTPUT"] == "${FIRSTFAULT_SLURM_OUTPUT:-}"
    assert slurm_tail.build_parser().parse_args([]).output is None
    assert float(env["FIRSTFAULT_SLURM_TAIL_LINGER_S"]) > 0 and float(env["FIRSTFAULT_SLURM_TAIL_INTERVAL_S"]) > 0


def test_alerts_config_is_mounted_valid_and_its_url_is_set(compose):
    from firstfault.connectors.sinks.alerts import AlertConfig

    svc = compose["services"]["alerts"]
    env = svc["environment"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
    cfg = AlertConfig.model_validate(yaml.safe_load((ROOT / mounts[env["FIRSTFAULT_ALERTS_CONFIG"]]).read_text()))
    for hook in cfg.webhooks:
        assert hook.url or hook.url_env in env, hook.name
