"""The ``gbdoctor`` command line: a thin typer app over the library API.

Each command (one module each: ``scan``, ``inspect``, ``causes``, ``plan``, ``run``, ``gate``,
``diff``) parses its options, calls one library function, renders the result and returns an
exit code. Options shared by several commands are defined once (``options``); errors from the
library (``GbdoctorError``) become one line ``Error: ...`` plus ``Hint: ...`` on stderr and the
documented exit code (``exits``); ``--debug`` (or ``GBDOCTOR_DEBUG=1``) adds the traceback.
"""

from gbdoctor.cli.root import app, main

__all__ = ["app", "main"]
