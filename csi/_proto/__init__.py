"""Generated CSI v1.13 stubs; regenerate with `make proto`, never edit by hand."""
