"""firstfault streams."""
