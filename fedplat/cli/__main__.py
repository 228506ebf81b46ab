"""``python -m fedplat.cli``: the ``fedplat`` command."""

import sys

from fedplat.cli import main

sys.exit(main())
