"""AMD GPUs: the child that owns amd-smi (``worker``), its protocol additions and its source."""
