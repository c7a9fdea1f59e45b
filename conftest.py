"""Root conftest: the plugin itself comes through its entry point; ``pytester`` drives the plugin self-tests.

torch and kvcm are imported here, before any in-process pytester run takes its ``sys.modules`` snapshot:
pytester drops modules first imported inside a run, and importing torch a second time in one process crashes.
"""

import torch  # noqa: F401

import kvcm

for _name in kvcm.__all__:  # kvcm loads its modules on first use; load every public one now
    getattr(kvcm, _name)

pytest_plugins = ["pytester"]
