"""The `edgekit` command line: one module per command group."""
