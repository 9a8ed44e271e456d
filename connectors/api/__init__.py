"""firstfault connectors/api."""
