"""The exporter's tooling, apart from the product: simulator, fake NVML, bench and demo.

Tooling may import the product (``exporter``); the product never imports tooling, not even
by name. Its own entry point runs it from a checkout: ``python -m exporter_tooling demo``
(``simulate``, ``bench``); it is not part of the product's wheel.
"""
