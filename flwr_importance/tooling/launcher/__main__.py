"""``python -m flwr_importance.tooling.launcher``: the launcher's command line."""

from flwr_importance.tooling.launcher.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
