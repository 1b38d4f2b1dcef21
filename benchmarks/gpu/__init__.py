"""The GPU benchmarks (`python -m benchmarks gpu.NAME`): the suite, issue 51's goodput sweep and the
random target they need where no weights can be downloaded; README.md says how a lent GPU runs them."""
