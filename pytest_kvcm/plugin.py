"""pytest-kvcm entry point (registered through the ``pytest11`` entry point, or ``-p pytest_kvcm.plugin``).

Like pytest-xdist, the plugin is a set of small sub-plugins, one concept each; this module only names them
so that pytest registers their options, markers, fixtures and hooks. A module comes before the ones that
import it, so that pytest can rewrite its asserts when loaded through ``-p``. Every option is declared in
``options.py``; each sub-plugin checks its own options and input files when pytest starts (its
``pytest_configure``), so a bad value stops the run with a ``pytest.UsageError`` naming it rather than surfacing
minutes later from the first test that reads it, and keeps its state in ``config.stash``.
"""

pytest_plugins = [
    "pytest_kvcm.options",  # every option and ini key, with the defaults and choices the sub-plugins read
    "pytest_kvcm.loading",  # inner pytest runs load the plugin too when it came from -p, not an entry point
    "pytest_kvcm.reuse_option",  # --kvcm-reuse, the kvcm_reuse fixture (before versions, whose factory uses it)
    "pytest_kvcm.versions",  # --kvcm-version, the kvcm_version / kvcm_manager_factory fixtures
    "pytest_kvcm.machine",  # --kvcm-machine, --kvcm-stage: the facts markers and lane conditions test
    "pytest_kvcm.markers",  # cpu_only, gpu(...), accuracy, slow; GPU requirement skips
    "pytest_kvcm.lanes.merge_stage",  # --kvcm-stage pre_merge (default) / post_merge: the post_merge marker
    "pytest_kvcm.lanes.isolation",  # ISOLATION: a lane entry in a subprocess of its own
    "pytest_kvcm.lanes.selection",  # --kvcm-lane, ci/<lane>.yml, waives
    "pytest_kvcm.sharding",  # CUDA_VISIBLE_DEVICES per xdist worker
    "pytest_kvcm.defects.plugin",  # --kvcm-inject, --kvcm-list-defects: the defect catalogue
    "pytest_kvcm.targets.plugin",  # --kvcm-target: managers under test for the contract suites
    "pytest_kvcm.page_boundary",  # the page_boundary_check fixture
    "pytest_kvcm.parity",  # the greedy_parity fixture
    "pytest_kvcm.accuracy.plugin",  # --kvcm-accuracy, --kvcm-gsm8k, gate fixtures
    "pytest_kvcm.results",  # --kvcm-results, the SQLite results store
    "pytest_kvcm.progress",  # the kvcm_progress fixture: bars that show while output is captured
]
