"""Targets found rather than listed: the node's pods on the Kubernetes API server.

``pods`` maps a pod object to targets (pure); ``kubernetes`` is the list+watch client, the one
module here doing I/O. The daemon merges their snapshot with the static ``[[target]]`` list.
"""
