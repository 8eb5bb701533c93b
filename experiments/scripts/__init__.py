"""Short research scripts that use the public API (not the CLI); each has ``main(tiny)``."""
