"""The `commsim` command line: one module per command group (app holds the top level)."""
