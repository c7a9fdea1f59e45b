"""Root conftest: the plugin itself comes through its entry point; ``pytester`` drives the plugin self-tests."""

pytest_plugins = ["pytester"]
