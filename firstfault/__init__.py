"""firstfault: when a distributed training job dies, say why, from the first fault."""

__version__ = "0.1.0"
