"""The contract suites: what every paged KV cache manager owes its scheduler, shipped with the package.

Every ``test_*.py`` module here is collected by pytest's own way of running tests that live inside an installed
package, from any directory::

    pytest --kvcm-target=mine --pyargs pytest_kvcm.contract

``mine`` is a target registered by the ``pytest_kvcm_register_targets`` hook of the user's ``conftest.py`` (found
as usual: the directory pytest is started in, and the directories of the paths it is given). The project's own
run collects this directory through ``testpaths``; the tests ask only for the ``kvcm_target`` fixture
(``pytest_kvcm/targets/``), so the same files run against kvcm, vLLM, transformers or the user's manager.
"""
