"""The attribution engine and its rule catalog.

``intake`` reads what a user has, ``extract`` turns lines into events, ``early`` and
``final`` (with the Python rules in ``python/``) decide, ``diagnose`` assembles the
contract's object, ``engine`` ties them together for the CLI, the service and the stream.
"""
