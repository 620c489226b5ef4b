#!/usr/bin/env python3
"""Speed of this port's models against torchvision's and against the bare model steps, in one run on
one device, and the CPU demos timed as a user runs them; `python tools/benchmark.py --help` lists the
sections. The rows are built in tools/benchmark_lib/ (one module per job: timing, inputs, torchvision's
models, the R-CNN and CenterNet rows, the real loops, start-up, the demos, profiling, the report)."""
import sys

from benchmark_lib.cli import main

from detectron.utils.errors import run_tool

if __name__ == '__main__':
    run_tool(main, sys.argv[1:])
