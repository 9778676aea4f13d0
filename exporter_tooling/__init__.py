"""The exporter's tooling, apart from the product: simulator, fake NVML, bench and demo.

Tooling may import the product (``exporter``); the product never imports tooling, except the
CLI's command table, which names tooling modules by string and imports them only when their
command runs.
"""
