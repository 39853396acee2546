"""The driver's entry point: `python -m csi` and the `ballast-csi` script.

Start-up allocates hundreds of thousands of long-lived objects (grpc, protobuf descriptors, our modules),
and the cyclic collector would walk them some 65 times before the first call is served, about 20 ms on
a small node. So collection is held off from here until csi.server.run has started serving; it then
freezes what start-up built and turns collection back on.
"""

import gc
import sys

gc.disable()

from csi.server import main  # noqa: E402  (after gc.disable, on purpose)

if __name__ == "__main__":
    sys.exit(main())
