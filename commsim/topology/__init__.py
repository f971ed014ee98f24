"""The cluster as a graph: building it, routing flows on it, and ordering ranks on it."""
