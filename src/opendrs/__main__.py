"""``python -m opendrs``: the ``opendrs`` command."""

import sys

from opendrs.cli.main import main

sys.exit(main())
