"""`python -m pytest_distperf <command> ...`: the package's command line, one subcommand per tool.

Each subcommand is a module with `add_arguments(parser)` and `run(args) -> int`; such a module imports its
optional dependencies only inside `run`, so that `--help` and the other commands work without them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS = {
    "history": ("pytest_distperf.report.history_cli",
                "print (and render as HTML) the trend of each recorded metric and its change points"),
    "build-ops": ("pytest_distperf.strategies.ds_ops", "build DeepSpeed's JIT ops the jobs load (deepspeed_shm_comm on "
                                                       "CPU, cpu_adam for offload, async_io for NVMe) into the "
                                                       "extension cache, before any timed job"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_distperf",
                                     description="pytest-distperf's tools (the plugin itself runs inside pytest).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=text, description=text)
        sub_parser.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(sub_parser)
    args = parser.parse_args(argv)
    return importlib.import_module(args._module).run(args)


if __name__ == "__main__":
    sys.exit(main())
