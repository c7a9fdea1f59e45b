"""pytest-kvcm: the pytest plugin around the kvcm reference managers."""
