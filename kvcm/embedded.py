"""The model configs shipped inside the package (``kvcm/configs/*.json``), so sizing works offline.

``kvcm.load_spec("qwen3-0.6b")`` is what the README and ``kvcm plan --model`` use: an embedded name, or a path to
any ``config.json``. torch is imported only once a config is turned into a spec, so listing names stays cheap.
"""

from __future__ import annotations

import json
from os import PathLike
from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"


def embedded_models() -> list[str]:
    """Names of the embedded configs, e.g. ``['deepseek-v4-flash', ..., 'qwen3-0.6b', ...]``."""
    return sorted(p.stem for p in CONFIGS.glob("*.json"))


def load_config(name: str) -> dict:
    """The ``config.json`` dict of an embedded name or a file path; ``ConfigError`` names the choices, and for a
    file that cannot be read as one JSON object, the file (and line)."""
    from .errors import ConfigError

    if not isinstance(name, (str, PathLike)) or isinstance(name, str) and not name.strip():
        raise ConfigError("model", name, "must be an embedded config's name or a config.json path "
                          f"({', '.join(embedded_models())})")
    path = Path(name)
    if path.is_file():
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError("model", name, f"is not valid JSON ({path}:{exc.lineno}: {exc.msg})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError("model", name, f"is not UTF-8 text ({path}: byte {exc.start})") from None
        except RecursionError:  # json's decoder recurses once a nesting level
            raise ConfigError("model", name, f"nests its JSON deeper than a config does ({path}: Python's JSON "
                              "reader gives up past ~1,000 levels)") from None
        except OSError as exc:
            raise ConfigError("model", name, f"cannot be read ({exc.strerror or exc})") from None
        if not isinstance(cfg, dict):
            raise ConfigError("model", name, f"must hold a JSON object, not {type(cfg).__name__} ({path}:1)")
        return cfg
    if name in embedded_models():
        return json.loads((CONFIGS / f"{name}.json").read_text())
    raise ConfigError("model", name, f"is neither a file nor an embedded config ({', '.join(embedded_models())})")


def load_spec(name: str):
    """A ``ModelSpec`` (``DeepseekV4Spec`` for a DeepSeek-V4 config) from an embedded name or a config path."""
    cfg = load_config(name)
    if cfg.get("model_type") == "deepseek_v4":
        from .deepseek_v4 import DeepseekV4Spec

        return DeepseekV4Spec.from_hf_config(cfg)
    from .model_spec import ModelSpec

    return ModelSpec.from_hf_config(cfg)
