"""``python -m opendrs``: the ``opendrs`` command."""

import sys

from opendrs.cli import main

sys.exit(main())
