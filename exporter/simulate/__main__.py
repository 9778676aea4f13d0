"""Entry point for ``python -m exporter.simulate`` (the ``simulate`` subcommand on its own)."""

from exporter.simulate import main

raise SystemExit(main())
