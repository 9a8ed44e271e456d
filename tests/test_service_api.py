"""The REST service end to end: the real app (ASGI, through httpx) on the real Redis."""
from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import tarfile
import threading
import zipfile
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path

import httpx
import pytest

from firstfault.connectors.api.app import create_app
from firstfault.connectors.api.serve import serve_main
from firstfault.connectors.api.settings import ServiceSettings
from firstfault.connectors.sinks.redis_store import DiagnosisStore
from firstfault.schemas import Diagnosis

from conftest import BASE_WORKLOAD, SAMPLES, sample_dirs, redis_key_prefix
from archives import tar_with

pytestmark = pytest.mark.anyio
REDIS_URL = "redis://127.0.0.1:6379/0"
WORKED = SAMPLES / "worked-example"
BIG = SAMPLES / "gpu-fell-off-bus-32node"
READ, WRITE = "read-token-1", "write-token-1"


@pytest.fixture
def anyio_backend():
    return "asyncio"


# ---------------------------------------------------------------- helpers

def payload(sample: Path) -> dict:
    files = {}
    for p in sorted(sample.rglob("*")):
        rel = p.relative_to(sample).as_posix()
        if p.is_file() and rel != "workload.json" and rel.startswith(("logs/", "metrics/")):
            # surrogateescape: any non-UTF-8 byte survives the JSON trip unchanged
            files[rel] = p.read_bytes().decode("utf-8", "surrogateescape")
    return {"workload": json.loads((sample / "workload.json").read_text()), "files": files}


def tar_gz(sample: Path, top: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(sample, arcname=top or sample.name)   # the layout under one top folder
    return buf.getvalue()


def zip_of(sample: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(sample.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(sample).as_posix())   # the layout at the root
    return buf.getvalue()





@lru_cache(maxsize=None)
def cli_json(sample: Path) -> str:
    """`firstfault analyze <sample> --json`, minus its trailing newline."""
    out = subprocess.run([sys.executable, "-m", "firstfault", "analyze", str(sample), "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert out.endswith("\n")
    return out[:-1]


def error_of(resp: httpx.Response) -> dict:
    assert resp.headers["content-type"].startswith("application/json"), resp.text[:200]
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "limit"}
    return body["error"]


def stored(workload_id: str, revision: int | None = None, **update) -> Diagnosis:
    base = Diagnosis.model_validate_json(cli_json(WORKED))
    return base.model_copy(update={"workload_id": workload_id, "revision": revision,
                                   "diagnosis_id": f"sha256:{workload_id}-{revision}", **update})


# ---------------------------------------------------------------- fixtures

@pytest.fixture
def prefix():
    with redis_key_prefix(REDIS_URL, "api") as p:
        yield p


@pytest.fixture
def make_client(prefix):
    """An httpx client on a fresh app; settings overrides, hooks and store pass through."""

    def make(publisher=None, kafka_ready=None, store=None, headers=None, **overrides) -> httpx.AsyncClient:
        settings = ServiceSettings(redis_url=REDIS_URL, redis_prefix=prefix, **overrides)
        app = create_app(settings, store=store, publisher=publisher, kafka_ready=kafka_ready)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                   headers=headers)
        client.app = app            # tests reach the app's store and runner through it
        return client

    return make


# ---------------------------------------------------------------- analyze: the same bytes as the CLI

@pytest.mark.parametrize("sample", sample_dirs(), ids=lambda p: p.name)
async def test_analyze_json_and_targz_match_the_cli_byte_for_byte(make_client, sample):
    expected = cli_json(sample)
    c = make_client()
    r = await c.post("/v1/analyze", json=payload(sample))
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"] == "application/json"
    assert r.text == expected
    r = await c.post("/v1/analyze", content=tar_gz(sample), headers={"content-type": "application/gzip"})
    assert r.status_code == 200, r.text[:500]
    assert r.text == expected


async def test_analyze_zip_with_layout_at_the_root(make_client):
    r = await make_client().post("/v1/analyze", content=zip_of(WORKED), headers={"content-type": "application/zip"})
    assert r.status_code == 200 and r.text == cli_json(WORKED)


async def test_analyze_stores_by_default_once_and_the_read_routes_find_it(make_client):
    c = make_client()
    r = await c.post("/v1/analyze?store=false", json=payload(WORKED))
    assert r.status_code == 200 and "x-firstfault-stored" not in r.headers and "x-firstfault-page" not in r.headers
    assert (await c.get("/v1/diagnoses/slurm-4471823")).status_code == 404
    r = await c.post("/v1/analyze", json=payload(WORKED))
    assert r.status_code == 200 and r.headers["x-firstfault-stored"] == "true"
    assert r.headers["x-firstfault-page"] == "/ui/diagnoses/slurm-4471823?attempt=0"
    assert r.text == cli_json(WORKED)                             # the body is still exactly the diagnosis
    r = await c.post("/v1/analyze?store=true", json=payload(WORKED))
    assert r.headers["x-firstfault-stored"] == "false"          # idempotent
    assert (await c.get(r.headers["x-firstfault-page"])).status_code == 200

    got = (await c.get("/v1/diagnoses/slurm-4471823")).json()
    assert got["attempt"] == 0 and got["attempts"] == [0] and got["revisions"] == []
    assert json.dumps(got["diagnosis"], sort_keys=True, ensure_ascii=False, indent=2) == cli_json(WORKED)
    page = (await c.get("/v1/diagnoses", params={"node": "node-02"})).json()
    assert [d["workload_id"] for d in page["items"]] == ["slurm-4471823"] and page["next_cursor"] is None
    # Indexed at the workload's end time (2026-11-02T10:13:19Z).
    assert (await c.get("/v1/diagnoses", params={"since": "2026-11-02T10:13:19Z"})).json()["items"]
    assert not (await c.get("/v1/diagnoses", params={"since": "2026-11-02T10:13:20Z"})).json()["items"]


# ---------------------------------------------------------------- reads

async def test_get_diagnosis_latest_attempt_revisions_and_404(make_client):
    c = make_client()
    store = c.app.state.ctx.store
    store.save(stored("job-7", revision=0))
    store.save(stored("job-7", revision=1))
    store.save(stored("job-7", revision=None, attempt=1, diagnosis_id="sha256:job-7-a1"))
    got = (await c.get("/v1/diagnoses/job-7")).json()
    assert got["attempt"] == 1 and got["attempts"] == [1, 0] and got["revisions"] == []
    got = (await c.get("/v1/diagnoses/job-7", params={"attempt": 0})).json()
    assert got["diagnosis"]["revision"] == 1 and [r["revision"] for r in got["revisions"]] == [0]

    r = await c.get("/v1/diagnoses/job-7", params={"attempt": 5})
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = await c.get("/v1/diagnoses/no-such-job")
    assert r.status_code == 404 and "no-such-job" in error_of(r)["message"]
    r = await c.get("/v1/diagnoses/job-7", params={"attempt": "x"})
    assert r.status_code == 422 and "attempt" in error_of(r)["message"]
    # Kubernetes-style ids carry a slash.
    store.save(stored("team-a/train-42"))
    got = (await c.get("/v1/diagnoses/team-a/train-42")).json()
    assert got["workload_id"] == "team-a/train-42"
    assert (await c.get("/ui/diagnoses/team-a/train-42")).status_code == 200


async def test_list_filters_and_pages(make_client):
    c = make_client()
    store = c.app.state.ctx.store
    t0 = datetime(2026, 11, 2, tzinfo=timezone.utc)
    for i in range(5):
        store.save(stored(f"list-{i}"), t0 + timedelta(hours=i))
    store.save(stored("list-u", status="unattributed", domain="unknown", sub_domain="unattributed",
                      root_cause=None, responsible_nodes=[], suspect_nodes=["node-09"]), t0 + timedelta(hours=9))

    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await c.get("/v1/diagnoses", params=params)).json()
        seen += [d["workload_id"] for d in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ["list-u", "list-4", "list-3", "list-2", "list-1", "list-0"]

    async def names(**params) -> list[str]:
        r = await c.get("/v1/diagnoses", params=params)
        assert r.status_code == 200, r.text
        return [d["workload_id"] for d in r.json()["items"]]

    assert await names(status="unattributed") == ["list-u"]
    assert await names(domain="interconnect", until="2026-11-02T01:00:00Z") == ["list-1", "list-0"]
    assert await names(since="2026-11-02T03:00:00", node="node-02") == ["list-4", "list-3"]   # naive = UTC
    assert await names(node="node-09") == ["list-u"]

    for params, field in (({"status": "broken"}, "status"), ({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
                          ({"since": "yesterday"}, "since"), ({"cursor": "garbage"}, "cursor")):
        r = await c.get("/v1/diagnoses", params=params)
        assert r.status_code == 422, params
        assert field in error_of(r)["message"], params


async def test_node_route_lists_blamed_and_suspected_with_their_role(make_client):
    c = make_client()
    store = c.app.state.ctx.store
    store.save(stored("blamed-job"), datetime(2026, 11, 2, 1, tzinfo=timezone.utc))
    store.save(stored("suspect-job", status="unattributed", domain="unknown", sub_domain="unattributed",
                      root_cause=None, responsible_nodes=[], suspect_nodes=["node-02"]),
               datetime(2026, 11, 2, 2, tzinfo=timezone.utc))
    body = (await c.get("/v1/nodes/node-02/diagnoses")).json()
    assert body["host"] == "node-02" and body["next_cursor"] is None
    assert [(i["role"], i["diagnosis"]["workload_id"]) for i in body["items"]] == [
        ("suspect", "suspect-job"), ("responsible", "blamed-job")]
    first = (await c.get("/v1/nodes/node-02/diagnoses", params={"limit": 1})).json()
    rest = (await c.get("/v1/nodes/node-02/diagnoses", params={"limit": 1, "cursor": first["next_cursor"]})).json()
    assert [i["diagnosis"]["workload_id"] for i in first["items"] + rest["items"]] == ["suspect-job", "blamed-job"]
    assert (await c.get("/v1/nodes/node-77/diagnoses")).json()["items"] == []


# ---------------------------------------------------------------- publish

async def test_publish_needs_a_configured_publisher(make_client):
    r = await make_client().post("/v1/analyze?publish=true", json=payload(WORKED))
    assert r.status_code == 409
    err = error_of(r)
    assert err["code"] == "publish_not_configured" and "publishing is not configured" in err["message"]


async def test_publish_sync_and_async_publishers_receive_the_diagnosis(make_client):
    got: list[Diagnosis] = []

    async def async_pub(d: Diagnosis) -> None:
        got.append(d)

    for publisher in (got.append, async_pub):
        r = await make_client(publisher=publisher).post("/v1/analyze?publish=true&store=true", json=payload(WORKED))
        assert r.status_code == 200 and r.headers["x-firstfault-published"] == "true"
    assert [d.to_json() for d in got] == [cli_json(WORKED)] * 2


async def test_a_failing_publisher_is_a_503(make_client):
    def broken(_: Diagnosis) -> None:
        raise ConnectionError("broker down")

    r = await make_client(publisher=broken).post("/v1/analyze?publish=true", json=payload(WORKED))
    assert r.status_code == 503
    err = error_of(r)
    assert err["code"] == "publish_failed" and "broker down" in err["message"]


# ---------------------------------------------------------------- health, readiness, metrics

async def test_health_and_readiness(make_client):
    c = make_client()
    assert (await c.get("/healthz")).json() == {"status": "ok"}
    r = await c.get("/readyz")
    assert r.status_code == 200
    assert r.json()["status"] == "ready" and r.json()["checks"] == {"store": True}
    assert r.json()["store_backend"] == "redis"


@pytest.mark.parametrize("check,ready", [(lambda: True, True), (lambda: False, False), (lambda: 1 / 0, False)])
async def test_readiness_includes_kafka_when_configured(make_client, check, ready):
    r = await make_client(kafka_ready=check).get("/readyz")
    assert r.status_code == (200 if ready else 503)
    assert r.json()["checks"] == {"store": True, "kafka": ready}


async def test_readiness_and_reads_report_an_unreachable_redis(make_client):
    c = make_client(store=DiagnosisStore("redis://127.0.0.1:1/0", prefix="fftest:down:"))
    r = await c.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"]["store"] is False and r.json()["status"] == "not_ready"
    for path in ("/v1/diagnoses", "/v1/diagnoses/x", "/v1/nodes/n/diagnoses"):
        r = await c.get(path)
        assert r.status_code == 503 and error_of(r)["code"] == "store_unavailable", path
    r = await c.post("/v1/analyze?store=true", json=payload(WORKED))
    assert r.status_code == 503 and error_of(r)["code"] == "store_unavailable"


async def test_metrics_count_requests_diagnoses_and_engine_time(make_client):
    c = make_client(max_lines=10)
    await c.post("/v1/analyze", json=payload(WORKED) | {"files": {}})
    await c.post("/v1/analyze", json=payload(WORKED))              # refused by max_lines
    await c.get("/v1/diagnoses/none")
    text = (await c.get("/metrics")).text
    assert 'firstfault_http_requests_total{method="POST",route="/v1/analyze",status="200"} 1.0' in text
    assert 'firstfault_http_requests_total{method="POST",route="/v1/analyze",status="413"} 1.0' in text
    assert 'firstfault_http_requests_total{method="GET",route="/v1/diagnoses/{workload_id}",status="404"} 1.0' in text
    assert ('firstfault_http_request_duration_seconds_bucket{le="0.005",method="GET",'
            'route="/v1/diagnoses/{workload_id}"}') in text
    assert 'firstfault_diagnoses_total{domain="unknown",status="unattributed"} 1.0' in text
    assert "firstfault_engine_seconds_count 2.0" in text
    assert 'firstfault_limit_rejections_total{limit="FIRSTFAULT_MAX_LINES"} 1.0' in text


# ---------------------------------------------------------------- authentication

async def test_auth_read_and_write_tokens(make_client):
    c = make_client(read_tokens=frozenset({READ}), write_tokens=frozenset({WRITE}))
    bearer = lambda t: {"authorization": f"Bearer {t}"}        # noqa: E731

    r = await c.get("/v1/diagnoses")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert error_of(r)["code"] == "unauthenticated"
    r = await c.get("/v1/diagnoses", headers=bearer("wrong"))
    assert r.status_code == 401 and "invalid_token" in r.headers["www-authenticate"]
    r = await c.get("/v1/diagnoses", headers={"authorization": f"Basic {READ}"})
    assert r.status_code == 401
    for token in (READ, WRITE):
        assert (await c.get("/v1/diagnoses", headers=bearer(token))).status_code == 200
        assert (await c.get("/v1/nodes/node-02/diagnoses", headers=bearer(token))).status_code == 200
        assert (await c.get("/v1/diagnoses/x", headers=bearer(token))).status_code == 404

    r = await c.post("/v1/analyze", json=payload(WORKED))
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    r = await c.post("/v1/analyze", json=payload(WORKED), headers=bearer(READ))
    assert r.status_code == 403 and error_of(r)["code"] == "insufficient_scope"
    r = await c.post("/v1/analyze", json=payload(WORKED), headers=bearer(WRITE))
    assert r.status_code == 200 and r.text == cli_json(WORKED)

    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert (await c.get(path)).status_code == 200, path


async def test_ui_auth_is_a_login_form_and_a_cookie(make_client):
    c = make_client(read_tokens=frozenset({READ}))
    c.app.state.ctx.store.save(stored("ui-job"))
    r = await c.get("/ui/diagnoses/ui-job")
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
    assert r.headers["www-authenticate"].startswith("Bearer") and 'name="token"' in r.text
    assert (await c.get("/ui/diagnoses/ui-job", headers={"authorization": f"Bearer {READ}"})).status_code == 200

    r = await c.post("/ui/session", content="token=nope&next=/ui/diagnoses/ui-job",
                     headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 401
    r = await c.post("/ui/session", content=f"token={READ}&next=https://evil.example/",
                     headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/"        # no open redirect
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    r = await c.get("/ui/diagnoses/ui-job")          # the client keeps the cookie
    assert r.status_code == 200 and "ui-job" in r.text


def test_tokens_from_env_and_files(tmp_path):
    f = tmp_path / "write.tokens"
    f.write_text("w-from-file\n w2 \n")
    s = ServiceSettings.from_env({"FIRSTFAULT_READ_TOKENS": "r1, r2,", "FIRSTFAULT_WRITE_TOKENS_FILE": str(f),
                                  "FIRSTFAULT_MAX_LINES": "12"})
    assert s.read_tokens == {"r1", "r2"} and s.write_tokens == {"w-from-file", "w2"} and s.max_lines == 12
    assert s.auth_enabled and not ServiceSettings.from_env({}).auth_enabled
    with pytest.raises(ValueError, match="FIRSTFAULT_READ_TOKENS_FILE"):
        ServiceSettings.from_env({"FIRSTFAULT_READ_TOKENS_FILE": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="FIRSTFAULT_MAX_LINES"):
        ServiceSettings.from_env({"FIRSTFAULT_MAX_LINES": "many"})


def test_serve_refuses_a_public_address_without_tokens(monkeypatch, capsys):
    for var in ("FIRSTFAULT_READ_TOKENS", "FIRSTFAULT_WRITE_TOKENS", "FIRSTFAULT_READ_TOKENS_FILE",
                "FIRSTFAULT_WRITE_TOKENS_FILE"):
        monkeypatch.delenv(var, raising=False)
    assert serve_main(["--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0" in err and "FIRSTFAULT_READ_TOKENS" in err
    monkeypatch.setenv("FIRSTFAULT_PORT", "not-a-port")
    assert serve_main([]) == 2
    assert "FIRSTFAULT_PORT" in capsys.readouterr().err


# ---------------------------------------------------------------- limits and bad input

async def test_body_size_cap_with_and_without_content_length(make_client):
    c = make_client(max_body_bytes=1000)
    r = await c.post("/v1/analyze", json=payload(WORKED))
    assert r.status_code == 413
    err = error_of(r)
    assert err["code"] == "body_too_large" and err["limit"] == "FIRSTFAULT_MAX_BODY_BYTES"

    async def chunks():
        for _ in range(10):
            yield b"x" * 500

    r = await c.post("/v1/analyze", content=chunks(), headers={"content-type": "application/gzip"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_BODY_BYTES"


async def test_archive_expansion_cap_stops_decompression_bombs(make_client):
    c = make_client(max_archive_bytes=1024 * 1024)
    wl = json.dumps(BASE_WORKLOAD).encode()
    bomb = tar_with({"workload.json": wl, "logs/app/node-01.log": b"\n" * (8 * 1024 * 1024)})
    assert len(bomb) < 64 * 1024
    r = await c.post("/v1/analyze", content=bomb, headers={"content-type": "application/gzip"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_ARCHIVE_BYTES"

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("workload.json", wl)
        zf.writestr("logs/app/node-01.log", b"\n" * (8 * 1024 * 1024))
    r = await c.post("/v1/analyze", content=buf.getvalue(), headers={"content-type": "application/zip"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_ARCHIVE_BYTES"


async def test_file_count_cap_in_both_forms(make_client):
    c = make_client(max_files=3)
    files = {f"logs/app/node-0{i}.log": "x\n" for i in range(5)}
    r = await c.post("/v1/analyze", json={"workload": BASE_WORKLOAD, "files": files})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_FILES"
    archive = tar_with({"workload.json": json.dumps(BASE_WORKLOAD).encode(),
                        **{k: v.encode() for k, v in files.items()}})
    r = await c.post("/v1/analyze", content=archive, headers={"content-type": "application/gzip"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_FILES"


async def test_line_count_cap(make_client):
    c = make_client(max_lines=100)
    r = await c.post("/v1/analyze", json=payload(WORKED))
    assert r.status_code == 413
    err = error_of(r)
    assert err["code"] == "too_many_lines" and err["limit"] == "FIRSTFAULT_MAX_LINES"
    r = await c.post("/v1/analyze", content=tar_gz(WORKED), headers={"content-type": "application/gzip"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_LINES"
    # Exactly at the cap passes: 100 lines, the last without a newline.
    ok = {"workload": BASE_WORKLOAD, "files": {"logs/app/node-01.log": "line\n" * 99 + "last"}}
    assert (await c.post("/v1/analyze", json=ok)).status_code == 200


async def test_engine_time_cap_is_a_504(make_client):
    r = await make_client(request_timeout_s=0.001).post("/v1/analyze", json=payload(BIG))
    assert r.status_code == 504
    err = error_of(r)
    assert err["code"] == "engine_timeout" and err["limit"] == "FIRSTFAULT_REQUEST_TIMEOUT_S"


async def test_saturated_engine_is_a_503_with_retry_after(make_client):
    c = make_client(engine_threads=1, engine_queue=0)
    release = threading.Event()
    runner = c.app.state.ctx.runner
    hold = asyncio.ensure_future(runner.run(lambda: release.wait(10)))
    await asyncio.sleep(0.05)                       # the holder has taken the only slot
    try:
        r = await c.post("/v1/analyze", json=payload(WORKED))
        assert r.status_code == 503 and r.headers["retry-after"]
        assert error_of(r) == {"code": "engine_busy", "limit": "FIRSTFAULT_ENGINE_QUEUE",
                               "message": error_of(r)["message"]}
    finally:
        release.set()
        await hold
    assert (await c.post("/v1/analyze", json=payload(WORKED))).status_code == 200


async def test_bad_json_is_400_and_bad_media_type_415(make_client):
    c = make_client()
    r = await c.post("/v1/analyze", content=b'{"workload": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
    r = await c.post("/v1/analyze", content=b"hello", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type"
    assert "text/plain" in error_of(r)["message"]            # the refusal names what is taken
    # The upload form's type, with no file in it: the reason, not a crash
    r = await c.post("/v1/analyze", content=b"hello", headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 422 and error_of(r)["code"] == "invalid_upload"
    r = await c.post("/v1/analyze", content=b"hello")
    assert r.status_code == 415


@pytest.mark.parametrize("body,field", [
    ({"files": {}}, "workload"),
    ({"workload": BASE_WORKLOAD, "files": ["logs/app/a.log"]}, "files"),
    ({"workload": BASE_WORKLOAD, "files": {"logs/app/a.log": 3}}, "files.logs/app/a.log"),
    ({"workload": BASE_WORKLOAD, "file": {}}, "file"),
    ({"workload": {k: v for k, v in BASE_WORKLOAD.items() if k != "start_time"}}, "start_time"),
    ({"workload": BASE_WORKLOAD | {"end_time": "2020-01-01T00:00:00Z"}}, "end_time"),
    ({"workload": BASE_WORKLOAD | {"gpus_per_node": 0}}, "gpus_per_node"),
    ({"workload": BASE_WORKLOAD | {"start_time": "0001-01-01T00:00:00Z", "end_time": None}}, "start_time"),
    ({"workload": BASE_WORKLOAD | {"end_time": "9999-12-31T23:59:59Z"}}, "end_time"),
    ({"workload": BASE_WORKLOAD | {"boot_times": {"node-01": "1969-12-31T00:00:00Z"}}}, "boot_times.node-01"),
    ({"workload": BASE_WORKLOAD, "files": {"../etc/passwd": "x"}}, "../etc/passwd"),
    ({"workload": BASE_WORKLOAD, "files": {"/logs/app/a.log": "x"}}, "/logs/app/a.log"),
    ([1, 2], "(body)"),
])
async def test_invalid_request_or_workload_is_422_naming_the_field(make_client, body, field):
    r = await make_client().post("/v1/analyze", json=body)
    assert r.status_code == 422, r.text
    assert field in error_of(r)["message"]


@pytest.mark.parametrize("archive,words", [
    (lambda: tar_with({"workload.json": json.dumps(BASE_WORKLOAD).encode(), "../evil.log": b"x"}), "unsafe path"),
    (lambda: tar_with({"workload.json": json.dumps(BASE_WORKLOAD).encode(), "/etc/x.log": b"x"}), "unsafe path"),
    (lambda: tar_with({"workload.json": json.dumps(BASE_WORKLOAD).encode()},
                      links={"logs/app/a.log": "/etc/passwd"}), "link"),
    (lambda: tar_with({"logs/app/a.log": b"x"}), "workload.json is missing"),
    (lambda: tar_with({"workload.json": b"{not json"}), "not valid JSON"),
    (lambda: tar_with({"workload.json": json.dumps({**BASE_WORKLOAD, "attempt": -1}).encode()}), "attempt"),
    (lambda: tar_with({"workload.json": json.dumps({**BASE_WORKLOAD, "start_time": "0001-01-01T00:00:00Z",
                                                    "end_time": None}).encode()}), "start_time"),
    (lambda: b"definitely not gzip", "not a readable"),
])
async def test_bad_archives_are_422_with_the_reason(make_client, archive, words):
    r = await make_client().post("/v1/analyze", content=archive(), headers={"content-type": "application/gzip"})
    assert r.status_code == 422, r.text
    err = error_of(r)
    assert err["code"] in ("invalid_bundle", "invalid_workload") and words in err["message"]


async def test_unknown_routes_and_methods_answer_the_error_model(make_client):
    c = make_client()
    r = await c.get("/v1/nothing-here")
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    r = await c.delete("/v1/analyze")
    assert r.status_code == 405 and error_of(r)["code"] == "method_not_allowed" and "POST" in r.headers["allow"]


# ---------------------------------------------------------------- pages and OpenAPI

async def test_pages_render_status_root_cause_and_evidence(make_client):
    c = make_client()
    c.app.state.ctx.store.save(Diagnosis.model_validate_json(cli_json(WORKED)))
    r = await c.get("/ui/diagnoses/slurm-4471823")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    html = r.text
    assert 'class="summary status-attributed"' in html
    assert "node-02 · interconnect / nvlink_signal_integrity" in html
    assert "logs/syslog/node-02.log:9" in html and "NETIR_LINK_EVT" in html      # raw line and its ref
    assert 'class="mark root"' in html and 'id="ev-root"' in html              # root marked on the timeline
    r = await c.get("/ui/diagnoses/nope")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    idx = await c.get("/ui/", params={"status": "attributed", "node": "node-02", "since": "bad"})
    assert idx.status_code == 200 and "slurm-4471823" in idx.text and "ignored since" in idx.text
    assert (await c.get("/ui/static/ui.css")).status_code == 200
    assert (await c.get("/ui/static/ui.js")).status_code == 200


async def test_openapi_documents_every_response_with_the_error_model(make_client):
    doc = (await make_client(read_tokens=frozenset({READ})).get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    assert set(schemas["ErrorDetail"]["required"]) == {"code", "message", "limit"}
    body = doc["paths"]["/v1/analyze"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/gzip", "application/zip", "multipart/form-data",
                         "text/plain", "application/octet-stream"}
    assert body["application/json"]["schema"]["$ref"] == "#/components/schemas/AnalyzeRequest"
    assert "WorkloadRecord" in schemas
    analyze = doc["paths"]["/v1/analyze"]["post"]["responses"]
    assert {"200", "400", "401", "403", "409", "413", "415", "422", "500", "503", "504"} <= set(analyze)
    assert analyze["200"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/Diagnosis"
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "500" in op["responses"], (path, method)
            for status, resp in op["responses"].items():
                if status.startswith(("4", "5")):
                    content = resp["content"]
                    if path.startswith("/ui/"):
                        assert "text/html" in content, (path, status)
                    elif path == "/readyz" and status == "503":
                        assert content["application/json"]["schema"]["$ref"].endswith("/Readiness")
                    else:
                        assert content["application/json"]["schema"]["$ref"].endswith("/ErrorBody"), (path, status)
            if path.startswith("/v1/"):
                assert op.get("security"), (path, method)       # declared when tokens are configured
    assert "HTTPValidationError" not in schemas


# ---------------------------------------------------------------- log references in context, uploads

async def test_every_reference_of_a_posted_diagnosis_opens_with_its_context(make_client):
    """Issue 13: each log reference links to its line with 20 lines either side, kept at analyze time."""
    c = make_client()
    d = Diagnosis.model_validate_json((await c.post("/v1/analyze", json=payload(WORKED))).text)
    root = d.root_cause.ref
    got = (await c.get("/v1/lines/slurm-4471823", params={"path": root.path, "line": root.line})).json()
    assert got["source"] == "bundle"
    text = (WORKED / root.path).read_text().split("\n")
    want = [{"line": n, "text": text[n - 1]} for n in range(max(1, root.line - 20), min(len(text), root.line + 20) + 1)
            if n <= len(text) and (n < len(text) or text[n - 1])]
    assert got["lines"] == want and any(ln["line"] == root.line and ln["text"] == d.root_cause.text for ln in got["lines"])
    for s in d.symptoms:                        # every shown reference was kept
        ctx = (await c.get("/v1/lines/slurm-4471823", params={"path": s.sample.path, "line": s.sample.line})).json()
        assert ctx["source"] == "bundle" and any(ln["line"] == s.sample.line for ln in ctx["lines"])
    page = await c.get("/ui/lines/slurm-4471823", params={"path": root.path, "line": root.line, "attempt": 0})
    assert page.status_code == 200 and f'id="L{root.line}" class="hit"' in page.text
    r = await c.get("/v1/lines/no-such-job", params={"path": root.path, "line": 1})
    assert r.status_code == 404


async def test_a_diagnosis_stored_without_its_bundle_says_the_context_was_not_kept(make_client):
    c = make_client()
    store = c.app.state.ctx.store
    from firstfault.rules.engine import analyze_path
    d = analyze_path(WORKED).diagnosis
    store.save(d)                               # as the stream's sink stores it: no lines
    got = (await c.get("/v1/lines/slurm-4471823", params={"path": d.root_cause.ref.path,
                                                            "line": d.root_cause.ref.line})).json()
    assert got["source"] == "diagnosis" and got["lines"] == [{"line": d.root_cause.ref.line, "text": d.root_cause.text}]
    assert "not kept" in got["note"]
    other = (await c.get("/v1/lines/slurm-4471823", params={"path": "logs/app/node-01.log", "line": 3})).json()
    assert other["source"] == "none" and other["lines"] == []


# What a browser's form navigation sends (Chromium); curl sends */*.
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


async def test_the_upload_form_diagnoses_an_archive_or_a_log_file_and_redirects_to_the_page(make_client):
    c = make_client(headers={"accept": BROWSER_ACCEPT})
    r = await c.post("/v1/analyze", files={"bundle": ("worked.zip", zip_of(WORKED), "application/zip")})
    assert r.status_code == 303 and r.headers["location"] == "/ui/diagnoses/slurm-4471823?attempt=0"
    assert (await c.get("/v1/diagnoses/slurm-4471823")).json()["diagnosis"]["sub_domain"] == "nvlink_signal_integrity"
    # One log file, as `firstfault analyze FILE` reads it (marbl/canu#1052: a time-limit banner)
    log = b"step 100 loss 2.1\nslurmstepd: error: *** JOB 3884617 ON node023 CANCELLED AT 2018-08-19T16:30:21 DUE TO TIME LIMIT ***\n"
    r = await c.post("/v1/analyze", files={"bundle": ("slurm-3884617.out", log, "text/plain")})
    assert r.status_code == 303
    page = await c.get(r.headers["location"])
    assert page.status_code == 200 and "walltime_exceeded" in page.text
    r = await c.post("/v1/analyze", files={"bundle": ("empty.log", b"", "text/plain")})
    assert r.status_code == 422 and "empty" in error_of(r)["message"]
    r = await c.post("/v1/analyze", data={"note": "no file"}, files={"other": ("", b"", "text/plain")})
    assert r.status_code == 422


# marbl/canu#1052: a time-limit banner that states its own time (the bare file of test_real_inputs)
TIME_LIMIT_LOG = (b"step 100 loss 2.1\n"
                  b"slurmstepd: error: *** JOB 3884617 ON node023 CANCELLED AT 2018-08-19T16:30:21 DUE TO TIME LIMIT ***\n")


def cli_json_of_file(tmp_path: Path, name: str, data: bytes) -> str:
    """`firstfault analyze FILE --json` of ``data`` saved as ``name``, minus its trailing newline."""
    path = tmp_path / name
    path.write_bytes(data)
    return cli_json(path)


async def test_a_plain_text_body_is_one_log_file_read_as_analyze_reads_it(make_client, tmp_path):
    """Issue 25: a plain-text log posted to /v1/analyze got 415."""
    expected = cli_json_of_file(tmp_path, "slurm-3884617.out", TIME_LIMIT_LOG)
    c = make_client()
    for ctype in ("text/plain", "text/plain; charset=utf-8", "application/octet-stream"):
        r = await c.post("/v1/analyze", params={"name": "slurm-3884617.out"}, content=TIME_LIMIT_LOG,
                         headers={"content-type": ctype})
        assert r.status_code == 200, (ctype, r.text[:300])
        assert r.headers["content-type"] == "application/json" and r.text == expected
        assert r.headers["x-firstfault-page"] == "/ui/diagnoses/slurm-3884617?attempt=0"
    # No name: the file is "upload.log", as the upload form names a file without one.
    r = await c.post("/v1/analyze?store=false", content=TIME_LIMIT_LOG, headers={"content-type": "text/plain"})
    assert r.status_code == 200 and r.json()["workload_id"] == "upload"
    # A name is a base name only: no folder of the client's reaches the server's disk.
    r = await c.post("/v1/analyze?store=false", params={"name": "../x/../../slurm-7.out"}, content=TIME_LIMIT_LOG,
                     headers={"content-type": "text/plain"})
    assert r.status_code == 200 and r.json()["workload_id"] == "slurm-7"
    for odd in ("..", ".", "a\x00b.log"):
        r = await c.post("/v1/analyze?store=false", params={"name": odd}, content=TIME_LIMIT_LOG,
                         headers={"content-type": "text/plain"})
        assert r.status_code in (200, 422), (odd, r.text[:300])
    # An archive sent as bytes is read as the archive it is, like the form's upload.
    r = await c.post("/v1/analyze?store=false", content=tar_gz(WORKED),
                     headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and r.text == cli_json(WORKED)


async def test_a_gzipped_log_is_read_as_it_expands_within_the_archive_cap(make_client, tmp_path):
    """nvidia-bug-report.sh writes nvidia-bug-report.log.gz; logrotate keeps kern.log.2.gz."""
    import gzip
    zipped = gzip.compress(TIME_LIMIT_LOG)
    expected = cli_json_of_file(tmp_path, "slurm-3884617.out.gz", zipped)
    c = make_client()
    r = await c.post("/v1/analyze?store=false", params={"name": "slurm-3884617.out.gz"}, content=zipped,
                     headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and r.text == expected and r.json()["sub_domain"] == "walltime_exceeded"
    r = await c.post("/v1/analyze?store=false", files={"bundle": ("slurm-3884617.out.gz", zipped, "application/gzip")},
                     headers={"accept": "application/json"})
    assert r.status_code == 200 and r.text == expected
    bomb = gzip.compress(TIME_LIMIT_LOG * 20_000)             # 2.6 MB expanded
    r = await make_client(max_archive_bytes=1024 * 1024).post(
        "/v1/analyze?store=false", params={"name": "dmesg.log.gz"}, content=bomb,
        headers={"content-type": "application/octet-stream"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_ARCHIVE_BYTES"


async def test_a_plain_text_body_keeps_every_limit_and_says_what_is_wrong(make_client):
    three = b"line one\nline two\nline three\n"
    r = await make_client(max_lines=2).post("/v1/analyze", content=three, headers={"content-type": "text/plain"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_LINES"
    r = await make_client(max_body_bytes=10).post("/v1/analyze", content=three, headers={"content-type": "text/plain"})
    assert r.status_code == 413 and error_of(r)["limit"] == "FIRSTFAULT_MAX_BODY_BYTES"
    c = make_client()
    r = await c.post("/v1/analyze", content=b"", headers={"content-type": "text/plain"})
    assert r.status_code == 422 and "empty" in error_of(r)["message"]
    r = await c.post("/v1/analyze", content=b"\x00\x01\x02binary\x00", headers={"content-type": "application/octet-stream"})
    assert r.status_code == 422 and "binary" in error_of(r)["message"]
    r = await c.post("/v1/analyze", params={"name": "x" * 300}, content=three, headers={"content-type": "text/plain"})
    assert r.status_code == 422


async def test_a_form_upload_answers_json_to_a_client_that_asks_for_json(make_client, tmp_path):
    """Issue 25: `curl -F` got a 303 with an empty body even when asking for JSON."""
    expected = cli_json_of_file(tmp_path, "slurm-3884617.out", TIME_LIMIT_LOG)
    c = make_client()
    for accept in ("application/json", "*/*", "application/json, text/html;q=0.5"):
        r = await c.post("/v1/analyze", files={"bundle": ("slurm-3884617.out", TIME_LIMIT_LOG, "text/plain")},
                         headers={"accept": accept})
        assert r.status_code == 200, (accept, r.status_code)
        assert r.headers["content-type"] == "application/json" and r.text == expected
        assert r.headers["x-firstfault-page"] == "/ui/diagnoses/slurm-3884617?attempt=0"
    # A browser's form navigation still lands on the page.
    r = await c.post("/v1/analyze", files={"bundle": ("slurm-3884617.out", TIME_LIMIT_LOG, "text/plain")},
                     headers={"accept": BROWSER_ACCEPT})
    assert r.status_code == 303 and r.headers["location"] == "/ui/diagnoses/slurm-3884617?attempt=0"
    r = await c.post("/v1/analyze", files={"bundle": ("x.log", TIME_LIMIT_LOG, "text/plain")},
                     headers={"accept": "text/html"})
    assert r.status_code == 303


async def test_context_kept_per_diagnosis_is_bounded_and_a_missing_one_says_why(make_client, monkeypatch):
    from firstfault.connectors.api import excerpts as ex
    monkeypatch.setattr(ex, "MAX_KEPT_CHARS", 300)
    c = make_client()
    d = Diagnosis.model_validate_json((await c.post("/v1/analyze", json=payload(WORKED))).text)
    kept = c.app.state.ctx.store.lines(d.diagnosis_id)
    assert sum(len(t) for lines in kept.values() for t in lines.values()) < 300 + ex.MAX_LINE_CHARS
    missing = next(s.sample for s in d.symptoms if s.sample.path not in kept or str(s.sample.line) not in kept[s.sample.path])
    got = (await c.get("/v1/lines/slurm-4471823", params={"path": missing.path, "line": missing.line})).json()
    assert got["source"] == "none" and "first 200 references" in got["note"]


@pytest.mark.parametrize("query", ["limit=abc&limit=5", "limit=5&limit=5", "limit=%0A5", "limit=%205", "limit=5%09"])
async def test_a_query_is_taken_at_its_word_or_refused(make_client, query):
    """A repeated parameter, or a value with blanks or control characters around it, is not read as
    some other valid request (Starlette kept the last value; pydantic read '\\n5' as 5): 422."""
    c = make_client()
    for path in ("/v1/nodes", "/v1/diagnoses"):
        r = await c.get(f"{path}?{query}")
        assert r.status_code == 422, (path, query, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == "invalid_request"
    assert (await c.get("/v1/nodes?limit=5")).status_code == 200
    assert (await c.get("/v1/diagnoses?limit=5")).status_code == 200


async def test_stored_diagnoses_are_capped_and_the_listing_says_what_was_dropped(make_client):
    """Issue 22, item 4: every POST /v1/analyze stored its diagnosis and lines, without end."""
    c = make_client(store_max_diagnoses=2, store_ttl_days=30)
    line = b"Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
    for i in range(4):
        r = await c.post(f"/v1/analyze?name=slurm-{i}.out", content=line, headers={"content-type": "text/plain"})
        assert r.status_code == 200 and r.headers["X-Firstfault-Stored"] == "true"
    body = (await c.get("/v1/diagnoses")).json()
    assert len(body["items"]) == 2
    kept = body["retention"]
    assert (kept["max_diagnoses"], kept["ttl_days"], kept["kept"], kept["dropped"]) == (2, 30, 2, 2)
    assert kept["dropped_by"] == {"count": 2, "bytes": 0, "ttl": 0} and kept["oldest_kept_stored_at"]
    page = await c.get("/ui/")
    assert "2 older diagnoses were dropped" in page.text and "FIRSTFAULT_STORE_MAX_DIAGNOSES" in page.text


def test_retention_settings_come_from_the_environment():
    s = ServiceSettings.from_env({"FIRSTFAULT_STORE_MAX_DIAGNOSES": "10", "FIRSTFAULT_STORE_MAX_BYTES": "1G",
                                  "FIRSTFAULT_STORE_TTL_DAYS": "0"})
    assert (s.retention.max_diagnoses, s.retention.max_bytes, s.retention.ttl_days) == (10, 1 << 30, 0)
    with pytest.raises(ValueError, match="FIRSTFAULT_STORE_MAX_DIAGNOSES"):
        ServiceSettings.from_env({"FIRSTFAULT_STORE_MAX_DIAGNOSES": "0"})


async def test_schema_valid_requests_are_answered_not_refused(make_client):
    """Issue 22, item 7: requests the OpenAPI document calls valid were answered 422: a page cursor
    (any string was valid, few were accepted), a text parameter with blanks or control characters
    (it is taken as written: nothing converts it), a 255-character file name of 2-byte characters."""
    c = make_client()
    c.app.state.ctx.store.save(stored("cur-1"), datetime(2026, 11, 2, 1, tzinfo=timezone.utc))
    c.app.state.ctx.store.save(stored("cur-2"), datetime(2026, 11, 2, 2, tzinfo=timezone.utc))
    first = (await c.get("/v1/diagnoses", params={"limit": 1})).json()
    assert [d["workload_id"] for d in first["items"]] == ["cur-2"] and first["next_cursor"]
    rest = (await c.get("/v1/diagnoses", params={"limit": 1, "cursor": first["next_cursor"]})).json()
    assert [d["workload_id"] for d in rest["items"]] == ["cur-1"] and rest["next_cursor"] is None
    schema = (await c.get("/openapi.json")).json()
    cursor = next(p for p in schema["paths"]["/v1/diagnoses"]["get"]["parameters"] if p["name"] == "cursor")
    assert cursor["schema"]["anyOf"][0]["pattern"]
    for any_position in ("0:0:x", "-5:12:a b/c\x85", "9999999999999999:0:zz"):       # every one the pattern allows
        for path in ("/v1/diagnoses", "/v1/nodes/node-02/diagnoses"):
            r = await c.get(path, params={"cursor": any_position})
            assert r.status_code == 200, (path, any_position, r.text[:200])
    r = await c.get("/v1/diagnoses", params={"cursor": "garbage"})
    assert r.status_code == 422 and "cursor" in r.json()["error"]["message"]     # not of the documented form
    for params in ({"node": "node-02\x85"}, {"domain": " gpu "}, {"node": "a\tb"}):
        r = await c.get("/v1/diagnoses", params=params)
        assert r.status_code == 200 and r.json()["items"] == [], (params, r.text[:200])
    r = await c.get("/v1/lines/cur-1", params={"path": "logs/\x1dx", "line": 1})
    assert r.status_code == 200, r.text[:200]
    line = b"Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
    r = await c.post("/v1/analyze", params={"name": "é" * 250 + ".out", "store": "false"}, content=line,
                     headers={"content-type": "text/plain"})
    assert r.status_code == 200, r.text[:200]
    assert r.json()["workload_id"].startswith("é" * 100)


async def test_an_upload_with_a_100kb_file_name_is_a_422_not_a_500(make_client):
    """Issue 22, item 7 (a 500 in the probe campaign; refused since the upload took file names)."""
    c = make_client()
    line = b"Nov  2 10:03:11 node-02 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
    for name in ("a" * 100_000 + ".log", "é" * 60_000 + ".log", "d/" * 50_000 + "x" * 300):
        for accept in ("*/*", "text/html"):
            r = await c.post("/v1/analyze", files={"bundle": (name, line)}, headers={"Accept": accept})
            assert r.status_code == 422, (name[:20], r.status_code, r.text[:200])
            assert "longer than 255 characters" in r.json()["error"]["message"]
    assert (await c.get("/v1/diagnoses")).json()["items"] == []
