"""``python -m luftpause`` is the ``luftpause`` command."""

import sys

from luftpause.cli import main

sys.exit(main())
