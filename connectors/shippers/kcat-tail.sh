#!/bin/sh
# firstfault: ship one file's lines to the raw topic with kcat (Debian: apt install kcat).
#
#   kcat-tail.sh [--once] FILE [WORKLOAD_ID]
#
# Follows FILE from its first line (tail -F: across rotation and truncation); --once
# sends what the file holds and exits (a finished job's output). Each line is one
# message keyed by the host, with headers the extractor reads (streams/codecs.py):
# host, path, and workload_id when given (a job's own output file). Environment:
#   FIRSTFAULT_KAFKA_BOOTSTRAP   brokers (required)
#   FIRSTFAULT_TOPIC_PREFIX      topic prefix (default "firstfault."; the topic is <prefix>raw)
#   FIRSTFAULT_HOST              the host the file belongs to (default: hostname)
#   FIRSTFAULT_SOURCE            app | syslog | fabricmanager (default: from the file's name)
set -eu
follow=-F
if [ "${1:-}" = "--once" ]; then follow=; shift; fi
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: kcat-tail.sh [--once] FILE [WORKLOAD_ID]" >&2
    exit 2
fi
file=$1
workload=${2:-}
: "${FIRSTFAULT_KAFKA_BOOTSTRAP:?FIRSTFAULT_KAFKA_BOOTSTRAP is not set}"
topic="${FIRSTFAULT_TOPIC_PREFIX-firstfault.}raw"
host=${FIRSTFAULT_HOST:-$(hostname)}
set -- -P -b "$FIRSTFAULT_KAFKA_BOOTSTRAP" -t "$topic" -k "$host" -H "host=$host" -H "path=$file" \
    -X linger.ms=100 -X message.max.bytes=10485760
if [ -n "${FIRSTFAULT_SOURCE:-}" ]; then set -- "$@" -H "source=$FIRSTFAULT_SOURCE"; fi
if [ -n "$workload" ]; then set -- "$@" -H "workload_id=$workload"; fi
# tail's own output is line-buffered into the pipe; kcat sends one message per line.
# shellcheck disable=SC2086
tail -n +1 $follow "$file" | kcat "$@"
