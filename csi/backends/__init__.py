"""Cloud backends behind one interface (csi.backends.base.Backend), chosen by name with `--backend`:
`local` and `aws` come with the driver, more arrive through the `ballast.backends` entry-point group
(csi/backend_registry.py). The composition root (csi/server.py) builds the chosen one."""
