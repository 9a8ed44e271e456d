"""The multi-literal prefilter: Hyperscan and the plain fallback agree, and threads may share it."""
import threading

import pytest

from firstfault.rules.catalog import load_catalog
from firstfault.rules.prefilter import anchor_index
from firstfault.rules.prefilter import Prefilter

from conftest import sample_dirs


def _corpus() -> bytes:
    return b"".join((p / "logs" / "app").joinpath(f).read_bytes()
                    for p in sample_dirs() for f in sorted(x.name for x in (p / "logs" / "app").iterdir()))


def test_fallback_finds_the_same_candidate_lines_and_anchors():
    pre, _ = anchor_index(load_catalog())
    fallback = Prefilter(pre.anchors, force_fallback=True)
    data = _corpus()
    fast = pre.scan(data)
    assert fast, "the samples hold candidate lines"
    assert fallback.scan(data) == fast
    assert fallback.engine == "re"


def test_one_prefilter_serves_many_threads():
    pre, _ = anchor_index(load_catalog())
    if pre.engine != "hyperscan":
        pytest.skip("the Hyperscan binding is not installed: the RE2 fallback has no per-thread scratch space to share")
    data = _corpus()
    want = pre.scan(data)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(pre.scan(data) == want)
        except Exception as exc:  # noqa: BLE001 - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(results) and len(results) == 80
