"""NVIDIA GPUs: the child that owns NVML (``worker``); its parent is ``gpu.source.GpuSource``."""
