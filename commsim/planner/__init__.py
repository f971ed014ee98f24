"""Searching strategies and sizing clusters: enumerate, filter by memory, rank."""
