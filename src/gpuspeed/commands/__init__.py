"""CLI commands, one module each; every module defines `register(app)` and holds no logic."""
