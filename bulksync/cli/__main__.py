"""``python -m bulksync.cli``: the ``bulksync`` command without its console script."""

import sys

from bulksync.cli import main

sys.exit(main())
