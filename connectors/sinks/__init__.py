"""firstfault connectors/sinks."""
