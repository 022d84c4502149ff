"""Root conftest: the parity harness's pytest plugin (options --target/--golden/--model/--tol)."""
pytest_plugins = ["parity.pytest_plugin"]
