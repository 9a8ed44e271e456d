"""firstfault connectors."""
