"""calico-gc: removes the Calico data of Kubernetes nodes that no longer exist."""

__version__ = "0.1.0"
