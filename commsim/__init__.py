"""commsim: predict distributed-training step time, communication cost and the best strategy."""

__version__ = "0.1.0"
