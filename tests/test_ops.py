"""ops/: manifests, Prometheus rules and scrape config, the Grafana dashboard, checked against the code."""
from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from firstfault.connectors import metrics_names as M

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "ops"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}
BUILTIN_SERIES = {"up"}                 # made by Prometheus itself, not by firstfault


def metric_names(expr: str) -> set[str]:
    """The series a PromQL expression selects (names, not labels, functions or keywords)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)                          # strings
    e = re.sub(r"\{[^}]*\}", "", e)                                       # label matchers
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", "", e)                                      # range and subquery windows
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word, rest = m.group(0), e[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue                                                      # a function or a keyword
        names.add(word)
    return names


def test_metric_name_parser_itself():
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(firstfault_x_bucket{a="b"}[5m]))) > 120') == \
        {"firstfault_x_bucket"}
    assert metric_names("time() - max by (c) (y) > 600 and on (c) up == 0") == {"y", "up"}


def alert_exprs() -> list[str]:
    doc = yaml.safe_load((OPS / "prometheus" / "alerts.yml").read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads((OPS / "grafana" / "firstfault.json").read_text())
    out = []
    for p in dash["panels"]:
        for panel in [p, *p.get("panels", [])]:
            out += [t["expr"] for t in panel.get("targets", [])]
    return out


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_metric_named_is_declared(source):
    exprs = alert_exprs() if source == "alerts" else dashboard_exprs()
    assert exprs
    used = set().union(*(metric_names(e) for e in exprs))
    undeclared = {n for n in used if not M.is_declared(n) and n not in BUILTIN_SERIES}
    assert not undeclared, f"{source} names metrics connectors/metrics_names.py does not declare: {undeclared}"


def test_alerts_cover_the_health_the_issue_asks_for():
    used = set().union(*(metric_names(e) for e in alert_exprs()))
    for needed in (M.CONSUMER_LAG, M.DEADLETTER, M.FINALIZATION_LATENCY + "_bucket", M.ALERT_QUEUE_DEPTH):
        assert needed in used, needed


def test_promtool_checks_the_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus'); scripts/test.sh installs it in CI")
    res = subprocess.run([promtool, "check", "rules", str(OPS / "prometheus" / "alerts.yml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_scrape_config_loads_the_rules_and_finds_the_pods():
    doc = yaml.safe_load((OPS / "prometheus" / "scrape.yml").read_text())
    assert doc["rule_files"] == ["alerts.yml"]
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    keep = jobs["firstfault"]["relabel_configs"][0]
    assert keep["action"] == "keep" and keep["regex"] == "firstfault"
    assert keep["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_part_of"]


# ---------------------------------------------------------------- Kubernetes manifests

def manifests() -> list[dict]:
    docs = []
    for f in sorted((OPS / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def workloads() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == "Deployment"}


def containers(dep: dict) -> list[dict]:
    return dep["spec"]["template"]["spec"]["containers"]


def test_manifests_parse_and_are_labelled():
    docs = manifests()
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "Secret", "Deployment", "Service",
                                         "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]
        assert d["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "firstfault", d["metadata"]["name"]
    for dep in workloads().values():
        sel = dep["spec"]["selector"]["matchLabels"]
        assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_each_process_runs_its_entry_point():
    cmds = {name: containers(dep)[0]["command"] for name, dep in workloads().items()}
    assert cmds["firstfault-extractor"] == ["python", "-m", "firstfault.streams.extractor"]
    assert cmds["firstfault-correlator"][:3] == ["python", "-m", "firstfault.streams.correlator"]
    assert cmds["firstfault-service"][:2] == ["firstfault", "serve"]
    for name in ("firstfault-k8s-connector", "firstfault-slurm-connector", "firstfault-alerts", "firstfault-recovery"):
        module = cmds[name][2]
        assert cmds[name][:2] == ["python", "-m"] and callable(importlib.import_module(module).main), name


def test_configuration_only_through_firstfault_variables_and_a_secret():
    config_maps = {d["metadata"]["name"]: d for d in manifests() if d["kind"] == "ConfigMap"}
    shared = config_maps["firstfault-config"]["data"]
    assert all(k.startswith("FIRSTFAULT_") for k in shared)
    assert {"FIRSTFAULT_KAFKA_BOOTSTRAP", "FIRSTFAULT_REDIS_URL"} <= set(shared)
    secret_words = re.compile(r"TOKEN|PASSWORD|ROUTING_KEY|SLACK_URL|SECRET", re.I)
    assert not [k for k in shared if secret_words.search(k)], "secrets belong in the Secret"
    for name, dep in workloads().items():
        for c in containers(dep):
            for ref in c.get("envFrom", []):
                assert ref.get("configMapRef", {}).get("name") == "firstfault-config", name
            for var in c.get("env", []):
                assert var["name"].startswith("FIRSTFAULT_"), (name, var["name"])
                src = var.get("valueFrom")
                if src is not None:
                    assert set(src) == {"secretKeyRef"} and src["secretKeyRef"]["name"] == "firstfault-secrets"
                elif secret_words.search(var["name"]) and not var["name"].endswith("_FILE"):
                    pytest.fail(f"{name}: {var['name']} carries a secret inline")
    alerts_cfg = yaml.safe_load(config_maps["firstfault-alerts"]["data"]["alerts.yaml"])
    from firstfault.connectors.enrich import Inventory
    from firstfault.connectors.sinks.alerts import AlertConfig
    AlertConfig.model_validate(alerts_cfg)                              # the shipped example is valid
    Inventory.model_validate(yaml.safe_load(config_maps["firstfault-alerts"]["data"]["inventory.yaml"]))


def test_service_probes_and_token_files():
    svc = containers(workloads()["firstfault-service"])[0]
    assert svc["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert svc["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {v["name"]: v.get("value") for v in svc["env"]}
    mount = next(m["mountPath"] for m in svc["volumeMounts"] if m["name"] == "tokens")
    assert env["FIRSTFAULT_READ_TOKENS_FILE"].startswith(mount + "/")
    vol = next(v for v in workloads()["firstfault-service"]["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "tokens")
    assert vol["secret"]["secretName"] == "firstfault-secrets"
    from firstfault.connectors.api.settings import ServiceSettings, env_name
    known = {env_name(f) for f in ServiceSettings.model_fields} | {env_name(f) + "_FILE" for f in ServiceSettings.model_fields}
    unknown = set(env) - known
    assert not unknown, f"the service does not read {unknown}"


def _service_routes() -> set[str]:
    from firstfault.connectors.api.app import create_app
    from firstfault.connectors.api.settings import ServiceSettings

    return set(create_app(ServiceSettings()).openapi()["paths"])      # (FastAPI nests included routers)


def test_every_deployment_has_probes_on_paths_that_exist():
    from firstfault.streams.health import LIVE_PATH, READY_PATH

    routes = _service_routes()
    assert {"/healthz", "/readyz", "/metrics"} <= routes
    deps = workloads()
    assert {"firstfault-extractor", "firstfault-correlator", "firstfault-k8s-connector", "firstfault-slurm-connector",
            "firstfault-alerts", "firstfault-recovery", "firstfault-service"} <= set(deps)
    for name, dep in deps.items():
        for c in containers(dep):
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for kind, wanted in (("livenessProbe", LIVE_PATH), ("readinessProbe", READY_PATH)):
                probe = c.get(kind)
                assert probe and "httpGet" in probe, f"{name}/{c['name']}: no {kind}"
                get = probe["httpGet"]
                port = get["port"]
                assert port in ports or port in ports.values(), f"{name}: {kind} on an undeclared port {port}"
                number = ports.get(port, port)
                assert get["path"] == wanted, (name, kind, get["path"])
                if c["command"][:2] == ["firstfault", "serve"]:
                    assert get["path"] in routes, (name, kind)              # the service's own routes
                else:
                    # workers and connectors: streams/health.py on FIRSTFAULT_METRICS_PORT, scraped there too
                    metrics_port = dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
                    assert number == int(metrics_port) == M.METRICS_PORT, (name, kind)


def test_each_declared_metric_has_an_exporter():
    exported = set().union(*M.EXPORTED_BY.values())
    assert exported == M.DECLARED, exported ^ M.DECLARED


def test_every_container_requests_resources_and_documents_why():
    for name, dep in workloads().items():
        for c in containers(dep):
            req = c.get("resources", {}).get("requests", {})
            assert req.get("cpu") and req.get("memory"), name
            assert c.get("resources", {}).get("limits", {}).get("memory"), name
    text = "".join(f.read_text() for f in (OPS / "k8s").glob("*.yaml"))
    assert "bench_analyze" in text and "lines/s" in text          # sizing says where it came from


def test_registered_metrics_are_declared(tmp_path):
    from firstfault.connectors.publish import ConnectorMetrics
    from firstfault.connectors.sinks.recovery import RecoveryConfig, RecoverySink

    cm = ConnectorMetrics("slurm")
    cm.ok()
    cm.failed()
    cm.events.labels("slurm", "start").inc()
    rs = RecoverySink(RecoveryConfig(audit_log=tmp_path / "a.jsonl"))
    rs.decisions.labels("refused").inc()
    from firstfault.streams.correlator import Metrics as CorrelatorMetrics
    from firstfault.streams.extractor import Metrics as ExtractorMetrics
    em, com = ExtractorMetrics(), CorrelatorMetrics()
    em.lag.labels("extractor", "raw", "0").set(3)
    com.lag.labels("correlator", "events", "0").set(3)
    com.latency.observe(1.0)
    com.diagnoses.labels("attributed", "final").inc()
    for registry in (cm.registry, rs.registry, em.registry, com.registry):
        names = {s.name for fam in registry.collect() for s in fam.samples if not s.name.endswith("_created")}
        assert names and all(M.is_declared(n) for n in names), names


def test_connectors_readme_gives_each_connector_its_command():
    text = (ROOT / "connectors" / "README.md").read_text()
    for module in ("firstfault.connectors.slurm", "firstfault.connectors.kubernetes", "firstfault.connectors.telemetry",
                   "firstfault.connectors.sinks.alerts", "firstfault.connectors.sinks.recovery"):
        assert f"python -m {module}" in text, module
        assert callable(importlib.import_module(module).main)
