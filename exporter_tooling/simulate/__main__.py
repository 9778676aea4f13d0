"""``python -m exporter_tooling.simulate``: the ``simulate`` subcommand on its own."""

from exporter_tooling.simulate import main

raise SystemExit(main())
