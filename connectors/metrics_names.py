"""Every Prometheus metric firstfault exports, by the name a query uses.

``ops/prometheus/alerts.yml`` and ``ops/grafana/firstfault.json`` may name only
these (``tests/test_ops.py`` checks), so a renamed metric breaks a test instead of
silently emptying a panel. Names are the sample names as scraped: counters end in
``_total``; a histogram is declared once and queried as ``_bucket``/``_sum``/``_count``.

Who exports what (``EXPORTED_BY`` below says the same for tests):

* the REST service (``connectors/api/metrics.py``): ``HTTP_*``, ``API_DIAGNOSES``, on
  its own port (``/metrics`` beside its ``/healthz`` and ``/readyz``);
* the extractor (``streams/extractor.py``): ``CONSUMER_LAG``, ``RECORDS_CONSUMED``,
  ``DEADLETTER``, ``POISON_RECORDS``, ``PUBLISH_ERRORS`` (producer delivery failures, ``sink="kafka"``);
* the correlator (``streams/correlator.py``): ``CONSUMER_LAG``, ``RECORDS_CONSUMED``,
  ``DEADLETTER``, ``POISON_RECORDS``, ``STREAM_DIAGNOSES``, ``FINALIZATION_LATENCY``, ``WORKLOADS_OPEN``,
  ``WORKLOADS_AWAITING_EXTRACTORS``, ``PUBLISH_ERRORS`` (``sink`` kafka or redis), ``PARTITION_UNREAD``
  (every partition of its inputs and of the raw topic, owned by anyone or by nobody);
* the scheduler connectors (``slurm.py``, ``kubernetes.py``): ``SCHEDULER_EVENTS``,
  ``CONNECTOR_ERRORS``, ``CONNECTOR_LAST_SUCCESS``;
* the alerting sink (``sinks/alerts.py``): ``ALERT_*``, ``ALERTS_*``;
* the recovery sink (``sinks/recovery.py``): ``RECOVERY_DECISIONS``.

Every stream worker and connector serves its metrics on ``FIRSTFAULT_METRICS_PORT``
(default ``METRICS_PORT``, ``0``: off) together with the Kubernetes probes ``/healthz``
(its loop is alive) and ``/readyz`` (it is connected and working):
``firstfault.streams.health``. ``CONSUMER_LAG`` is the high watermark the consumer's
last fetch reported minus its position (the extractor's next offset to read, the
correlator's next offset to process), per assigned partition, refreshed every 5 s.
"""
from __future__ import annotations

import re

METRICS_PORT = 9464           # default for FIRSTFAULT_METRICS_PORT (workers and connectors)

# --- REST service (exported today by connectors/api/metrics.py)
HTTP_REQUESTS = "firstfault_http_requests_total"                      # labels: method, route, status
HTTP_REQUEST_DURATION = "firstfault_http_request_duration_seconds"    # histogram: method, route
API_DIAGNOSES = "firstfault_diagnoses_total"                          # labels: status, domain

# --- stream workers (extractor, correlator)
CONSUMER_LAG = "firstfault_consumer_lag_messages"                     # gauge: worker, topic, partition
RECORDS_CONSUMED = "firstfault_records_consumed_total"                # counter: worker, topic
DEADLETTER = "firstfault_deadletter_total"                            # counter: stage
STREAM_DIAGNOSES = "firstfault_stream_diagnoses_total"                # counter: status, kind (provisional|final|revision)
FINALIZATION_LATENCY = "firstfault_finalization_latency_seconds"      # histogram: scheduler end event -> final diagnosis published
WORKLOADS_OPEN = "firstfault_workloads_open"                          # gauge: attempts held in correlator state
PUBLISH_ERRORS = "firstfault_publish_errors_total"                    # counter: sink (kafka|redis)
# One record the worker could not use, by where it failed; each also goes to the dead-letter topic.
POISON_RECORDS = "firstfault_poison_records_total"                    # counter: worker, stage (POISON_STAGES)
# Ended attempts past their grace whose final waits for the extractors to read the raw topic that far.
WORKLOADS_AWAITING_EXTRACTORS = "firstfault_workloads_awaiting_extractors"   # gauge
# Per partition of the correlator's inputs and of the raw topic: how long records have waited there while
# its readers (the group's committed offset, the extractors' reported position) did not move: 0 while read.
PARTITION_UNREAD = "firstfault_partition_unread_seconds"              # gauge: topic, partition
# The rule catalog a worker runs (streams/rules_feed.py): 1 on its current version; catalogs it refused.
RULES_VERSION_INFO = "firstfault_rules_version_info"                  # gauge: worker, rules_version
RULES_LOAD_FAILURES = "firstfault_rules_load_failures_total"          # counter: worker
POISON_STAGES = ("decode", "extract", "encode", "publish", "timeline", "process", "decide")

# --- scheduler connectors (slurm, kubernetes)
SCHEDULER_EVENTS = "firstfault_scheduler_events_total"                # counter: scheduler, type (start|end)
CONNECTOR_ERRORS = "firstfault_connector_errors_total"                # counter: connector
CONNECTOR_LAST_SUCCESS = "firstfault_connector_last_success_timestamp_seconds"  # gauge: connector

# --- alerting sink
ALERT_QUEUE_DEPTH = "firstfault_alert_queue_depth"                    # gauge: webhook (the backlog)
ALERT_OLDEST_AGE = "firstfault_alert_oldest_pending_seconds"          # gauge: webhook
ALERTS_SENT = "firstfault_alerts_sent_total"                          # counter: webhook
ALERT_ATTEMPT_FAILURES = "firstfault_alert_attempt_failures_total"    # counter: webhook (each failed try)
ALERTS_DROPPED = "firstfault_alerts_dropped_total"                    # counter: webhook, reason (queue_full|rejected)
ALERTS_SKIPPED = "firstfault_alerts_skipped_total"                    # counter: reason (duplicate|filtered)

# --- recovery sink
RECOVERY_DECISIONS = "firstfault_recovery_decisions_total"            # counter: decision (acted|dry_run|refused|failed)

EXPORTED_BY: dict[str, tuple[str, ...]] = {
    "service": (HTTP_REQUESTS, HTTP_REQUEST_DURATION, API_DIAGNOSES),
    "extractor": (CONSUMER_LAG, RECORDS_CONSUMED, DEADLETTER, POISON_RECORDS, PUBLISH_ERRORS,
                  RULES_VERSION_INFO, RULES_LOAD_FAILURES),
    "correlator": (CONSUMER_LAG, RECORDS_CONSUMED, DEADLETTER, POISON_RECORDS, STREAM_DIAGNOSES,
                   FINALIZATION_LATENCY, WORKLOADS_OPEN, WORKLOADS_AWAITING_EXTRACTORS, PUBLISH_ERRORS,
                   PARTITION_UNREAD, RULES_VERSION_INFO, RULES_LOAD_FAILURES),
    "slurm": (SCHEDULER_EVENTS, CONNECTOR_ERRORS, CONNECTOR_LAST_SUCCESS),
    "kubernetes": (SCHEDULER_EVENTS, CONNECTOR_ERRORS, CONNECTOR_LAST_SUCCESS),
    "alerts": (ALERT_QUEUE_DEPTH, ALERT_OLDEST_AGE, ALERTS_SENT, ALERT_ATTEMPT_FAILURES, ALERTS_DROPPED, ALERTS_SKIPPED),
    "recovery": (RECOVERY_DECISIONS,),
}

HISTOGRAMS = frozenset({HTTP_REQUEST_DURATION, FINALIZATION_LATENCY})
DECLARED = frozenset(v for k, v in dict(globals()).items()
                     if k.isupper() and isinstance(v, str) and v.startswith("firstfault_"))

_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def family(sample: str) -> str:
    """``x_bucket`` -> ``x`` for declared histograms; any other name unchanged."""
    base = _SUFFIX.sub("", sample)
    return base if base in HISTOGRAMS else sample


def is_declared(sample: str) -> bool:
    return family(sample) in DECLARED


def base_name(sample: str) -> str:
    """The name prometheus_client wants: it appends ``_total`` to counters itself."""
    return sample[: -len("_total")] if sample.endswith("_total") else sample
