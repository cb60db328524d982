"""Check a DeepSpeed config before DeepSpeed sees it: every unknown, misspelled, misplaced,
duplicated, deprecated, removed or contradictory key, at every level, top level included.

Derived in notebook 07a (DeepSpeed, part 1). DeepSpeed stops at the first bad key inside a
section and silently ignores a misspelled *top-level* key: ``"zero_optimisation"`` turns ZeRO off
without a word. The valid keys come from the installed DeepSpeed (``utils.deepspeed.schema``), so the
checker stays right when DeepSpeed adds or renames keys. Each key of your config is then:

- removed / deprecated (DeepSpeed's own tables and pydantic ``deprecated`` fields, with the new name);
- misspelled (``difflib``: the likely intended key), misplaced (valid in another section, e.g.
  ``pin_memory`` belongs inside ``offload_optimizer``) or unknown;
- duplicated (twice in a JSON file or Python source, or a field given with its alias too);
- invalid (a section where a number belongs, a value DeepSpeed's pydantic model refuses);
- contradictory with another key (fp16 and bf16, offload without the ZeRO stage it needs, a
  pipeline with ZeRO-2/3, batch sizes that do not multiply up).

``check_config(config, world_size=None)`` takes a dict, a path to a JSON file, or JSON / Python
source text (a dict literal or a call such as ``Hparams(zero_optimization={...})`` from a popular DeepSpeed tutorial;
JSON files and source text keep duplicated keys, which a Python dict has already collapsed) and
returns a list of ``Finding`` (path, key, kind, message, suggestion); ``report(findings)`` prints them.
"""

import ast
import difflib
import json
import os
from dataclasses import dataclass

from .schema import Section, deepspeed_schema, optimizer_param_names, quiet_deepspeed

KINDS = ("removed", "deprecated", "misspelled", "misplaced", "unknown", "duplicate", "invalid", "contradictory", "note")


@dataclass(frozen=True)
class Finding:
    path: str  # where the key sits, e.g. "zero_optimization.offload_optimizer"; "" = top level
    key: str
    kind: str  # one of KINDS
    message: str
    suggestion: str = ""

    def __str__(self):
        where = f"{self.path}.{self.key}" if self.path else self.key
        return f"[{self.kind}] {where}: {self.message}" + (f" -> {self.suggestion}" if self.suggestion else "")


class _Obj(dict):
    """A parsed JSON / Python object that remembers the keys it saw more than once."""
    dups = ()


def _pairs(pairs):
    obj, seen = _Obj(), set()
    obj.dups = [k for k in (k for k, _ in pairs) if k in seen or seen.add(k)]
    obj.update(pairs)
    return obj


def _from_ast(node):
    if isinstance(node, ast.Dict):
        return _pairs([(ast.literal_eval(k), _from_ast(v)) for k, v in zip(node.keys, node.values)])
    if isinstance(node, ast.Call):  # Hparams(zero_optimization={...}, ...): the keywords are the config
        return _pairs([(kw.arg, _from_ast(kw.value)) for kw in node.keywords])
    return ast.literal_eval(node)


def load_config(config):
    """A dict from a dict, a JSON file path, or JSON / Python source text; duplicates kept in ``.dups``."""
    if isinstance(config, dict):
        return config
    text = str(config)
    if os.path.exists(text):
        with open(text) as f:
            text = f.read()
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError:
        pass
    try:
        tree = ast.parse(text.strip())
    except SyntaxError as error:
        raise ValueError(f"not a JSON file, JSON text or Python dict / call source: {error}") from None
    node = tree.body[-1].value if tree.body and isinstance(tree.body[-1], (ast.Expr, ast.Assign)) else None
    if not isinstance(node, (ast.Dict, ast.Call)):
        raise ValueError("Python source must end with a dict literal or a call like Hparams(key=value, ...)")
    return _from_ast(node)


def _all_paths(section, path=()):
    """{key: [dotted paths of the sections that accept it]} over the whole schema."""
    index = {}
    for key in list(section.keys) + list(section.aliases):
        index.setdefault(key, []).append(".".join(path))
    for name, child in section.children.items():
        if child is not None:
            for key, paths in _all_paths(child, path + (name,)).items():
                index.setdefault(key, []).extend(paths)
    return index


def _walk(obj, section, path, index, out):
    where = ".".join(path)
    for key in getattr(obj, "dups", ()):
        out.append(Finding(where, key, "duplicate", "given more than once; only the last value counts", "keep one"))
    given = {}  # field name -> the spelling used first
    for key, value in obj.items():
        name = section.aliases.get(key, key)
        if key in section.removed:
            out.append(Finding(where, key, "removed", section.removed[key].split(". See")[0], "delete it"))
            continue
        if name in given:
            out.append(Finding(where, key, "duplicate", f"same setting as '{given[name]}' (another spelling)", "keep one"))
        given.setdefault(name, key)
        if name in section.deprecated:
            new = section.deprecated[name]
            out.append(Finding(where, key, "deprecated", "DeepSpeed still reads it but warns",
                               f"use '{new}'" if new else "delete it"))
        if name not in section.keys:
            elsewhere = [p for p in index.get(key, []) if p != where]
            close = difflib.get_close_matches(key, list(section.keys) + list(section.aliases), n=1, cutoff=0.8)
            if close:
                out.append(Finding(where, key, "misspelled", "not a key here: DeepSpeed ignores it or refuses it",
                                   f"'{close[0]}'"))
            elif elsewhere:
                out.append(Finding(where, key, "misplaced", "belongs to another section",
                                   " or ".join(f"'{p or '(top level)'}.{key}'" for p in elsewhere)))
            else:
                out.append(Finding(where, key, "unknown", "DeepSpeed does not know this key here", "delete it"))
            continue
        child, default = section.children.get(name, False), section.keys.get(name)
        if child is not False and not isinstance(value, dict) and value is not None:
            out.append(Finding(where, key, "invalid", f"expects a section {{...}}, got {value!r}",
                               f"'{key}': {{...}} (keys: {', '.join(sorted(child.keys)[:4]) if child else '...'})"))
        elif isinstance(value, dict) and child:
            _walk(value, child, path + (key,), index, out)
        elif isinstance(value, dict) and child is False and isinstance(default, (bool, int, float, str)):
            out.append(Finding(where, key, "invalid", f"expects a {type(default).__name__} (default {default!r}), "
                               "got a section", f"'{key}': <{type(default).__name__}>"))
        elif path and key == "params" and path[-1] == "optimizer" and isinstance(value, dict):
            names = optimizer_param_names(str(obj.get("type", "")))
            for bad in sorted(set(value) - (names or set(value))):
                close = difflib.get_close_matches(bad, sorted(names), n=1, cutoff=0.7)
                out.append(Finding(f"{where}.params", bad, "misspelled" if close else "unknown",
                                   f"{obj.get('type')} takes no such argument", f"'{close[0]}'" if close else "delete it"))
    if section.model is not None:  # values: let DeepSpeed's own model judge those we did not flag
        known = {k: v for k, v in obj.items() if section.aliases.get(k, k) in section.keys and v != "auto"
                 and not isinstance(section.children.get(section.aliases.get(k, k)), Section)}
        try:
            with quiet_deepspeed():
                section.model.model_validate(known)
        except Exception as error:  # pydantic.ValidationError
            for e in getattr(error, "errors", list)():
                if e["type"] != "extra_forbidden" and e["loc"]:
                    out.append(Finding(where, str(e["loc"][0]), "invalid", e["msg"], "see DeepSpeed's config docs"))


def _enabled(section):  # "auto" (Hugging Face fills it in later) is not a decision yet
    return isinstance(section, dict) and section.get("enabled", False) is True


def _contradictions(cfg, world_size):
    out, zero = [], cfg.get("zero_optimization") if isinstance(cfg.get("zero_optimization"), dict) else {}
    stage = zero.get("stage", 0)
    if _enabled(cfg.get("fp16")) and (_enabled(cfg.get("bf16")) or _enabled(cfg.get("bfloat16"))):
        out.append(Finding("", "fp16", "contradictory", "fp16 and bf16 both enabled (DeepSpeed asserts)",
                           "enable one: bf16 needs no loss scaling"))
    for name, min_stage in (("offload_optimizer", 1), ("offload_param", 3)):
        device = zero.get(name, {}).get("device", "none") if isinstance(zero.get(name), dict) else "none"
        if device not in ("none", None) and isinstance(stage, int) and stage < min_stage:
            out.append(Finding("zero_optimization", name, "contradictory",
                               f"offload to {device} needs ZeRO stage >= {min_stage}, stage is {stage}",
                               f"'stage': {min_stage} or remove '{name}'"))
        if name == "offload_optimizer" and device not in ("none", None) and cfg.get("zero_force_ds_cpu_optimizer", True):
            out.append(Finding("", "zero_force_ds_cpu_optimizer", "note",
                               "optimizer offload then uses DeepSpeedCPUAdam (a C++ op compiled on first use, "
                               "~80 s) and refuses a torch client optimizer",
                               "false, with a torch optimizer, to compile nothing"))
    if "pipeline" in cfg and isinstance(stage, int) and stage >= 2:
        out.append(Finding("zero_optimization", "stage", "contradictory",
                           f"stage {stage} with a pipeline section: the PipelineEngine refuses ZeRO-2/3",
                           "'stage': 0 or 1 for pipeline models"))
    tb, mb, gas = (cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                        "gradient_accumulation_steps"))
    if world_size and isinstance(tb, int):
        if isinstance(mb, int) and isinstance(gas, int) and tb != mb * gas * world_size:
            out.append(Finding("", "train_batch_size", "contradictory",
                               f"{tb} != micro batch {mb} x accumulation {gas} x {world_size} ranks",
                               f"{mb * gas * world_size} or drop one of the three"))
        elif mb is None and isinstance(gas, int) and tb % (gas * world_size):
            out.append(Finding("", "train_batch_size", "contradictory",
                               f"{tb} is not divisible by accumulation {gas} x {world_size} ranks",
                               f"a multiple of {gas * world_size}"))
    return out


def check_config(config, world_size=None):
    """Every finding about ``config`` (dict, JSON path, JSON or Python source), most serious kinds first."""
    cfg = load_config(config)
    schema = deepspeed_schema()
    out = []
    _walk(cfg, schema, (), _all_paths(schema), out)
    out += _contradictions(cfg, world_size)
    return sorted(out, key=lambda f: KINDS.index(f.kind))


def report(findings):
    """Readable text: one line per finding, grouped by kind."""
    if not findings:
        return "config OK: no findings"
    counts = ", ".join(f"{sum(f.kind == k for f in findings)} {k}" for k in KINDS if any(f.kind == k for f in findings))
    return "\n".join([f"{len(findings)} findings ({counts}):"] + [f"  {f}" for f in findings])
