"""The process entry of the command line: ``python -m firstfault`` and the ``firstfault`` command."""
import gc
import sys


def run() -> int:
    # Start-up makes tens of thousands of objects that live as long as the process (modules, classes,
    # functions, the pydantic models) and frees few: the cyclic collector's passes over them (one
    # every 700 allocations) were a tenth of a small file's analysis. None runs while they are made,
    # and they are frozen after (gc.freeze: later passes leave them out). Only here, where the
    # process starts: importing firstfault.cli elsewhere (the tests, the service) changes nothing.
    gc.disable()
    try:
        from firstfault.cli import main
    finally:
        gc.freeze()
        gc.enable()
    if sys.argv[1:2] == ["analyze"]:
        # One analysis, then the process ends: the collector's passes made rarer for all of it (its
        # imports and the catalog's restoring too), as analyze_bundle makes them (rules/collect.py).
        from firstfault.rules.collect import GEN0

        threshold = gc.get_threshold()
        gc.set_threshold(max(threshold[0], GEN0), *threshold[1:])
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
