"""What the installed DeepSpeed accepts in its config, learned from DeepSpeed itself.

Derived in notebook 07a (DeepSpeed, part 1) for the config checker ``utils.deepspeed.config``.
DeepSpeed validates the sections it parses with pydantic (``zero_optimization``, ``bf16``,
``fp16``, ...), but reads the *top level* and a few hand-parsed sections with
``dict.get(key, default)``, so nothing lists those keys. Rather than hand-typing hundreds of keys
that change with every release, ``deepspeed_schema()`` asks the installed DeepSpeed:

- top-level keys, and the keys of hand-parsed sections (``activation_checkpointing``,
  ``flops_profiler``, ``optimizer``, ...): we hand ``DeepSpeedConfig`` a dict that **records every
  key it is asked for** (``get``, ``in``, ``[]``, ``keys()``), with the default it falls back to;
- which pydantic model parses a section: we put a probe key in the section and watch which
  ``DeepSpeedConfigModel`` receives it; then the model's ``model_fields``, their aliases, nested
  models (``offload_optimizer``) and the fields marked ``deprecated`` with their replacement;
- keys DeepSpeed has removed: its own ``_REMOVED_*_CONFIG_KEYS`` tables.

The result is a tree of ``Section`` objects (about 0.1 s to build, cached).
"""

import contextlib
import functools
import logging
import typing
from collections.abc import KeysView
from dataclasses import dataclass, field

PROBE = "__ds_config_probe__"  # a key no DeepSpeed version knows: which model refuses it?


@dataclass
class Section:
    """What DeepSpeed accepts at one place of the config."""
    keys: dict = field(default_factory=dict)  # name -> default value (None when unknown)
    aliases: dict = field(default_factory=dict)  # other accepted spelling -> field name
    deprecated: dict = field(default_factory=dict)  # name -> replacement (may be "")
    removed: dict = field(default_factory=dict)  # name -> DeepSpeed's own message
    children: dict = field(default_factory=dict)  # name -> Section (nested dicts we can check)
    model: type = None  # the pydantic model, when there is one


class _Recorder(dict):
    """A dict that writes down every key it is asked for (and the default offered)."""

    def __init__(self, data, path, log):
        super().__init__(data)
        self.path, self.log = path, log

    def _note(self, key, default=None):
        self.log.setdefault(self.path + (key,), default)

    def get(self, key, default=None):
        self._note(key, default)
        return super().get(key, default)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

    def keys(self):  # `KEY in d.keys()` goes through __contains__ above
        return KeysView(self)


@contextlib.contextmanager
def quiet_deepspeed():
    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # setLevel, not .level =: it also clears logging's cache
    try:
        yield
    finally:
        logger.setLevel(level)


def _submodel(annotation, base):
    """The DeepSpeedConfigModel inside an annotation such as Optional[OffloadConfig], or None."""
    if isinstance(annotation, type) and issubclass(annotation, base):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg, base)
        if found:
            return found
    return None


def _model_section(model, base):
    section = Section(model=model)
    for name, info in model.model_fields.items():
        section.keys[name] = None if info.is_required() else info.default
        if info.alias and info.alias != name:
            section.aliases[info.alias] = name
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if extra.get("deprecated"):
            section.deprecated[name] = extra.get("new_param", "") or extra.get("deprecated_msg", "")
        sub = _submodel(info.annotation, base)
        if sub is not None:
            section.children[name] = _model_section(sub, base)
    return section


def _probe(dsc, base, config):
    """Build DeepSpeedConfig(config); return (keys read {path: default}, models built [(cls, data)])."""
    log, built, original = {}, [], base.__init__

    def spy(self, strict=False, **data):
        built.append((type(self), data))
        return original(self, strict, **data)

    base.__init__ = spy
    try:
        with quiet_deepspeed():
            dsc.DeepSpeedConfig(_Recorder(config, (), log))
    except Exception:  # the probe key is *meant* to be refused by pydantic sections
        pass
    finally:
        base.__init__ = original
    return log, built


@functools.lru_cache(maxsize=1)
def deepspeed_schema():
    """The top-level Section of the installed DeepSpeed (learned once and cached)."""
    import deepspeed.runtime.config as dsc
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel as base

    minimal = {"train_micro_batch_size_per_gpu": 1}
    reads, _ = _probe(dsc, base, minimal)
    top = Section(keys={path[0]: default for path, default in reads.items() if len(path) == 1})
    top.removed = dict(getattr(dsc, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}))
    for key in list(top.keys):
        if key in top.removed or key in minimal:
            continue
        probe_log = {}
        section_reads, built = _probe(dsc, base, {**minimal, key: _Recorder({PROBE: 1}, (key,), probe_log)})
        for cls, data in built:  # the pydantic model that received our probe key, directly or one level down
            if PROBE in data:
                top.children[key] = _model_section(cls, base)
            for name, value in data.items():
                if isinstance(value, dict) and PROBE in value and _submodel(cls.model_fields[name].annotation, base):
                    top.children[key] = _model_section(_submodel(cls.model_fields[name].annotation, base), base)
        if key not in top.children:
            sub = {path[1]: d for path, d in {**section_reads, **probe_log}.items() if len(path) == 2 and path[0] == key}
            sub.pop(PROBE, None)
            if sub:  # again with every key it read set: some keys are read only then ("params" once "type" is set)
                _probe(dsc, base, {**minimal, key: _Recorder({k: PROBE for k in sub}, (key,), probe_log)})
                sub.update({path[1]: d for path, d in probe_log.items() if len(path) == 2 and path[1] not in sub})
                top.children[key] = Section(keys=sub)
    zero = top.children.get("zero_optimization")
    if zero is not None:
        zero.removed = dict(getattr(dsc, "_REMOVED_ZERO_CONFIG_KEYS", {}))
    if "optimizer" in top.children:  # its "params" go to the optimizer's constructor: checked by type
        top.children["optimizer"].children["params"] = None
    return top


def optimizer_param_names(optimizer_type):
    """Keyword arguments an optimizer "type" of the config accepts (torch's and DeepSpeed's), or None."""
    import inspect

    import torch

    names = set()
    for name, cls in vars(torch.optim).items():
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and name.lower() == optimizer_type.lower():
            names |= set(inspect.signature(cls).parameters) - {"params"}
    if optimizer_type.lower() in ("adam", "adamw"):  # FusedAdam / DeepSpeedCPUAdam, and the engine's own switches
        from deepspeed.ops.adam import (  # importing builds nothing
            DeepSpeedCPUAdam,
            FusedAdam,
        )
        for cls in (FusedAdam, DeepSpeedCPUAdam):
            names |= set(inspect.signature(cls).parameters) - {"params", "model_params"}
        names |= {"torch_adam", "adam_w_mode"}
    return names or None
