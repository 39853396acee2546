"""The driver's entry point: `python -m csi` and the `ballast-csi` script.

Start-up creates some 50,000 objects the cyclic collector tracks (grpc, protobuf descriptors, our
modules), nearly all of them living as long as the process, and the collector ran some 65 times over
them before the first call was served: about 20 ms on a small node. So collection is held off from
here until csi.server.run has started serving; it then freezes what start-up built and turns
collection back on.
"""

import gc
import sys

gc.disable()

from csi.cli import main  # noqa: E402  (after gc.disable, on purpose)

if __name__ == "__main__":
    sys.exit(main())
