"""Only the optional C extensions; pyproject.toml holds everything else.

``firstfault.schemas._rawline`` speeds up decoding the raw topic (streams/codecs.py::raw_lines);
``firstfault.schemas._eventbatch`` reads EventBatch bodies for the correlator (schemas/avro.py::decode).
``optional=True``: without a compiler the build goes on and the pure-Python decoders are used.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("firstfault.schemas._rawline", ["schemas/_rawline.c"], optional=True),
                   Extension("firstfault.schemas._eventbatch", ["schemas/_eventbatch.c"], optional=True)])
