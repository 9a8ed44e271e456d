"""The process entry of the command line: ``python -m firstfault`` and the ``firstfault`` command."""
import gc


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
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
