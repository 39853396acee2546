"""One translator per Kubernetes in-tree volume plugin, behind the InTreePlugin interface (base.py)."""
