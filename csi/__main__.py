"""`python -m csi` runs the driver."""

import sys

from csi.server import main

sys.exit(main())
