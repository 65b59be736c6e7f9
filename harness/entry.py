"""The `harness` command's entry point.

Importing the CLI (its argument parser, the hypothesis models, scipy) takes a
second or two; Ctrl-C during it ends as it does later (harness.cli): one line,
`interrupted`, and exit 130, with no traceback.
"""

from __future__ import annotations

import sys

from .errors import ExitCode


def main() -> int:
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    return cli_main()
