"""The operator's Kubernetes side: kopf handlers (handlers.py) over pure status and manifests."""
