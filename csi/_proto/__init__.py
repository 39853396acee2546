"""Generated CSI v1.12 stubs; regenerate with `make proto`, never edit by hand."""
