"""Only the optional C extensions; pyproject.toml holds everything else.

``firstfault.schemas._rawline`` speeds up decoding the raw topic (streams/codecs.py::raw_lines);
``firstfault.schemas._eventbatch`` reads EventBatch bodies for the correlator (schemas/avro.py::decode);
``firstfault.rules._linekey`` makes a line's memo keys (rules/prefixes.py::read_head_keyed).
``optional=True``: without a compiler the build goes on and the pure-Python code is used.
"""
from setuptools import Extension, setup

_SHARED = ["schemas/_avro_time.h"]      # timestamp-micros -> datetime, included by both

setup(ext_modules=[
    Extension("firstfault.schemas._rawline", ["schemas/_rawline.c"], depends=_SHARED, optional=True),
    Extension("firstfault.schemas._eventbatch", ["schemas/_eventbatch.c"], depends=_SHARED, optional=True),
    Extension("firstfault.rules._linekey", ["rules/_linekey.c"], optional=True),
])
