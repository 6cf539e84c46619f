"""config.json read as typed fields: a value of the wrong type or range is one line naming the field (formats/typed_json.py)."""

import json

import pytest
from click.testing import CliRunner

from specdec.cli.run import main as run_main
from specdec.formats.engine_format import CONFIG_FILE, load_engine_dir
from specdec.formats.errors import EngineError


@pytest.mark.parametrize(
    "section,field,value,message",
    [
        ("build", "max_batch_size", "8", "build.max_batch_size: expected an integer, got the string '8'"),
        ("build", "max_batch_size", 0, "build.max_batch_size: expected an integer >= 1, got 0"),
        ("build", "max_seq_len", 96.5, "build.max_seq_len: expected an integer, got 96.5"),
        ("build", "tree_attention", "false", "build.tree_attention: expected true or false, got the string 'false'"),
        ("build", "speculative_decoding_mode", "lookahead", "build.speculative_decoding_mode: expected one of none, draft_tokens_external"),
        ("build", "kv_layout", "nhsd", "build.kv_layout: expected one of bnsh, bsh, got 'nhsd'"),
        ("build", "max_input_len", 4096, "build.max_input_len: 4096 is more than build.max_seq_len"),
        ("build", "eagle_aux_layer_ids", [1, "2"], "build.eagle_aux_layer_ids[1]: expected an integer, got the string '2'"),
        ("build", "group_size", "128", "build.group_size: expected an integer or null"),
        ("build", "max_batch_sizes", 8, "build.max_batch_sizes: not a field of this engine format"),
        ("model", "eos_token_id", 2, "model.eos_token_id: expected a list of integers, got 2"),
        ("model", "rope_theta", "1e4", "model.rope_theta: expected a number, got the string '1e4'"),
        ("model", "vocab_size", None, "model.vocab_size: expected an integer, got null"),
    ],
)
def test_a_config_field_of_the_wrong_type_or_range_is_one_line(engine_copy, section, field, value, message):
    cfg = json.loads((engine_copy / CONFIG_FILE).read_text())
    cfg[section][field] = value
    (engine_copy / CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(EngineError) as err:
        load_engine_dir(engine_copy)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{CONFIG_FILE} {section}.{field}")


def test_typed_fields_come_back_as_their_types(engine_copy):
    from specdec.formats.engine_format import EngineConfig

    cfg = json.loads((engine_copy / CONFIG_FILE).read_text())
    cfg["model"]["rope_theta"] = 10000  # JSON has no float/int distinction for whole numbers
    cfg["build"]["eagle_aux_layer_ids"] = [0, 1]
    loaded = EngineConfig.from_dict(cfg)  # (read as an engine, the edited fields would be refused: the stamp below)
    assert loaded.model.rope_theta == 10000.0 and isinstance(loaded.model.rope_theta, float)
    assert loaded.build.eagle_aux_layer_ids == (0, 1)  # a tuple field, as the builder writes it


def test_a_string_limit_is_a_one_line_cli_error(engine_copy):
    cfg = json.loads((engine_copy / CONFIG_FILE).read_text())
    cfg["build"]["max_batch_size"] = "8"
    (engine_copy / CONFIG_FILE).write_text(json.dumps(cfg))
    r = CliRunner().invoke(run_main, ["--engine_dir", str(engine_copy), "--input_text", "x"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.startswith("error: config.json build.max_batch_size: expected an integer, got the string '8'")


# -- config.json edited after the build --------------------------------------------------------------------------------
EDITS = [  # (section, field, new value, what the refusal names)
    ("model", "vocab_size", 1000, "model.vocab_size=1000, but the engine was built with 96"),
    ("model", "num_layers", 3, "model.num_layers=3, but the engine was built with 2"),
    ("build", "kv_layout", "bnsh", 'build.kv_layout="bnsh", but the engine was built with "bsh"'),
    ("build", "max_seq_len", 4096, "build.max_seq_len=4096, but the engine was built with 96"),
    ("build", "max_batch_size", 64, "build.max_batch_size=64, but the engine was built with 4"),
    ("model", "num_kv_heads", 4, "model.num_kv_heads=4, but the engine was built with 2"),
]


def edit(engine, section, field, value, unstamp=False):
    from specdec.formats.engine_format import STAMP_FILE

    cfg = json.loads((engine / CONFIG_FILE).read_text())
    cfg[section][field] = value
    if unstamp:  # an engine built before build stamps
        (engine / STAMP_FILE).unlink()
        del cfg["files"][STAMP_FILE]
    (engine / CONFIG_FILE).write_text(json.dumps(cfg))


@pytest.mark.parametrize("section,field,value,says", EDITS, ids=[e[1] for e in EDITS])
def test_an_edited_config_is_refused_at_load_naming_the_field_and_both_values(engine_copy, section, field, value, says):
    edit(engine_copy, section, field, value)
    with pytest.raises(EngineError) as err:
        load_engine_dir(engine_copy)
    assert says in str(err.value) and "edited after the build" in str(err.value) and "\n" not in str(err.value)
    r = CliRunner().invoke(run_main, ["--engine_dir", str(engine_copy), "--input_file", "/dev/null"])
    assert r.exit_code == 1 and "Traceback" not in r.output and says in r.stderr.splitlines()[-1]


def test_an_engine_stamped_before_a_field_existed_still_loads(engine_copy):
    """A field added to the format since the build is absent from config.json and from the stamp alike: both read it
    as its default, so they agree (found in review: the stamp was compared as raw JSON and refused every such engine)."""
    from specdec.formats.engine_format import STAMP_FILE, sha256_file

    cfg = json.loads((engine_copy / CONFIG_FILE).read_text())
    stamp = json.loads((engine_copy / STAMP_FILE).read_text())
    for held in (cfg, stamp):
        del held["build"]["cpu_kernels"]
    (engine_copy / STAMP_FILE).write_text(json.dumps(stamp))
    cfg["files"][STAMP_FILE] = sha256_file(engine_copy / STAMP_FILE)
    (engine_copy / CONFIG_FILE).write_text(json.dumps(cfg))
    assert load_engine_dir(engine_copy).config.build.cpu_kernels == "ort"
    edit(engine_copy, "build", "cpu_kernels", "specdec")  # an edit is still caught against the default the stamp implies
    with pytest.raises(EngineError, match='build.cpu_kernels="specdec", but the engine was built with "ort"'):
        load_engine_dir(engine_copy)


NETWORK_EDITS = [  # what the network's own inputs and outputs show, for an engine without a stamp
    ("model", "vocab_size", 1000, "model.vocab_size=1000, but the network has 96 logits per token"),
    ("model", "num_layers", 3, "model.num_layers=3, but the network has 2 (its past_key.i inputs)"),
    ("build", "kv_layout", "bnsh", "build.kv_layout='bnsh', but the network has 'bsh'"),
    ("model", "num_kv_heads", 4, "the network has [32]"),
    ("build", "tree_attention", True, "build.tree_attention=true, but the network has no tree_mask input"),
    ("build", "speculative_decoding_mode", "medusa", "build.speculative_decoding_mode='medusa', but the network has no medusa_logits output"),
]


@pytest.mark.parametrize("section,field,value,says", NETWORK_EDITS, ids=[e[1] for e in NETWORK_EDITS])
def test_without_a_stamp_the_network_itself_refuses_an_edited_config(engine_copy, section, field, value, says):
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    edit(engine_copy, section, field, value, unstamp=True)
    if field == "speculative_decoding_mode":
        cfg = json.loads((engine_copy / CONFIG_FILE).read_text())
        cfg["build"]["medusa_num_heads"], cfg["build"]["medusa_num_layers"] = 2, 1
        (engine_copy / CONFIG_FILE).write_text(json.dumps(cfg))
    with pytest.raises(EngineError) as err:
        OrtExecutor(load_engine_dir(engine_copy), num_threads=1)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_unedited_engine_without_a_stamp_still_loads(engine_copy):
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    edit(engine_copy, "build", "max_seq_len", 96, unstamp=True)  # the value it has: an older engine, as built
    OrtExecutor(load_engine_dir(engine_copy), num_threads=1)


@pytest.mark.parametrize("field,value", [("max_seq_len", 2**31 - 1), ("max_batch_size", 2**31 - 1), ("max_seq_len", 10**30)])
def test_limits_this_machine_cannot_hold_are_refused_before_anything_is_allocated(engine_copy, field, value):
    """Found by the fuzzer (tests/runtime/test_fuzz_engine_config.py), on an engine without a stamp: an edited limit
    allocated tens of GiB (a 16 GiB position table, a lazily zeroed 256 GiB cache) before anything failed, or failed
    with a MemoryError traceback. The executor checks the KV cache against the physical memory first."""
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    edit(engine_copy, "build", field, value, unstamp=True)
    with pytest.raises(EngineError, match="more than this machine's physical memory") as err:
        OrtExecutor(load_engine_dir(engine_copy), num_threads=1)
    assert "\n" not in str(err.value)
