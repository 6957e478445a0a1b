import sys

from hpcrl.core.startup import CLOCK

CLOCK.mark("interpreter")  # first: the time from exec to here is the interpreter's own start

if sys.argv[1:2] == ["run"]:  # before the heavy imports: a stop signal at start-up is a request too
    from hpcrl.runtime import signals
    signals.install()

from hpcrl.tools.cli import entry  # noqa: E402 (after the signal handlers, on purpose)

entry()
