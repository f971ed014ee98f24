"""The training step: one model of compute, communication, memory and their timeline."""
