"""Only the optional C extension; pyproject.toml holds everything else.

``firstfault.schemas._rawline`` speeds up decoding the raw topic (streams/codecs.py::raw_lines).
``optional=True``: without a compiler the build goes on and the pure-Python decoder is used.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("firstfault.schemas._rawline", ["schemas/_rawline.c"], optional=True)])
