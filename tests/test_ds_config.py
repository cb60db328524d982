"""The DeepSpeed config checker (utils/deepspeed/config.py, notebook 07a): the config a popular DeepSpeed tutorial gives, hidden
misspellings at every level, a clean config, duplicates in a JSON file, contradictions."""

import json

import pytest

pytest.importorskip("deepspeed")

from utils.deepspeed.config import Finding, check_config, deepspeed_schema, load_config, report

# The second config of the DeepSpeed tutorial that lesson 07 quotes, copied as written.
TUTORIAL_CONFIG = """
hparams = Hparams(
zero_optimization={
"stage": 3,
"offload_optimizer": {
"device": "cpu"
},
"overlap_comm": True,
"contiguous_gradients": True,
"reduce_scatter": True,
"reduce_bucket_size": 5e8,
"allgather_bucket_size": 5e8,
"partition_activations": True,
"cpu_offload": True,
"min_num_size": 1e8,
"load_from_fp32_weights": True,
"stage3_gather_fp16_weights_on_model_save": True,
"stage3_prefetch_bucket_size": 5e8,
"stage3_param_persistence_threshold": 1e8,
"stage3_max_live_parameters": 1e9,
"stage3_max_reuse_distance": 1e9,
"stage3_gather_fp16_weights_during_training": True,
"offload_param": True,
"pin_memory": True,
"fast_init": True,
"sync_bn_in_backward": True,
"reduce_bucket_size": 5e8,
"allgather_bucket_size": 5e8,
"reduce_scatter": True,
"contiguous_gradients": True,
"overlap_comm": True
},
fp16={
"enabled": True,
"loss_scale": 0,
"initial_scale_power": 16,
"scale_window": 1000
},
gradient_clipping={
"enabled": True,
"clip_value": 1.0
},
train_batch_size=32,
gradient_accumulation_steps=4,
steps_per_print=10
)
"""

CLEAN = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "steps_per_print": 100,
    "zero_allow_untested_optimizer": True,
    "zero_force_ds_cpu_optimizer": False,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7, "overlap_comm": True,
                          "offload_optimizer": {"device": "cpu", "pin_memory": False}},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "weight_decay": 0.01}},
    "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False},
}


def kinds(findings):
    return {(f.path, f.key): f.kind for f in findings}


def test_schema_comes_from_deepspeed():
    top = deepspeed_schema()
    assert {"train_batch_size", "zero_optimization", "bf16", "fp16", "gradient_clipping"} <= set(top.keys)
    zero = top.children["zero_optimization"]
    assert zero.model.__name__ == "DeepSpeedZeroConfig"
    assert zero.aliases["stage3_prefetch_bucket_size"] == "prefetch_bucket_size"  # pydantic alias
    assert "offload_optimizer" in zero.children and "device" in zero.children["offload_optimizer"].keys
    assert "partition_activations" in top.children["activation_checkpointing"].keys  # learned by recording


def test_clean_config_passes():
    assert check_config(CLEAN, world_size=4) == []
    assert report([]) == "config OK: no findings"


@pytest.mark.parametrize("config, path, key, suggestion", [
    ({"zero_optimisation": {"stage": 2}}, "", "zero_optimisation", "zero_optimization"),  # top level: silent in DeepSpeed
    ({"gradient_acumulation_steps": 2}, "", "gradient_acumulation_steps", "gradient_accumulation_steps"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 10}}, "zero_optimization", "reduce_bucket_sise",
     "reduce_bucket_size"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memmory": True}},
      "zero_force_ds_cpu_optimizer": False}, "zero_optimization.offload_optimizer", "pin_memmory", "pin_memory"),
    ({"bf16": {"enabeld": True}}, "bf16", "enabeld", "enabled"),
    ({"fp16": {"enabled": True, "loss_scale_windw": 100}}, "fp16", "loss_scale_windw", "loss_scale_window"),
    ({"activation_checkpointing": {"partition_activation": True}}, "activation_checkpointing",
     "partition_activation", "partition_activations"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decy": 0.1}}}, "optimizer.params",
     "weight_decy", "weight_decay"),
])
def test_hidden_misspelling_at_every_level(config, path, key, suggestion):
    found = [f for f in check_config(config) if f.kind == "misspelled"]
    assert [(f.path, f.key) for f in found] == [(path, key)], report(found)
    assert suggestion in found[0].suggestion


def test_tutorial_config_lists_each_problem():
    got = kinds(check_config(TUTORIAL_CONFIG, world_size=2))
    z = "zero_optimization"
    assert got[(z, "cpu_offload")] == "deprecated"
    assert got[(z, "pin_memory")] == "misplaced" and got[(z, "partition_activations")] == "misplaced"
    assert got[(z, "min_num_size")] == "unknown" and got[(z, "sync_bn_in_backward")] == "unknown"
    assert got[(z, "reduce_bucket_size")] == "duplicate" and got[(z, "overlap_comm")] == "duplicate"
    assert got[(z, "offload_param")] == "invalid"  # True where a section is expected
    assert got[("", "gradient_clipping")] == "invalid"  # a number, not {"enabled", "clip_value"}
    assert got[("fp16", "scale_window")] == "misspelled"


def test_duplicates_in_a_json_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8, "bf16": {"enabled": true, "enabled": false},'
                    ' "zero_optimization": {"stage": 1, "stage": 2}, "train_batch_size": 16}')
    got = [(f.path, f.key) for f in check_config(str(path)) if f.kind == "duplicate"]
    assert sorted(got) == [("", "train_batch_size"), ("bf16", "enabled"), ("zero_optimization", "stage")]
    assert load_config(str(path))["train_batch_size"] == 16  # last one wins, as in json.load


def test_alias_and_field_together_is_a_duplicate():
    got = kinds(check_config({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 10,
                                                    "stage3_prefetch_bucket_size": 20}}))
    assert got[("zero_optimization", "stage3_prefetch_bucket_size")] == "duplicate"


def test_contradictions():
    got = kinds(check_config({"fp16": {"enabled": True}, "bf16": {"enabled": True}}))
    assert got[("", "fp16")] == "contradictory"
    assert check_config({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}) == []  # Hugging Face decides later
    got = kinds(check_config({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}))
    assert got[("zero_optimization", "offload_optimizer")] == "contradictory"
    got = kinds(check_config({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}))
    assert got[("zero_optimization", "offload_param")] == "contradictory"
    got = kinds(check_config({"pipeline": {"activation_checkpoint_interval": 1}, "zero_optimization": {"stage": 2}}))
    assert got[("zero_optimization", "stage")] == "contradictory"
    got = kinds(check_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 2}, world_size=2))
    assert got[("", "train_batch_size")] == "contradictory"


def test_removed_invalid_and_report():
    found = check_config({"elasticity": {"enabled": True}, "bf16": {"enabled": "maybe"}})
    got = kinds(found)
    assert got[("", "elasticity")] == "removed" and got[("bf16", "enabled")] == "invalid"
    assert all(isinstance(f, Finding) for f in found)
    assert "removed" in report(found) and "elasticity" in report(found)


def test_bad_source_says_what_it_wants():
    with pytest.raises(ValueError, match="dict literal"):
        load_config("x = 1")
    assert json.loads(json.dumps(load_config('{"a": 1}'))) == {"a": 1}
