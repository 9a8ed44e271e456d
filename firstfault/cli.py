"""firstfault: say why a distributed training job failed, from the first fault rather than its echoes."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from firstfault.rules.bundle import ArchiveLimitError
from firstfault.rules.errors import BundleError, CatalogError, FirstfaultError

from .term import Printable, printable


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"FIRSTFAULT_{name}", default)


def _say(message: str) -> None:
    """One line on stderr; what it echoes (a file name, a workload id, an address) is shown escaped."""
    print(printable(f"firstfault: {message}"), file=sys.stderr)


def _size(text: str) -> int:
    from firstfault.rules.bundle import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _jobs(asked: int | None) -> int:
    """--jobs, else every CPU this process may use (its affinity: one under taskset -c 0), at most 8."""
    from firstfault.rules.fanout import MAX_JOBS, usable_cpus

    return asked if asked is not None else min(usable_cpus(), MAX_JOBS)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, 1 or more: {text!r}")
    return n


def cmd_analyze(args: argparse.Namespace) -> int:
    from firstfault.rules.engine import analyze_path

    from .progress import Bar
    from .render import summary

    bar = Bar("reading")
    try:
        # The archive cap: --max-archive-bytes, else FIRSTFAULT_MAX_ARCHIVE_BYTES, else 1 GiB.
        result = analyze_path(args.path, rules=args.rules, progress=bar, max_archive_bytes=args.max_archive_bytes,
                              warn=lambda m: _say(f"warning: {m}"), jobs=_jobs(args.jobs))
    finally:
        bar.close()
    if args.json:
        sys.stdout.write(result.diagnosis.to_json() + "\n")
    else:
        st = result.stats
        stats = {"files": st.files, "lines": st.lines, "candidates": st.candidates,
                 "matched": st.matched, "unparsed": st.unparsed}
        out = getattr(sys.stdout, "wrapped", sys.stdout)       # the summary escapes itself, around its colours
        out.write(summary(result.diagnosis, stats, color=out.isatty()) + "\n")
    return 0


def cmd_rules_test(args: argparse.Namespace) -> int:
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.ruletest import run_rule_tests

    results = run_rule_tests(load_catalog(args.rules), only=args.only)
    passed = sum(r.passed for r in results)
    failed = sum(len(r.failures) for r in results)
    if args.json:
        json.dump({"passed": passed, "failed": failed, "rules": len(results),
                   "failures": [{"rule_id": r.rule_id, "file": r.file, "problem": f}
                                for r in results for f in r.failures]}, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        for r in results:
            for f in r.failures:
                print(f"FAIL {r.rule_id} ({r.file}): {f}")
        print(f"rules test: {len(results)} rules, {passed} examples passed, {failed} failed")
    return 1 if failed else 0


def cmd_rules_lint(args: argparse.Namespace) -> int:
    from firstfault.rules.catalog import lint_catalog

    errors = lint_catalog(args.rules)
    if args.json:
        json.dump({"errors": [{"file": e.file, "rule_id": e.rule_id, "problem": e.problem} for e in errors]},
                  sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        for e in errors:
            print(str(e))
        print(f"rules lint: {len(errors)} problem{'s' if len(errors) != 1 else ''}")
    return 1 if errors else 0


def cmd_rules_list(args: argparse.Namespace) -> int:
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.python import ordered

    cat = load_catalog(args.rules)
    rows = [("extract", p.id, p.priority, p.title) for p in cat.patterns]
    rows += [("early", r.id, r.priority, r.title) for r in cat.early]
    rows += [("final", r.id, r.priority, r.title) for r in cat.explains]
    rows += [("final/python", r.id, r.priority, r.title) for r in ordered()]
    if args.json:
        json.dump({"rules_version": cat.version, "rules": [dict(zip(("stage", "id", "priority", "title"), r)) for r in rows]},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for stage, rid, prio, title in rows:
            print(f"{stage:13} {prio:>5}  {rid:48} {title}")
        print(f"{len(rows)} rules, version {cat.version}")
    return 0


def _stream_config(args: argparse.Namespace):
    from firstfault.streams.config import StreamConfig

    return StreamConfig.from_env(bootstrap=getattr(args, "bootstrap", None), redis_url=getattr(args, "redis_url", None),
                                 prefix=getattr(args, "prefix", None))


def cmd_ship(args: argparse.Namespace) -> int:
    from firstfault.connectors.shipper import ship
    from firstfault.streams import kafka

    from .progress import Bar

    cfg = _stream_config(args)
    if not cfg.bootstrap:
        from firstfault.streams.runfile import NO_BROKER

        _say(NO_BROKER)
        return 2
    kafka.ensure_topics(cfg)
    bar = Bar("shipping", min_total=100_000)
    try:
        stats = ship(args.path, cfg, rate=args.rate, end=not args.no_end, progress=bar, gone=_up_gone(args),
                     warn=lambda m: _say(f"warning: {m}"))
    finally:
        bar.close()
    summary = {"lines": stats.lines, "files": stats.files, "bytes": stats.bytes, "seconds": round(stats.seconds, 3),
               "topics": {"raw": cfg.topic("raw"), "scheduler": cfg.topic("scheduler")}}
    if args.json:
        json.dump(summary, sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
    else:
        from firstfault.streams.follow import timings

        files = f"{stats.files} file{'' if stats.files == 1 else 's'}"
        if args.no_end:
            print(f"shipped {stats.lines:,} lines from {files} to {cfg.topic('raw')} in {stats.seconds:.2f} s, with "
                  f"the scheduler start on {cfg.topic('scheduler')} and no end: the workload stays running, so no "
                  "final diagnosis comes until its end event does")
        else:
            # Nothing is published for the grace period: say so, and where the diagnosis will show.
            grace = timings(cfg, getattr(args, "up_run", None)).grace_cap_s
            print(f"shipped {stats.lines:,} lines from {files} to {cfg.topic('raw')} in {stats.seconds:.2f} s, with "
                  f"the scheduler start and end on {cfg.topic('scheduler')}; its final diagnosis comes about "
                  f"{grace:g} s after the end (the grace period): firstfault diagnoses")
    return 0


def _up_gone(args: argparse.Namespace):
    """For a broker found through `up`'s run file: a check that says why it is gone once that `up` stopped."""
    run = getattr(args, "up_run", None)
    if run is None:
        return None
    from firstfault.streams import runfile

    path, pid = run

    def gone() -> str | None:
        info = runfile.lookup(path).info
        if info is not None and info.pid == pid:
            return None
        return f"`firstfault up` (pid {pid}) stopped: its embedded broker, and everything on it, are gone"
    return gone


# Commands that talk to the broker: a flag or variable names it, else a running `firstfault up`'s run file.
BROKER_COMMANDS = ("ship", "diagnoses", "replay", "topology")


def _connect(args: argparse.Namespace) -> None:
    """Where the broker (and its Redis) is, checked to answer: else one line and exit 2 (a FirstfaultError)."""
    from firstfault.streams import reach, runfile

    try:
        where = runfile.resolve(args.bootstrap, getattr(args, "redis_url", None), getattr(args, "prefix", None))
    except runfile.NoBroker:
        if args.command == "topology":
            return                       # it describes the pipeline `up` would start: no broker needed
        raise
    args.bootstrap, args.prefix = where.bootstrap, where.prefix
    args.up_run = (where.path, where.run.pid) if where.run is not None else None
    if hasattr(args, "redis_url"):
        args.redis_url = where.redis_url
    if where.run is None:
        hint = "check FIRSTFAULT_KAFKA_BOOTSTRAP or --bootstrap (unset both to use a running `firstfault up`)"
    else:
        hint = (f"`firstfault up` (pid {where.run.pid}, run file {where.path}) should serve it: see "
                f"{where.run.log_file or 'its log'}, or restart it")
    reach.check_broker(where.bootstrap, hint)
    if where.redis_url and args.command in ("diagnoses", "replay"):
        reach.check_redis(where.redis_url, "check FIRSTFAULT_REDIS_URL or --redis-url" if where.run is None
                          else f"`firstfault up` (pid {where.run.pid}) uses it: start that Redis, or set FIRSTFAULT_REDIS_URL")


def _serve_store(argv: list[str]) -> None:
    """`serve` with no store given uses a running `firstfault up`'s Redis, so its pages show the stream's diagnoses."""
    if any(a == "--redis-url" or a.startswith("--redis-url=") for a in argv) or _env("REDIS_URL"):
        return
    from firstfault.streams.runfile import stored_redis

    url = stored_redis()
    if url:
        os.environ["FIRSTFAULT_REDIS_URL"] = url


def _add_stream_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (FIRSTFAULT_KAFKA_BOOTSTRAP)")
    p.add_argument("--redis-url", help="Redis URL (FIRSTFAULT_REDIS_URL)")
    p.add_argument("--prefix", help="topic prefix (FIRSTFAULT_TOPIC_PREFIX, default 'firstfault.')")


# The stream module that registers each of its commands. Only the module of the command being run
# is imported: each pulls in the stream stack, and `analyze` of a small file should start at once.
STREAM_COMMANDS = {"up": "up", "topology": "up", "diagnoses": "follow", "replay": "replay", "nodes": "node_health"}
RULES_LOCAL = ("test", "lint", "list")      # rules commands that need no broker


class _Unparsed(Exception):
    """The partial command line could not parse the arguments: the whole one will say why."""


class _Partial(argparse.ArgumentParser):
    """A command line holding only the command being run: its errors are left to the whole one,
    whose usage names every command."""

    def error(self, message: str) -> NoReturn:
        raise _Unparsed(message)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The whole command line, or, when ``argv`` names a command (and asks no help of the top level),
    only what that command needs: the others' stream modules are not imported."""
    command = argv[0] if argv else None
    known = command in STREAM_COMMANDS or command in ("analyze", "ship", "serve", "rules")
    only = command if known else None
    parser = (_Partial if only else argparse.ArgumentParser)(
        prog="firstfault", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  firstfault analyze job.log                 one log file, as posted\n"
               "  firstfault analyze bundle/ --json          a bundle or any folder of logs; the diagnosis as JSON\n"
               "  firstfault up                              the streaming pipeline, embedded broker\n"
               "  firstfault rules lint && firstfault rules test\n"
               "'firstfault COMMAND --help' says more about each command.")
    parser.add_argument("--version", action="version", version=f"firstfault {__import__('firstfault').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "analyze", help="diagnose one workload attempt from a log file, a folder of logs or a bundle",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n"
               "  0    a diagnosis, whatever its status (attributed, ambiguous, unattributed, no_failure)\n"
               "  2    no diagnosis: an unusable input (missing, unreadable, empty, a damaged or too large archive,\n"
               "       no line to read), a rule catalog that does not load, or a wrong option; one line on stderr\n"
               "  130  interrupted (Ctrl-C)\n"
               "examples:\n"
               "  firstfault analyze slurm-1234.out                 one job's output file\n"
               "  firstfault analyze logs/ --json | jq .summary     a folder of logs; the diagnosis object")
    p.add_argument("path", help="a log file, a folder of logs in any layout, or a bundle (folder, .tar.gz or .zip)")
    p.add_argument("--json", action="store_true",
                   help="print exactly the diagnosis object (docs/diagnosis.md), not the summary for a person")
    p.add_argument("--rules", default=_env("RULES"), metavar="DIR",
                   help="a rules directory laid over the built-in catalog (FIRSTFAULT_RULES)")
    p.add_argument("--max-archive-bytes", type=_size, metavar="SIZE",
                   help="cap on an archive's uncompressed size, any member and all together, e.g. 4G "
                        "(FIRSTFAULT_MAX_ARCHIVE_BYTES, default 1G)")
    p.add_argument("--jobs", type=_positive, metavar="N",
                   help="processes reading a big input's files (16 MiB or more in two files or more; the "
                        "diagnosis is the same): default every CPU this process may use, at most 8")
    p.set_defaults(fn=cmd_analyze)

    p = sub.add_parser("ship", help="publish what analyze takes (a bundle, a log file or a folder of logs) to the "
                                    "stream as a cluster would: scheduler start, every host's lines, scheduler end")
    p.add_argument("path", help="what analyze takes: a bundle (directory, .tar.gz, .zip), a log file or a folder of logs")
    p.add_argument("--rate", type=float, help="lines per second (default: as fast as possible)")
    p.add_argument("--no-end", action="store_true",
                   help="do not send the scheduler end event (the workload stays running: no final diagnosis)")
    p.add_argument("--json", action="store_true",
                   help="what was shipped as one JSON object (lines, files, bytes, seconds, topics)")
    _add_stream_flags(p)
    p.set_defaults(fn=cmd_ship)

    sub.add_parser("serve", add_help=False, help="the REST service and diagnosis pages (firstfault serve --help)")
    import importlib

    for module in dict.fromkeys(STREAM_COMMANDS.values()):      # up (and topology), diagnoses, replay, nodes
        if only is None or STREAM_COMMANDS.get(only) == module:
            importlib.import_module(f"firstfault.streams.{module}").register(sub)

    rules = sub.add_parser("rules", help="test, lint and list the rule catalog; publish, shadow, promote and roll it back")
    rsub = rules.add_subparsers(dest="rules_command", required=True)
    codes = "exit codes: 0 {ok}; 1 {bad}; 2 the catalog does not load (one line on stderr)"
    for name, fn, helptext, json_help, exits in (
            ("test", cmd_rules_test, "run every rule's own examples: the real lines that must and must not fire it",
             "the counts and each failure (rule id, file, problem) as one JSON object",
             codes.format(ok="every example passed", bad="an example failed")),
            ("lint", cmd_rules_lint, "check the catalog: format, taxonomy, kinds and fields a rule names, linear-time "
                                     "regexes that cannot backtrack",
             "each problem (file, rule id, problem) as one JSON object", codes.format(ok="no problem", bad="a problem")),
            ("list", cmd_rules_list, "list every rule by stage and priority, with its id and title, and the catalog "
                                     "version",
             "the catalog version and every rule (stage, id, priority, title) as one JSON object", "")):
        rp = rsub.add_parser(name, help=helptext, epilog=exits or None)
        rp.add_argument("--rules", default=_env("RULES"), metavar="DIR",
                        help="a rules directory laid over the built-in catalog (FIRSTFAULT_RULES)")
        rp.add_argument("--json", action="store_true", help=json_help)
        if name == "test":
            rp.add_argument("--only", help="only rules whose id starts with this")
        rp.set_defaults(fn=fn)
    if only is None or (only == "rules" and (list(argv[1:2]) or [""])[0] not in RULES_LOCAL):
        from firstfault.streams import rules_cli

        rules_cli.register(rsub, _connect, _add_stream_flags)     # publish, shadow, promote, rollback
    _describe(sub)
    _describe(rsub)
    return parser


def _describe(sub: argparse._SubParsersAction) -> None:
    """Each command's --help opens with what it does (its one-line help), not with nothing."""
    for action in sub._choices_actions:
        cmd = sub.choices.get(action.dest)
        if cmd is not None and not cmd.description and action.help:
            cmd.description = action.help[0].upper() + action.help[1:] + "."


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        # The service parses its own flags (and re-imports itself in each uvicorn worker).
        from firstfault.connectors.api.serve import serve_main

        _serve_store(argv[1:])
        return serve_main(argv[1:])
    try:
        args = build_parser(argv).parse_args(argv)
    except _Unparsed:
        args = build_parser().parse_args(argv)      # prints the error with the whole usage, exits 2
    stdout = sys.stdout
    if not getattr(args, "json", False):
        # Human text made elsewhere (diagnoses' table, replay's report, ship's and up's lines) carries
        # ids and lines from the data: escaped on its way out. --json stays exactly what it was.
        sys.stdout = Printable(stdout)
    try:
        if args.command in BROKER_COMMANDS:
            _connect(args)
        return args.fn(args)
    except ArchiveLimitError as exc:
        raise_it = ("--max-archive-bytes or FIRSTFAULT_MAX_ARCHIVE_BYTES" if exc.limit == "bytes"
                    else "a smaller archive, or unpack it and pass the folder")
        _say(f"unusable input: {exc}; to allow more, use {raise_it}")
        return 2
    except BundleError as exc:
        _say(f"unusable input: {exc}")
        return 2
    except CatalogError as exc:
        _say(f"rule catalog error: {exc}")
        return 2
    except FirstfaultError as exc:
        _say(str(exc))
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:              # unreadable input (permissions, a file vanished): not a crash
        where = f"{exc.filename}: " if exc.filename else ""
        _say(f"cannot read {where}{exc.strerror or exc}")
        return 2
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    finally:
        sys.stdout = stdout


if __name__ == "__main__":
    raise SystemExit(main())
