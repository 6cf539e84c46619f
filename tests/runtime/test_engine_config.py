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
    cfg = json.loads((engine_copy / CONFIG_FILE).read_text())
    cfg["model"]["rope_theta"] = 10000  # JSON has no float/int distinction for whole numbers
    cfg["build"]["eagle_aux_layer_ids"] = [0, 1]
    (engine_copy / CONFIG_FILE).write_text(json.dumps(cfg))
    loaded = load_engine_dir(engine_copy).config
    assert loaded.model.rope_theta == 10000.0 and isinstance(loaded.model.rope_theta, float)
    assert loaded.build.eagle_aux_layer_ids == (0, 1)  # a tuple field, as the builder writes it


def test_a_string_limit_is_a_one_line_cli_error(engine_copy):
    cfg = json.loads((engine_copy / CONFIG_FILE).read_text())
    cfg["build"]["max_batch_size"] = "8"
    (engine_copy / CONFIG_FILE).write_text(json.dumps(cfg))
    r = CliRunner().invoke(run_main, ["--engine_dir", str(engine_copy), "--input_text", "x"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.startswith("error: config.json build.max_batch_size: expected an integer, got the string '8'")
