"""Where the suites look for the real GSM8K files: ``$KVCM_GSM8K_DIR`` when set (a GPU machine gets them staged
somewhere of its own), else ``<rootdir>/../shared/data/gsm8k``. The files are never part of the project."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REAL = Path(os.environ["KVCM_GSM8K_DIR"]) if os.environ.get("KVCM_GSM8K_DIR") else ROOT.parent / "shared" / "data" / "gsm8k"
