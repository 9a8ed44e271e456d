"""``firstfault rules publish|shadow|promote|rollback``: rule catalogs on the ``rules`` topic (rules_feed.py)."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable

from .config import StreamConfig

CONFIGURED = "the workers' configured catalog"


def _name(version: str | None) -> str:
    return version or CONFIGURED


def _cfg(args: argparse.Namespace) -> StreamConfig:
    return StreamConfig.from_env(bootstrap=args.bootstrap, redis_url=getattr(args, "redis_url", None), prefix=args.prefix)


def _refused(what: str, path: str, problems: list[str]) -> int:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    print(f"firstfault: {what} refused: {problems[0]}{more}; see `firstfault rules lint --rules {path}` and "
          f"`firstfault rules test --rules {path}`", file=sys.stderr)
    return 2


def _emit(args: argparse.Namespace, data: dict, text: str) -> int:
    if args.json:
        json.dump(data, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(text)
    return 0


def _put_version(args: argparse.Namespace, connect: Callable[[argparse.Namespace], None], command: str):
    """Gate the overlay (rules lint and rules test), then put its version on the rules topic:
    (cfg, bundle), or the refusal's exit code."""
    from . import rules_feed as feed

    problems = feed.gate(args.path)
    if problems:
        return _refused(command, args.path, problems)
    connect(args)
    cfg = _cfg(args)
    feed.ensure_topic(cfg)
    bundle = feed.bundle_of(args.path, args.author or "", args.message or "")
    feed.publish_record(cfg, feed.version_key(bundle.rules_version), bundle)
    return cfg, bundle


def cmd_publish(args: argparse.Namespace, connect: Callable[[argparse.Namespace], None]) -> int:
    from . import rules_feed as feed

    put = _put_version(args, connect, "rules publish")
    if isinstance(put, int):
        return put
    cfg, bundle = put
    live = feed.move_live(cfg, feed.read_state(cfg), bundle.rules_version, bundle.author, bundle.message)
    was = live.history[0] if live.history else None
    return _emit(args, {"rules_version": bundle.rules_version, "files": sorted(bundle.files), "author": bundle.author,
                        "message": bundle.message, "topic": cfg.topic("rules"), "previous": was},
                 f"published {bundle.rules_version} ({len(bundle.files)} file{'s' if len(bundle.files) != 1 else ''}, "
                 f"by {bundle.author}) to {cfg.topic('rules')}: live now, was {_name(was)}; the workers load it "
                 f"between batches (`firstfault rules rollback` undoes it)")


def cmd_promote(args: argparse.Namespace, connect: Callable[[argparse.Namespace], None]) -> int:
    from . import rules_feed as feed
    from firstfault.rules.errors import FirstfaultError

    connect(args)
    cfg = _cfg(args)
    state = feed.read_state(cfg)
    if feed.bundle(state, args.version) is None:
        raise FirstfaultError(f"no published catalog {args.version} on {cfg.topic('rules')}: `firstfault rules publish "
                              "DIR` or `firstfault rules shadow DIR` puts one there")
    live = feed.move_live(cfg, state, args.version, args.author or feed.default_author(), args.message or "promote")
    was = live.history[0] if live.history else None
    return _emit(args, {"rules_version": args.version, "previous": was, "topic": cfg.topic("rules")},
                 f"live rules now {args.version}, was {_name(was)}")


def cmd_rollback(args: argparse.Namespace, connect: Callable[[argparse.Namespace], None]) -> int:
    from . import rules_feed as feed
    from firstfault.rules.errors import FirstfaultError

    connect(args)
    cfg = _cfg(args)
    live = feed.pointer(feed.read_state(cfg), feed.LIVE)
    if live is None or not live.history:
        raise FirstfaultError(f"nothing to roll back to: {cfg.topic('rules')} has no earlier live catalog")
    # Rollback pops the history (a second rollback goes further back, it does not flip back).
    new = feed.Pointer(rules_version=live.history[0], history=live.history[1:],
                       author=args.author or feed.default_author(), message=args.message or "rollback",
                       at=feed.now_iso())
    feed.publish_record(cfg, feed.LIVE, new)
    return _emit(args, {"rules_version": new.rules_version, "previous": live.rules_version, "topic": cfg.topic("rules")},
                 f"live rules rolled back to {_name(new.rules_version)}, was {_name(live.rules_version)}")


def cmd_shadow(args: argparse.Namespace, connect: Callable[[argparse.Namespace], None]) -> int:
    from firstfault.rules.errors import FirstfaultError

    from . import rules_feed as feed
    from . import shadow

    if args.report:
        connect(args)
        cfg = _cfg(args)
        rep = shadow.report(cfg, idle_s=args.idle)
        if rep is None:
            raise FirstfaultError(f"no shadow run on {cfg.topic('rules')}: start one with `firstfault rules shadow DIR`")
        if args.json:
            sys.stdout.write(rep.model_dump_json(indent=2) + "\n")
            return 0
        from .replay import diff_lines

        print(f"shadow {rep.rules_version} since {rep.since} (live: {_name(rep.live_version)}): "
              f"{rep.shadow_diagnoses} candidate diagnos{'is' if rep.shadow_diagnoses == 1 else 'es'} "
              f"on {cfg.topic('diagnoses-shadow')}")
        print("\n".join(diff_lines(rep.diff)))
        return 0
    if not args.path:
        raise FirstfaultError("rules shadow needs a rules directory (or --report)")
    put = _put_version(args, connect, "rules shadow")
    if isinstance(put, int):
        return put
    cfg, bundle = put
    old = feed.pointer(feed.read_state(cfg), feed.SHADOW)
    # The same candidate again (a restarted shadow run) keeps its start: the report covers it all.
    started_ms = old.started_ms if old is not None and old.rules_version == bundle.rules_version and old.started_ms \
        else int(time.time() * 1000)
    feed.publish_record(cfg, feed.SHADOW, feed.Pointer(rules_version=bundle.rules_version, author=bundle.author,
                                                       message=bundle.message, at=feed.now_iso(),
                                                       started_ms=started_ms))
    from firstfault.rules.catalog import load_catalog

    from .follow import iso_ms, summary_line

    print(f"shadow {bundle.rules_version} on the live stream since {iso_ms(started_ms)}: its diagnoses go to "
          f"{cfg.topic('diagnoses-shadow')}; `firstfault rules shadow --report` shows what would change, "
          f"`firstfault rules promote {bundle.rules_version}` ships it; Ctrl-C stops", flush=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    emit = None if args.json else (lambda d: print(summary_line(d), flush=True))
    try:
        sent = shadow.run(cfg, load_catalog(args.path), started_ms, every_s=args.every, idle_s=args.idle,
                          stop=lambda: bool(stopping), emit=emit)
    except KeyboardInterrupt:
        return 0
    if args.json:
        json.dump({"rules_version": bundle.rules_version, "diagnoses": sent}, sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
    return 0


def _broker_errors(fn, args: argparse.Namespace, connect) -> int:
    """A broker that fails mid-command: one line (FirstfaultError), not librdkafka's traceback."""
    from confluent_kafka import KafkaException

    from firstfault.rules.errors import FirstfaultError

    try:
        return fn(args, connect)
    except KafkaException as exc:
        raise FirstfaultError(f"rules {args.rules_command}: the broker did not take the record ({exc}); "
                              "check that it runs (`firstfault up`) and try again") from None


def register(rsub, connect: Callable[[argparse.Namespace], None], add_stream_flags: Callable) -> None:
    """The four subcommands under ``firstfault rules``; ``connect`` finds and checks the broker (cli._connect)."""
    def add(name: str, fn, helptext: str) -> argparse.ArgumentParser:
        p = rsub.add_parser(name, help=helptext)
        p.set_defaults(fn=lambda args: _broker_errors(fn, args, connect))
        return p

    def who(p: argparse.ArgumentParser) -> None:
        p.add_argument("--author", help="who publishes (FIRSTFAULT_AUTHOR, default the user name)")
        p.add_argument("-m", "--message", help="why: kept with the catalog on the rules topic")
        p.add_argument("--json", action="store_true",
                       help="the result as one JSON object (the version, the live pointer; --report: the diff)")
        add_stream_flags(p)

    p = add("publish", cmd_publish, "lint and test a rules directory and, if both pass, make it the live catalog "
                                    "of the running workers (no restart)")
    p.add_argument("path", help="a rules directory laid over the built-in catalog")
    who(p)
    p = add("shadow", cmd_shadow, "run a candidate catalog beside the live one on the live stream (diagnoses to "
                                  "diagnoses-shadow); --report: what it would change")
    p.add_argument("path", nargs="?", help="the candidate rules directory")
    p.add_argument("--report", action="store_true", help="print what the shadow run changed so far (as replay --diff)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between shadow rounds (default 5)")
    p.add_argument("--idle", type=float, default=1.0, metavar="SECONDS",
                   help="on a broker that does not say where a topic ends (the embedded one), a topic counts as read "
                        "once nothing new came for this long (default 1)")
    who(p)
    p = add("promote", cmd_promote, "make a published catalog version the live one")
    p.add_argument("version", help="a rules_version on the rules topic (publish and shadow print it)")
    who(p)
    p = add("rollback", cmd_rollback, "make the catalog that was live before the current one live again")
    who(p)
