"""``millwright``: start, watch, control and question Millwright operations; run the emulated lab.

One module per concern (runs, lab, rollout, controls, questions, node, inventory, schedules), each registering its
commands on the apps in starter/cli/common.py; what they call lives in the client library (starter/client.py,
starter/controls.py, starter/questions.py, starter/nodes.py, starter/schedules/) and lab/runner.py.

Exit codes: 0 success; 1 failure (a run failed or refused a control, not found, connection error, lab problem);
2 bad usage or input (unknown command or workflow, input that does not fit the model).
"""

from __future__ import annotations

import contextlib
import os
import sys

from starter.cli import controls, inventory, lab, questions, rollout, runs, schedules  # noqa: F401  (each registers its commands)
from starter.cli.common import app

# ---------------------------------------------------------------- entry point


def run(args: list[str] | None = None) -> int:
    """Run one command (``args``, else the process's own) and return its exit code; what it prints goes to
    sys.stdout and sys.stderr. ``main`` is this and the process's exit; tests call it in-process."""
    try:
        app(args=args, prog_name="millwright")
    except SystemExit as e:
        if isinstance(e.code, int):
            return e.code
        if e.code is None:
            return 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one line, not a traceback wall
        print(f"millwright: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    code = run()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)  # temporalio/sdk-python#300: skip interpreter finalization


if __name__ == "__main__":
    main()
