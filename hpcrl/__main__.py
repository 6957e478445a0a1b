import sys

from hpcrl.tools.cli import main

sys.exit(main())
