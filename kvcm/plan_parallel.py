"""``kvcm plan --tp/--pp/--attention-dp``: one rank's plan per pipeline stage, and the whole deployment's capacity.

Every rank is sized as one GPU sized for a smaller model (``kvcm.parallel``); what a deployment holds follows
from how the ranks share requests:

* the ``tp_size`` ranks of a stage without attention DP hold the *same* tokens, each its share of the heads;
* the ``pp_size`` stages hold the same tokens too, each its layers; a request needs room on every stage, so the
  stage that holds the fewest tokens bounds the deployment (TensorRT-LLM takes the MIN over ranks:
  ``calculate_max_num_blocks`` allreduces ``max_tokens`` with ``ReduceOp.MIN``);
* with attention DP each of the ``tp_size`` ranks has its own pool and its own requests (``dp_size`` pools),
  so the deployment holds ``dp_size`` times one rank's tokens and requests.

Only the standard library at module level, like :mod:`kvcm.plan`: a bad ``--tp`` answers before torch loads.
"""

from __future__ import annotations

from .policy import Decisions, of as policy_of, rule
from .units import human_bytes as size

_OPTION = {"tp_size": "--tp", "pp_size": "--pp", "enable_attention_dp": "--attention-dp"}


def mapping_of(args, cfg: dict | None):
    """The ``kvcm.Mapping`` of the options, or None when they ask for one GPU (the default plan, unchanged).
    Checked against the model config's heads and layers; a ``ConfigError`` names the option and the limit."""
    tp, pp, adp = getattr(args, "tp", 1), getattr(args, "pp", 1), getattr(args, "attention_dp", False)
    from . import validation

    validation.count("--tp", tp, 1, validation.MAX_WORLD_SIZE, validation.MAX_WORLD_SIZE_WHY)
    validation.count("--pp", pp, 1, validation.MAX_WORLD_SIZE, validation.MAX_WORLD_SIZE_WHY)
    if tp * pp > validation.MAX_WORLD_SIZE:
        from .errors import ConfigError

        raise ConfigError("--tp x --pp", tp * pp, f"must be <= {validation.MAX_WORLD_SIZE} "
                          f"({validation.MAX_WORLD_SIZE_WHY})")
    if tp == 1 and pp == 1 and not adp:
        return None
    from .errors import ConfigError
    from .parallel import Mapping, check_heads, check_layers

    try:
        mapping = Mapping(tp_size=tp, pp_size=pp, enable_attention_dp=adp)
        if cfg is not None:
            cfg = dict(cfg.get("text_config") or cfg) if "num_hidden_layers" not in cfg else cfg
            heads = cfg.get("num_attention_heads")
            check_heads(mapping, heads if isinstance(heads, int) and heads > 0 else None)
            if isinstance(cfg.get("num_hidden_layers"), int) and cfg["num_hidden_layers"] > 0:
                check_layers(mapping, cfg["num_hidden_layers"])
    except ConfigError as exc:
        option = _OPTION.get(exc.field)
        raise ConfigError(option or exc.field, exc.value, exc.limit) from None
    if args.draft_model and pp > 1:
        raise ConfigError("--draft-model", args.draft_model, "is planned with --tp and --attention-dp, not with --pp "
                          "(the draft model's layers would need their own pipeline split)")
    return mapping


class Stages:
    """Which model layers each pipeline stage holds, and which stages hold the same shape of cache.

    A stage's cache depends only on its layers' shapes (heads, widths, windows, roles), not on which model layers
    they are, so stages of one shape are planned once: ``--pp 1024`` on a 1,024-layer model builds one or two
    caches, not 1,024 (each a manager, an estimation cache and two warmups; 134 s before). Every index here is
    made in one pass over the layers, so nothing grows with stages x layers."""

    def __init__(self, spec, mapping):
        from dataclasses import fields

        from .parallel import model_layer_of, num_model_layers

        self.mapping, self.n = mapping, num_model_layers(spec)
        names = [f.name for f in fields(spec.layers[0]) if f.name != "model_layer"]
        self._by_model_layer: dict[int, list] = {}
        for i, layer in enumerate(spec.layers):
            shape = tuple(getattr(layer, name) for name in names)
            self._by_model_layer.setdefault(model_layer_of(spec, i), []).append(shape)
        self._extra = sorted(m for m in self._by_model_layer if m >= self.n)  # MTP layers: the last stage's

    @classmethod
    def of(cls, spec, mapping) -> "Stages | None":
        """None for a model whose ranks are not cut from its layers alone (DeepSeek-V4 builds its own)."""
        from .model_spec import ModelSpec

        return cls(spec, mapping) if type(spec) is ModelSpec and spec.layers else None

    def model_layers(self, pp_rank: int) -> list[int]:
        last = pp_rank == self.mapping.pp_size - 1
        return self.mapping.pp_layers(self.n, pp_rank) + (self._extra if last else [])

    def shape(self, pp_rank: int) -> tuple:
        return tuple(shape for m in self.model_layers(pp_rank) for shape in self._by_model_layer.get(m, ()))


def build_stages(spec, mapping, cfg, build, common_max_tokens: bool) -> list:
    """One ``build(pp_rank, config)`` result per stage, stages of one shape sharing it; then V1's pools under
    pipeline parallelism: ``calculate_max_num_blocks`` reduces ``max_tokens`` with MIN over every rank before
    it counts blocks, so a stage with fewer layers allocates only the fewest tokens any stage holds (its
    estimation cache is unchanged: it ignores ``max_tokens``); V2 keeps each stage's own pool (its ranks agree
    on a byte quota, not on tokens)."""
    if mapping is None:
        return [build(0, cfg)]
    stages = Stages.of(spec, mapping)
    built: dict = {}

    def once(r, config):
        key = (stages.shape(r) if stages is not None else r, config.max_tokens)
        if key not in built:
            built[key] = build(r, config)
        return built[key]

    out = [once(r, cfg) for r in range(mapping.pp_size)]
    if not common_max_tokens or len(out) == 1:
        return out
    agreed = policy_of(out[0].manager).rank_tokens([s.manager.max_tokens for s in out])
    return [s if s.manager.max_tokens == tokens else once(r, cfg.replace(max_tokens=tokens))
            for r, (s, tokens) in enumerate(zip(out, agreed))]


def _model_layers(manager) -> list[int]:
    return sorted({layer.model_layer if layer.model_layer is not None else i
                   for i, layer in enumerate(manager.model.layers)})


def stage_entry(pp_rank: int, manager, max_concurrency: int, model_layers: list[int] | None = None) -> dict:
    """``model_layers``: the stage's own (``Stages.model_layers``), where ``manager`` may be another stage's of
    the same shape; None reads them from the manager."""
    layers = _model_layers(manager) if model_layers is None else model_layers
    d = manager.describe()
    return {"pp_rank": pp_rank, "first_layer": layers[0], "last_layer": layers[-1], "num_layers": len(layers),
            "kv_heads_per_layer": sorted({layer.num_kv_heads for layer in manager.model.layers
                                          if layer.role == "KV" and not layer.is_mla}),
            "bytes_per_token": d.get("bytes_per_token"), "pool_bytes": d["pool_bytes"], "max_tokens": d["max_tokens"],
            "max_concurrency": max_concurrency}


def stage_entries(stages: list, spec, mapping, concurrency) -> list[dict]:
    """``stage_entry`` of every stage; ``concurrency(manager)`` is computed once for stages sharing a cache."""
    index = Stages.of(spec, mapping)
    fits: dict[int, int] = {}
    out = []
    for r, s in enumerate(stages):
        if id(s) not in fits:
            fits[id(s)] = concurrency(s.manager)
        out.append(stage_entry(r, s.manager, fits[id(s)], None if index is None else index.model_layers(r)))
    return out


def deployment(stages: list[dict], mapping, max_batch_size: int) -> dict:
    """The deployment's capacity from its stages' (each a ``stage_entry``): the fewest tokens over stages, times
    ``dp_size`` separate pools with attention DP."""
    binding = min(stages, key=lambda s: (s["max_tokens"], s["pp_rank"]))
    fit = min(s["max_concurrency"] for s in stages)
    dp = mapping.dp_size
    return {"gpus": mapping.world_size, "kv_pools": dp, "binding_stage": binding["pp_rank"],
            "max_tokens": dp * binding["max_tokens"], "requests_fit": dp * fit,
            "max_concurrency": dp * min(fit, max_batch_size), "max_batch_size": dp * max_batch_size,
            "pool_bytes": sum(s["pool_bytes"] for s in stages) * mapping.tp_size}


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


# ---- text --------------------------------------------------------------------------------------------------------
def assumption_lines(result: dict) -> list[str]:
    p = result.get("parallel")
    if p is None:
        return []
    adp = "on (each rank its own requests, every head)" if p["enable_attention_dp"] else \
        "off (a stage's ranks share tokens, split heads)"
    return [f"  {p['tp_size']} TP x {p['pp_size']} PP = {plural(p['world_size'], 'GPU')} [--tp, --pp], attention DP {adp} "
            f"[--attention-dp]; the memory above is each GPU's"]


def verdict_line(m: dict, result: dict) -> str:
    """The deployment's line under a version's (per rank) verdict."""
    d, p = m["deployment"], result["parallel"]
    b, dp = result["max_batch_size"], d["kv_pools"]
    if p["enable_attention_dp"]:
        tokens = f"{dp} x {d['max_tokens'] // dp:,} = {d['max_tokens']:,} tokens ({plural(dp, 'attention-DP rank')}, " \
                 f"each its own pool and requests)"
        fit = f"{dp} x {d['max_concurrency'] // dp:,} = {d['max_concurrency']:,} requests at once"
        bound = f"B={b} a rank binds; the pools would hold {d['requests_fit']:,}"
    else:
        share = "a stage is one GPU" if p["tp_size"] == 1 else f"the {p['tp_size']} TP ranks of a stage hold the same tokens"
        tokens = f"{d['max_tokens']:,} tokens ({share}" + \
                 (f"; stage {d['binding_stage']} holds the fewest)" if p["pp_size"] > 1 else ")")
        fit = f"{d['max_concurrency']:,} requests at once"
        bound = f"B={b} binds; the pools would hold {d['requests_fit']:,}"
    if d["requests_fit"] > d["max_concurrency"]:
        fit += f" ({bound})"
    return f"  deployment on {plural(d['gpus'], 'GPU')}: {tokens}: {fit}"


def stage_lines(m: dict, result: dict) -> list[str]:
    """One line per pipeline stage (every TP rank of a stage holds the same shape)."""
    p = result["parallel"]
    lines = [f"  per rank ({plural(p['tp_size'], 'TP rank')} a stage, each the same):"]
    for s in m["stages"]:
        heads = "/".join(map(str, s["kv_heads_per_layer"]))
        heads = f"{heads} KV head{'s' if heads != '1' else ''} a layer" if heads else "the whole latent a layer"
        per_token = f", {size(s['bytes_per_token'])} a token" if s["bytes_per_token"] else ""
        lines.append(f"    stage {s['pp_rank']}: layers {s['first_layer']}-{s['last_layer']} ({s['num_layers']}), "
                     f"{heads}{per_token}: {size(s['pool_bytes'])} = "
                     f"{s['max_tokens']:,} tokens, {s['max_concurrency']:,} requests of S={result['max_seq_len']:,}")
    return lines


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class PlanParallelDecisions(Decisions):
    SUBSYSTEM = "parallel deployments"

    @rule("the tokens each rank's V1 pool is sized for, given what each rank's own budget holds: the fewest, on "
          "every rank (TensorRT-LLM calculate_max_num_blocks allreduces max_tokens with MIN; PR #4007 made "
          "AutoDeploy's ranks agree on one KV cache size after ranks had sized theirs apart)")
    def rank_tokens(own_tokens: list) -> list:
        return [min(own_tokens)] * len(own_tokens)
