"""The rows of tools/benchmark.py, one module per job (cli.py describes the sections)."""
