"""`python -m gbdoctor` is the same as the `gbdoctor` console script."""

import os
import signal


def _terminated_while_starting(signum, frame):  # type: ignore[no-untyped-def]
    """SIGTERM before the CLI installs its own handlers (importing it takes a while): the same
    line and exit status, instead of a silent death by signal."""
    os.write(2, b"Terminated.\n")
    os._exit(143)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated_while_starting)
    from gbdoctor.cli import main

    main()
