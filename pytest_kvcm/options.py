"""Every command-line option and ini key of the plugin, in one place (as pytest-xdist declares its own in one
``pytest_addoption``), with the defaults and choices the sub-plugins read back.

A sub-plugin owns what an option *means* (it reads and checks the value when pytest starts); this module only
declares it, so ``pytest --help``'s kvcm group, the docs and the sub-plugins cannot drift apart.
"""

from __future__ import annotations

import pytest

from kvcm import versions as _versions

from .targets import declared as _targets

# --kvcm-version: a concrete version, every version ('both') or the model's preference ('auto')
VERSION_CHOICES = (*_versions.NAMES, _versions.ALL, _versions.AUTO)
VERSION_DEFAULT = _versions.AUTO
# --kvcm-reuse: TensorRT-LLM's KvCacheConfig turns block reuse on by default, and so does the plugin
REUSE_CHOICES = ("on", "off", "both")
REUSE_DEFAULT = "on"
TARGETS_DEFAULT = _targets.DEFAULT
RESULTS_PATH = ".kvcm/results.sqlite"
ENV_MACHINE = "KVCM_MACHINE_JSON"
ACCURACY_MODES = ("gate", "measure", "smoke")
# the explorer's budgets in the pre-merge stage: its quick form, which catches every defect the full budget
# (post-merge, 1) catches (docs/plugin.md, Lanes; measured per defect)
EXHAUSTIVE_QUICK_SCALE = 0.1


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcm")
    # manager runs: reuse_option.py, versions.py
    group.addoption("--kvcm-reuse", choices=REUSE_CHOICES, default=None,
                    help="block reuse (prefix caching) for manager tests: on, off or both "
                         f"(ini: kvcm_reuse; default {REUSE_DEFAULT}, as TensorRT-LLM's KvCacheConfig)")
    parser.addini("kvcm_reuse", "default for --kvcm-reuse", default=REUSE_DEFAULT)
    group.addoption("--kvcm-version", choices=VERSION_CHOICES, default=None,
                    help=f"KV cache manager version(s) to run manager tests with: {', '.join(VERSION_CHOICES)} "
                         f"(ini: kvcm_version; default {VERSION_DEFAULT})")
    parser.addini("kvcm_version", "default for --kvcm-version", default=VERSION_DEFAULT)

    # the machine and what runs on it: machine.py, markers.py (sharding.py's below, after the lanes)
    group.addoption(
        "--kvcm-machine", dest="kvcm_machine", default=None, metavar="JSON_OR_PATH",
        help=f"simulate a machine (JSON object or file; overrides ${ENV_MACHINE}), e.g. "
        '\'{"gpu_count": 8, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_gb": 85, "sm": 90}\'',
    )
    group.addoption("--kvcm-stage", dest="kvcm_stage", default=None, metavar="STAGE",
                    help="pre_merge (default: the five-minute run; tests marked post_merge are deselected), post_merge "
                    "(only the tests marked post_merge or slow), or another term a lane file's conditions test")
    group.addoption("--kvcm-gpu-only", dest="kvcm_gpu_only", action="store_true", default=False,
                    help="skip tests marked cpu_only")
    group.addoption(
        "--kvcm-slow", dest="kvcm_slow", action="store_true", default=None,
        help="also run tests marked slow (the model gates: minutes each on a CPU); default: skip them, as does "
        "ini kvcm_slow = false. '-m slow' (any -m naming slow) selects them too",
    )
    parser.addini("kvcm_slow", type="bool", default=False, help="run tests marked slow (see --kvcm-slow)")
    group.addoption(
        "--kvcm-exhaustive-scale", dest="kvcm_exhaustive_scale", type=float, default=None, metavar="FACTOR",
        help="multiply the state budget of every exhaustive-explorer configuration by FACTOR (> 0; default "
        f"{EXHAUSTIVE_QUICK_SCALE} in the pre-merge stage, its quick form, and 1 in the post-merge stage; "
        "--kvcm-exhaustive-deep adds the deep configurations)",
    )
    group.addoption(
        "--kvcm-exhaustive-deep", dest="kvcm_exhaustive_deep", action="store_true", default=False,
        help="also run the exhaustive explorer's deep configurations (ten times the states, three requests at "
        "once: tens of minutes on a CPU, so neither --kvcm-slow nor -m slow runs them without this)",
    )

    # lanes: lanes/selection.py, lanes/merge_stage.py (--kvcm-stage above); then sharding.py. A lane is cut into
    # stages of one machine each by pytest-split (--splits N --group K --durations-path ci/durations/<lane>-<stage>.json)
    group.addoption("--kvcm-lane", dest="kvcm_lane", default=None, metavar="NAME",
                    help="run the tests of lane NAME (ci/NAME.yml, or a .yml path; 'auto' picks one for this machine)")
    group.addoption("--kvcm-lane-dir", dest="kvcm_lane_dir", default=None, metavar="DIR",
                    help="where lane files live, relative to rootdir (default ci)")
    group.addoption("--kvcm-waives", dest="kvcm_waives", default=None, metavar="PATH",
                    help="waives file: lines 'node_id SKIP (reason)' (default ci/waives.txt under rootdir, if present)")
    group.addoption("--kvcm-lane-all-blocks", dest="kvcm_lane_all_blocks", action="store_true", default=False,
                    help="select every block of the lane whatever its condition (with --collect-only: check every "
                    "id of a GPU lane on a CPU machine)")
    parser.addini("kvcm_lane", "default for --kvcm-lane", default="")
    parser.addini("kvcm_lane_dir", "default for --kvcm-lane-dir", default="ci")
    parser.addini("kvcm_waives", "default for --kvcm-waives", default="ci/waives.txt")

    group.addoption(
        "--kvcm-gpus-per-worker", dest="kvcm_gpus_per_worker", type=int, default=None, metavar="G",
        help="GPUs given to each xdist worker through CUDA_VISIBLE_DEVICES (default 1; 0 disables)",
    )
    parser.addini("kvcm_gpus_per_worker", "GPUs per xdist worker (default 1; 0 disables)", default="1")

    # the defect catalogue: defects/plugin.py
    group.addoption("--kvcm-inject", metavar="NAME", default=None,
                    help="put one registered historic defect back into kvcm for this run (see --kvcm-list-defects)")
    group.addoption("--kvcm-list-defects", action="store_const", const="text", default=None,
                    help="list the registered defects with their upstream references and exit")
    group.addoption("--kvcm-list-defects-json", dest="kvcm_list_defects", action="store_const", const="json",
                    help="the same as one JSON list (name, story, upstream, catchers), for tools")

    # managers under test: targets/plugin.py
    group.addoption("--kvcm-target", default=None, metavar="NAMES",
                    help="comma-separated managers under test for the contract suites: "
                         f"{', '.join(_targets.BY_NAME)}, your own, or 'all' (ini: kvcm_target; default "
                         f"{TARGETS_DEFAULT})")
    parser.addini("kvcm_target", "default for --kvcm-target", default=TARGETS_DEFAULT)

    # accuracy gates: accuracy/plugin.py
    group.addoption("--kvcm-accuracy", dest="kvcm_accuracy", choices=ACCURACY_MODES, default=None,
                    help="accuracy gates: gate (default) checks the threshold; smoke runs 16 samples against "
                         "the threshold for n=16; measure runs ungated and prints the reference entry")
    group.addoption("--kvcm-gsm8k", dest="kvcm_gsm8k", default=None, metavar="PATH",
                    help="GSM8K directory (test.jsonl/train.jsonl or parquet) or file; a hub id is tried only "
                         "if it is not a path. Default: the embedded arithmetic set")
    group.addoption("--kvcm-gsm8k-limit", dest="kvcm_gsm8k_limit", type=int, default=None, metavar="N",
                    help="evaluate only the first N questions")
    group.addoption("--kvcm-references", dest="kvcm_references", default=None, metavar="DIR",
                    help="reference YAML directory (default <rootdir>/ci/references)")
    parser.addini("kvcm_accuracy", "default accuracy mode (gate, measure, smoke)", default="gate")

    # the results store: results.py
    group.addoption("--kvcm-results", dest="kvcm_results", default=None, metavar="PATH",
                    help=f"SQLite results store (default <rootdir>/{RESULTS_PATH}; 'none' disables the file)")
    parser.addini("kvcm_results", f"SQLite results store path, relative to rootdir (default {RESULTS_PATH})",
                  default=RESULTS_PATH)


def choice(config, name: str, choices, default: str) -> str:
    """The value of a choice option: the command line, else the ini key, else ``default``; a bad ini value (the
    command line's is checked by argparse) is a usage error naming the key, the value and the choices."""
    value = config.getoption(name)
    if value is None:
        value = config.getini(name)  # "-o name=" gives "": refused below (it used to mean the default, silently)
    if value is None:
        value = default
    if value not in choices:
        raise pytest.UsageError(f"{name}={value!r} is invalid: choose one of {', '.join(choices)}")
    return value


def parametrized_by_test(metafunc, argname: str) -> bool:
    """Whether the test's own ``parametrize`` marker names ``argname`` (then the plugin leaves that name alone)."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = names.split(",")
        if argname in (n.strip() for n in names):
            return True
    return False
