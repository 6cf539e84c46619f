"""llama.cpp's GGUF files as specdec-build's checkpoint.

Each file is written from a tiny Hugging Face checkpoint the way llama.cpp's converter writes it (tests/gguf_files.py:
gguf-py names, quantizes and writes; the q/k interleave and rope_freqs as convert_hf_to_gguf.py makes them). A float
file must give the source checkpoint's logits; Q4_0 / Q8_0 layers must reach the engine as the file's own codes, and
the whole file must decode as transformers reads it (its GGUF loader: an independent reading of the same file).
"""

import json

import gguf
import numpy as np
import pytest
import torch
from checkpoints import add_word_tokenizer, load_hf, make_checkpoint
from conftest import build_and_load, cli_build, engine_greedy, spec_build
from gguf_files import add_bpe_tokenizer, permute, write_gguf

from specdec.builder.checkpoint import load_checkpoint
from specdec.formats.errors import CheckpointError

LLAMA3_ROPE = dict(rope_theta=50000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                          original_max_position_embeddings=16))
CASES = {
    # Llama 3.1's rotary scaling reaches a GGUF file only as llama.cpp's rope_freqs tensor
    "llama-untied-rope-llama3": ("LlamaForCausalLM", dict(tie_word_embeddings=False, **LLAMA3_ROPE)),
    "llama-rope-linear": ("LlamaForCausalLM", dict(rope_scaling=dict(rope_type="linear", factor=2.0))),
    "mistral": ("MistralForCausalLM", dict(sliding_window=None)),  # llama.cpp writes Mistral as 'llama'
    "qwen2-qkv-bias-tied": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3-qk-norm-head-dim": ("Qwen3ForCausalLM", dict(head_dim=24, tie_word_embeddings=False)),
    "phi3-fused": ("Phi3ForCausalLM", dict(sliding_window=2047)),
}
QUANT_TINY = dict(hidden_size=128, intermediate_size=256)  # every input width a multiple of Q4_0's 32


def logits_and_greedy(ex, ids: torch.Tensor):
    cache = ex.new_cache(1)
    context = ex.forward(cache, [ids[0, :12].tolist()], all_logits=True).logits[0]
    several = ex.forward(cache, [ids[0, 12:17].tolist()], all_logits=True).logits[0]  # a verification's k+1 rows
    return np.concatenate([context, several]), engine_greedy(ex, ids[0, :10].tolist(), 24)


def engine_logits(engine_dir, ids: torch.Tensor) -> np.ndarray:
    """The logits (logits_and_greedy's) of the engine at ``engine_dir``, opened on one thread."""
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor

    return logits_and_greedy(OrtExecutor(load_engine_dir(engine_dir), num_threads=1), ids)[0]


def transformers_logits(folder, ids: torch.Tensor) -> np.ndarray:
    """``folder``/model.gguf as transformers' own GGUF loader reads it: an independent reading of the same file."""
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf", dtype=torch.float32).eval()(ids).logits[0].numpy()


def prompt_ids(vocab: int = 96) -> torch.Tensor:
    return torch.randint(3, vocab, (1, 17), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", list(CASES))
def test_float_gguf_gives_the_source_checkpoints_logits(case, tmp_path):
    arch, overrides = CASES[case]
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **overrides)
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf")
    ex = build_and_load(gguf_file, tmp_path / "engine", spec_build())
    ids = prompt_ids()
    got, greedy = logits_and_greedy(ex, ids)
    with torch.no_grad():
        hf = load_hf(ckpt)
        want = hf(ids).logits[0].numpy()
        want_greedy = hf.generate(ids[:, :10], max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    assert greedy == want_greedy


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_q4_0_and_q8_0_layers_are_read_as_the_files_own_codes(kind, arch, tmp_path):
    """Bit for bit against gguf-py's dequantization; Llama's q and k rows put back in Hugging Face's order."""
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **QUANT_TINY)
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf", linear_type=kind)
    read = load_checkpoint(gguf_file)
    reader = gguf.GGUFReader(str(gguf_file))
    cfg = json.loads((ckpt / "config.json").read_text())
    checked = 0
    for t in reader.tensors:
        if t.tensor_type.name != kind:
            continue
        layer, short = t.name.split(".")[1], t.name.split(".")[2]
        hf_name = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                   "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}[short]
        weight = read.int_weight(f"model.layers.{layer}.{hf_name}.weight")
        assert (weight.bits, weight.group_size, weight.symmetric, weight.source) == ((4 if kind == "Q4_0" else 8), 32, True, "gguf")
        ours = weight.dequantized().T  # [out, in], Hugging Face's row order
        if arch == "LlamaForCausalLM" and short in ("attn_q", "attn_k"):
            ours = permute(ours, cfg["num_attention_heads"] if short == "attn_q" else cfg["num_key_value_heads"])
        np.testing.assert_array_equal(ours, gguf.quants.dequantize(t.data, t.tensor_type))
        checked += 1
    assert checked == 7 * cfg["num_hidden_layers"]


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_quantized_gguf_builds_an_integer_engine_that_decodes_as_transformers_reads_the_file(kind, tmp_path):
    """The int engine runs the codes in MatMulNBits at accuracy_level 4 (int8 activations: within 3% of the logits'
    range, as for GPTQ checkpoints, test_quant_checkpoints.py); the same file built dequantized (--qformat none)
    must give transformers' logits for the file to float precision."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", tie_word_embeddings=False, **QUANT_TINY)
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf", linear_type=kind, embedding_type="Q8_0")
    r = cli_build(gguf_file, tmp_path / "int", "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", 4)
    assert r.exit_code == 0, r.output
    wo = json.loads((tmp_path / "int" / "config.json").read_text())["build"]["weight_only"]
    assert (wo["bits"], wo["group_size"], wo["symmetric"], wo["source"]) == ((4 if kind == "Q4_0" else 8), 32, True, "gguf")
    assert cli_build(gguf_file, tmp_path / "float", "--qformat", "none").exit_code == 0

    ids = prompt_ids()
    want = transformers_logits(tmp_path, ids)
    np.testing.assert_allclose(engine_logits(tmp_path / "float", ids), want, atol=2e-4, rtol=0)
    # the codes in float arithmetic: DequantizeLinear + MatMul (portable), and the torch backend's kernels
    assert cli_build(gguf_file, tmp_path / "portable", "--lowering", "portable").exit_code == 0
    np.testing.assert_allclose(engine_logits(tmp_path / "portable", ids), want, atol=2e-4, rtol=0)
    from specdec.formats.engine_format import load_engine_dir
    from specdec.runtime.backends.torch.executor import TorchExecutor

    assert cli_build(gguf_file, tmp_path / "torch", "--backend", "torch").exit_code == 0
    torch_ex = TorchExecutor(load_engine_dir(tmp_path / "torch"), "cpu")
    np.testing.assert_allclose(torch_ex.forward(torch_ex.new_cache(1), [ids[0, :12].tolist()], all_logits=True).logits[0], want[:12], atol=2e-4,
                               rtol=0)
    # int8 activations, as llama.cpp's Q4_0 x Q8_0: ONNX Runtime's MatMulNBits and specdec's own kernel (the file's code 0,
    # -8, and its negative scales included)
    r = cli_build(gguf_file, tmp_path / "kernel", "--cpu_kernels", "specdec")
    assert r.exit_code == 0, r.output
    span = want.max() - want.min()
    for name in ("int", "kernel"):
        assert np.abs(engine_logits(tmp_path / name, ids) - want).max() <= 0.03 * span, name

    from click.testing import CliRunner

    from specdec.cli.run import main as run_main

    (tmp_path / "prompts.csv").write_text("5,6,7,8,5,6,7\n9,10,11\n")
    r = CliRunner().invoke(run_main, [str(a) for a in ("--engine_dir", tmp_path / "int", "--ngram_config", "[4,2,[0]]", "--input_file",
                                                        tmp_path / "prompts.csv", "--max_output_len", 12, "--baseline")])
    assert r.exit_code == 0, r.output
    assert "outputs identical to target-only: yes" in r.output


def test_types_without_a_kernel_are_dequantized_and_the_build_says_what_it_did(tmp_path):
    """Q5_0 stands for the K-quants (which gguf-py cannot write): read dequantized, built in float by default, and rounded
    again only when --qformat asks; float16 matrices make a float16 engine by default, as a float16 checkpoint does."""
    ckpt = make_checkpoint(tmp_path / "ckpt", **QUANT_TINY)
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf", linear_type="Q5_0")
    r = cli_build(gguf_file, tmp_path / "float", "--dtype", "float32")
    assert r.exit_code == 0, r.output
    assert ("note: model.gguf holds linear layers in ggml types specdec has no kernel for (14 Q5_0), read dequantized: this engine stores "
            "them in float") in r.output
    assert json.loads((tmp_path / "float" / "config.json").read_text())["build"]["weight_only"] is None
    ids = prompt_ids()
    want = transformers_logits(tmp_path, ids)
    got = engine_logits(tmp_path / "float", ids)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)

    r = cli_build(gguf_file, tmp_path / "int4", "--qformat", "int4_wo")
    assert r.exit_code == 0 and "--qformat int4_wo rounds them again (a second rounding)" in r.output, r.output
    assert json.loads((tmp_path / "int4" / "config.json").read_text())["build"]["weight_only"]["source"] == "rtn"

    r = cli_build(write_gguf(ckpt, tmp_path / "half.gguf", linear_type="F16"), tmp_path / "half")
    assert r.exit_code == 0 and "note:" not in r.output, r.output
    assert json.loads((tmp_path / "half" / "config.json").read_text())["build"]["dtype"] == "float16"


def test_a_file_of_several_types_keeps_the_main_ones_codes_and_reads_the_rest_as_float(tmp_path):
    """llama-quantize --tensor-type gives some matrices other types: a Q8_0 v_proj beside Q4_0 q and k (one fused
    MatMul: the group is read as float) and a Q5_0 down_proj. The build says so, and the file decodes as transformers
    reads it."""
    ckpt = make_checkpoint(tmp_path / "ckpt", **QUANT_TINY)
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf", linear_type="Q4_0", types={"attn_v": "Q8_0", "ffn_down": "Q5_0"})
    read = load_checkpoint(gguf_file)
    assert read.int_weight("model.layers.0.self_attn.v_proj.weight") is None  # Q8_0 beside Q4_0: not codes
    assert read.int_weight("model.layers.0.self_attn.q_proj.weight").bits == 4
    r = cli_build(gguf_file, tmp_path / "engine", "--lowering", "portable")
    assert r.exit_code == 0, r.output
    assert ("holds linear layers of other types beside its Q4_0 ones (2 Q5_0, 2 Q8_0): they are read dequantized and stay float in this "
            "engine, as do the Q4_0 projections fused with one of them") in r.output
    wo = json.loads((tmp_path / "engine" / "config.json").read_text())["build"]["weight_only"]
    assert wo["source"] == "gguf" and wo["layers"] == ["attn/o_proj", "mlp/gate_up_proj"]
    ids = prompt_ids()
    want = transformers_logits(tmp_path, ids)
    got = engine_logits(tmp_path / "engine", ids)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)  # portable: the codes in float arithmetic


def test_phi3s_sliding_window_is_read_as_from_the_checkpoint(tmp_path):
    """llama.cpp writes Phi-3's window (and ignores it); transformers masks by it, and so does specdec's build: a window
    shorter than max_seq_len is refused from the file as from the checkpoint."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "Phi3ForCausalLM", sliding_window=64)
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf")
    assert load_checkpoint(gguf_file).hf_config["sliding_window"] == 64
    for source in (ckpt, gguf_file):
        r = cli_build(source, tmp_path / "engine")  # --max_seq_len 96
        assert r.exit_code != 0 and "sliding_window=64 is smaller than max_seq_len=96" in r.output, r.output


def test_one_part_of_a_split_file_is_refused_with_what_to_do(tmp_path):
    gguf_file = write_gguf(make_checkpoint(tmp_path / "ckpt"), tmp_path / "model-00001-of-00002.gguf", extra_keys={"split.count": 2})
    r = cli_build(gguf_file, tmp_path / "engine")
    assert r.exit_code != 0 and "is one of 2 parts of a split GGUF file: merge them first (llama-gguf-split --merge" in r.output, r.output


def test_a_tokenizer_without_its_token_list_is_refused(tmp_path):
    gguf_file = write_gguf(make_checkpoint(tmp_path / "ckpt"), tmp_path / "model.gguf", extra_keys={"tokenizer.ggml.model": 1})
    r = cli_build(gguf_file, tmp_path / "engine")
    assert r.exit_code == 1 and "names a tokenizer (tokenizer.ggml.model) but holds no token list" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "engine").exists()


def test_tokenizer_and_chat_template_come_from_the_file(tmp_path):
    from tokenizers import Tokenizer

    ckpt = add_bpe_tokenizer(make_checkpoint(tmp_path / "ckpt", "LlamaForCausalLM", vocab_size=320, bos_token_id=1, eos_token_id=2), 320)
    template = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<s>assistant:{% endif %}"
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf", chat_template=template)
    # tokenizer files beside the file (convert_hf_to_gguf.py writes into the checkpoint's folder) are not the file's: unused
    add_word_tokenizer(tmp_path)
    r = cli_build(gguf_file, tmp_path / "engine")
    assert r.exit_code == 0, r.output
    assert "no tokenizer files" not in r.output
    built, source = Tokenizer.from_file(str(tmp_path / "engine" / "tokenizer.json")), Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    assert built.get_vocab() == source.get_vocab()  # the word tokenizer beside the file added its <unk> before it was kept apart
    for text in ["class Stack:\n    def push(self, x):", "for i in range(10): print(i * i)", "héllo wörld  \t 123", "<s>x</s>"]:
        assert built.encode(text).ids == source.encode(text).ids, text
        assert built.decode(source.encode(text).ids) == source.decode(source.encode(text).ids)
    assert (tmp_path / "engine" / "chat_template.jinja").read_text() == template  # where transformers 5 saves it; specdec-serve reads it

    from click.testing import CliRunner

    from specdec.cli.run import main as run_main

    r = CliRunner().invoke(run_main, ["--engine_dir", str(tmp_path / "engine"), "--input_text", "def add(a, b):", "--max_output_len", "8"])
    assert r.exit_code == 0, r.output
    assert "output (8 tokens" in r.output


def test_a_file_without_a_tokenizer_builds_and_says_so(tmp_path):
    gguf_file = write_gguf(make_checkpoint(tmp_path / "ckpt"), tmp_path / "model.gguf")
    r = cli_build(gguf_file, tmp_path / "engine")
    assert r.exit_code == 0, r.output
    assert "no tokenizer files" in r.output
    assert not (tmp_path / "engine" / "tokenizer.json").exists()


def _junk(path):
    path.write_bytes(b"GGUF not really")
    return path


def _write_other(path, arch: str, tensor: str = "token_embd.weight"):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor(tensor, np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _experts(tmp_path):
    """A Llama file with a mixture-of-experts tensor beside its own."""
    ckpt = make_checkpoint(tmp_path / "ckpt")
    path = write_gguf(ckpt, tmp_path / "dense.gguf")
    reader = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "model.gguf"), "llama")
    for key in ("llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
                "llama.attention.head_count_kv", "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size"):
        field = reader.fields[key]
        w.add_key_value(key, field.parts[field.data[0]].tolist()[0], field.types[0])
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data))
    w.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((2, 4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "model.gguf"


@pytest.mark.parametrize("make,message", [
    (lambda p: _junk(p / "model.gguf"), "model.gguf is not a readable GGUF file"),
    (lambda p: _write_other(p / "model.gguf", "gemma"), "GGUF architecture 'gemma' (field general.architecture) is not supported; supported: llama"),
    (_experts, "tensor 'blk.0.ffn_gate_exps.weight' is not one a llama network reads (a mixture-of-experts or multimodal file?)"),
])
def test_files_it_cannot_build_are_one_clean_error(tmp_path, make, message):
    path = make(tmp_path)
    r = cli_build(path, tmp_path / "engine")
    assert r.exit_code != 0
    assert r.output.startswith("error: ") and message in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "engine").exists()


def test_the_files_quantization_is_kept_as_it_is(tmp_path):
    gguf_file = write_gguf(make_checkpoint(tmp_path / "ckpt", **QUANT_TINY), tmp_path / "model.gguf", linear_type="Q4_0")
    r = cli_build(gguf_file, tmp_path / "engine", "--qformat", "int4_wo", "--group_size", "128")
    assert r.exit_code != 0
    assert "error: --group_size 128: the checkpoint holds gguf int4 weights (group size 32), which is kept as is" in r.output
    r = cli_build(gguf_file, tmp_path / "engine", "--qformat", "int8_wo")
    assert r.exit_code != 0 and "build them as they are (--qformat auto or int4_wo), or dequantize them with --qformat none" in r.output


def test_without_the_gguf_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    gguf_file = write_gguf(make_checkpoint(tmp_path / "ckpt"), tmp_path / "model.gguf")
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)
    from specdec.builder import gguf_checkpoint

    gguf_checkpoint._hf_config_cached.cache_clear()
    with pytest.raises(CheckpointError, match=r"needs the gguf extra: pip install 'specdec\[build,gguf\]'"):
        load_checkpoint(gguf_file)


def test_quantize_lm_head_rounds_the_files_output_matrix_and_keeps_its_layers(tmp_path):
    """The output matrix (F32 here, Q6_K from llama-quantize) is rounded to int4 in groups of 32; the layers stay the file's."""
    ckpt = make_checkpoint(tmp_path / "ckpt", tie_word_embeddings=False, **QUANT_TINY)
    gguf_file = write_gguf(ckpt, tmp_path / "model.gguf", linear_type="Q4_0")
    r = cli_build(gguf_file, tmp_path / "engine", "--quantize_lm_head", "--lowering", "portable")
    assert r.exit_code == 0, r.output
    wo = json.loads((tmp_path / "engine" / "config.json").read_text())["build"]["weight_only"]
    assert (wo["bits"], wo["group_size"], wo["source"]) == (4, 32, "gguf") and "lm_head" in wo["layers"]
    assert cli_build(gguf_file, tmp_path / "float_head", "--lowering", "portable").exit_code == 0
    ids = prompt_ids()
    rounded, exact = engine_logits(tmp_path / "engine", ids), engine_logits(tmp_path / "float_head", ids)
    span = exact.max() - exact.min()
    assert 0 < np.abs(rounded - exact).max() <= 0.1 * span  # the head's int4 rounding, and only that


def test_an_older_transformers_is_refused_with_the_upgrade_line(tmp_path, monkeypatch):
    """transformers 5.3 converted a GPT-2-style GGUF vocabulary into a CodeLlama tokenizer with the wrong end token."""
    import transformers

    gguf_file = write_gguf(make_checkpoint(tmp_path / "ckpt"), tmp_path / "model.gguf")
    monkeypatch.setattr(transformers, "__version__", "5.3.0")
    from specdec.builder import gguf_checkpoint

    gguf_checkpoint._hf_config_cached.cache_clear()
    with pytest.raises(CheckpointError, match=r"needs transformers >= 5\.24 \(found 5\.3\.0, .*pip install 'transformers>=5\.24,<6'"):
        load_checkpoint(gguf_file)
