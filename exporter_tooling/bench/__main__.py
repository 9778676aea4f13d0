"""``python -m exporter_tooling.bench SPEC``: the scrape client process."""

import sys

from exporter_tooling.bench import client_main

raise SystemExit(client_main(sys.argv[1:]))
