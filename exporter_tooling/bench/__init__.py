"""The benchmark behind ``python -m exporter_tooling bench``, one module per concern.

``command`` (flags, the table on stdout, the JSON report) runs ``measure`` (the stand-ins up,
then the sections: ``scrape``, ``sampling``, ``detection`` for ready and stall), which starts
the measured ``servers`` and reads them through ``procfs``; ``scrape_client`` times scrapes
from its own process; ``goals`` and ``table`` read the ``records`` back.
"""
