"""specdec-build --lora_dir: peft LoRA adapters merged into the checkpoint's weights at build time.

The reference is peft itself: an engine built with an adapter must give the logits and greedy tokens of peft's adapted
model (its forward with the adapter unmerged, the way the adapter was trained), and several adapters or a scale what
peft's sequential merges give.
"""

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch
from checkpoints import load_hf, make_checkpoint, save_fp8_checkpoint
from click.testing import CliRunner
from conftest import cli_build, engine_greedy, spec_build
from engine_runs import generate, torch_one_thread  # noqa: F401 (a fixture)

from specdec.builder.build import build_engine
from specdec.formats.engine_format import load_engine_dir
from specdec.runtime.backends.onnxruntime.cpu import OrtExecutor
from specdec.runtime.proposers.draft_model import DraftModelProposer

peft = pytest.importorskip("peft")

pytestmark = pytest.mark.usefixtures("torch_one_thread")

LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = {
    # every linear layer, the LM head and the embedding of an untied Llama
    "llama-linear-lm-head-embedding": ("LlamaForCausalLM", dict(tie_word_embeddings=False),
                                       dict(r=4, lora_alpha=8, target_modules=[*LINEAR, "lm_head", "embed_tokens"])),
    # rsLoRA, a rank and an alpha per module pattern, a whole LM head trained in place (modules_to_save); Qwen2's q/k/v biases stay
    "qwen2-rslora-patterns-modules-to-save": ("Qwen2ForCausalLM", dict(tie_word_embeddings=False),
                                              dict(r=6, lora_alpha=4, use_rslora=True, target_modules=LINEAR, modules_to_save=["lm_head"],
                                                   rank_pattern={"layers.1.self_attn.q_proj": 2}, alpha_pattern={"down_proj": 16})),
    # biases trained beside the LoRA (bias="all": peft saves the targeted layers' as base_layer.bias)
    "qwen2-trained-biases": ("Qwen2ForCausalLM", dict(tie_word_embeddings=False),
                             dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], bias="all")),
    # Phi-3's fused projections are peft's target modules as they are
    "phi3-fused": ("Phi3ForCausalLM", dict(sliding_window=2047), dict(r=4, lora_alpha=16, target_modules=["qkv_proj", "gate_up_proj", "o_proj"])),
}


def make_adapter(ckpt, out, seed: int = 1, safe: bool = True, **lora) -> torch.nn.Module:
    """A peft LoRA adapter of ``ckpt`` with random (non-zero) A and B, saved to ``out``; the adapted model, unmerged."""
    torch.manual_seed(seed)
    model = peft.get_peft_model(load_hf(ckpt), peft.LoraConfig(init_lora_weights=False, **lora))
    with torch.no_grad():  # peft's random B is small; a larger one moves the logits well past the comparison's tolerance
        for name, p in model.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                p.mul_(4.0)
            elif "modules_to_save" in name or (name.endswith(".bias") and p.requires_grad):  # trained in place: unlike the base's
                p.add_(torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=safe)
    return model.eval()


def ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 96, (1, 17), generator=torch.Generator().manual_seed(seed))


def engine_logits(ex, prompt: torch.Tensor) -> np.ndarray:
    cache = ex.new_cache(1)
    context = ex.forward(cache, [prompt[0, :12].tolist()], all_logits=True).logits[0]
    several = ex.forward(cache, [prompt[0, 12:].tolist()], all_logits=True).logits[0]  # a verification's rows
    return np.concatenate([context, several])


def greedy(model, prompt: torch.Tensor, n: int = 20) -> list[int]:
    out = model.generate(input_ids=prompt[:, :10], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, 10:].tolist()


def build_merged(ckpt, out, adapters=(), scales=(), build=None):
    """The engine of ``ckpt`` with ``adapters`` merged, opened on one thread."""
    build_engine(ckpt, out, build or spec_build(), say=lambda _: None, lora_dirs=list(adapters), lora_scales=list(scales))
    return OrtExecutor(load_engine_dir(out), num_threads=1)


@pytest.mark.parametrize("case", list(CASES))
def test_merged_engine_gives_the_adapted_models_logits(case, tmp_path):
    arch, overrides, lora = CASES[case]
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **overrides)
    adapted = make_adapter(ckpt, tmp_path / "adapter", **lora)
    base = engine_logits(build_merged(ckpt, tmp_path / "base"), ids())
    merged = build_merged(ckpt, tmp_path / "merged", [tmp_path / "adapter"])
    got = engine_logits(merged, ids())
    with torch.no_grad():
        want = adapted(ids()).logits[0].numpy()
        want_greedy = greedy(adapted, ids())
    assert np.abs(want - base).max() > 0.5  # the adapter changes what the model computes: the comparison below can fail
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    assert engine_greedy(merged, ids()[0, :10].tolist(), 20) == want_greedy


def scaled_copy(adapter, out, factor: float):
    """``adapter`` with lora_alpha (and every alpha_pattern) times ``factor``: peft's own model of a scaled update."""
    shutil.copytree(adapter, out)
    cfg = json.loads((out / "adapter_config.json").read_text())
    cfg["lora_alpha"] *= factor
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    return out


def test_several_adapters_merge_in_order_each_scaled(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", tie_word_embeddings=False)
    make_adapter(ckpt, tmp_path / "a1", seed=1, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj", "lm_head"])
    # the second trains the LM head whole: the first's update of it is gone, as in peft
    make_adapter(ckpt, tmp_path / "a2", seed=2, r=2, lora_alpha=2, target_modules=["q_proj", "o_proj"], modules_to_save=["lm_head"])
    got = engine_logits(build_merged(ckpt, tmp_path / "e", [tmp_path / "a1", tmp_path / "a2"], [0.5, 2.0]), ids())
    with torch.no_grad():  # peft: the first merged into the base, the second run on top, alphas scaled
        first = peft.PeftModel.from_pretrained(load_hf(ckpt), scaled_copy(tmp_path / "a1", tmp_path / "s1", 0.5)).merge_and_unload()
        both = peft.PeftModel.from_pretrained(first, scaled_copy(tmp_path / "a2", tmp_path / "s2", 2.0)).eval()
        want = both(ids()).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    # scale 0 is the base model, bit for bit (a modules_to_save tensor would replace the base's whatever the scale)
    zero = engine_logits(build_merged(ckpt, tmp_path / "z", [tmp_path / "a1"], [0.0]), ids())
    np.testing.assert_array_equal(zero, engine_logits(build_merged(ckpt, tmp_path / "b"), ids()))


def test_cli_merges_records_and_speculation_stays_exact(tmp_path):
    """specdec-build --lora_dir says what it merged and records it; a merged target drafted for by the base model's engine
    decodes exactly what it decodes alone."""
    ckpt = make_checkpoint(tmp_path / "ckpt", tie_word_embeddings=False)
    make_adapter(ckpt, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=LINEAR)
    result = cli_build(ckpt, tmp_path / "target", "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", 4,
                       "--lora_dir", tmp_path / "adapter")
    assert result.exit_code == 0, result.output
    assert f"note: LoRA adapter {(tmp_path / 'adapter').resolve()} merged (scale 1, r 4): 14 layers updated." in result.output
    record = json.loads((tmp_path / "target" / "config.json").read_text())["extra"]["lora"]
    weights = (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes()
    assert record == [{"path": str((tmp_path / "adapter").resolve()), "scale": 1.0, "sha256": hashlib.sha256(weights).hexdigest(), "r": [4],
                       "lora_alpha": 8, "use_rslora": False, "updated": 14, "replaced": [], "base_model_name_or_path": str(ckpt)}]
    target = OrtExecutor(load_engine_dir(tmp_path / "target"), num_threads=1)
    draft = build_merged(ckpt, tmp_path / "draft", build=spec_build(0, max_batch_size=8))  # the base model drafts for its fine-tune
    prompts = [ids(s)[0, :10].tolist() for s in (1, 2, 3)]
    out, stats = generate(target, [DraftModelProposer(draft)], "draft", 4, prompts)
    assert out == [engine_greedy(target, p, 20) for p in prompts]
    assert stats.accepted > 0


def test_a_pickled_adapter_needs_allow_pickle(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    adapted = make_adapter(ckpt, tmp_path / "adapter", safe=False, r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])
    assert not (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    refused = cli_build(ckpt, tmp_path / "e", "--lora_dir", tmp_path / "adapter")
    assert refused.exit_code != 0 and "pickled adapter (adapter_model.bin)" in refused.output and "--allow_pickle" in refused.output
    assert not (tmp_path / "e").exists()
    ok = cli_build(ckpt, tmp_path / "e", "--lora_dir", tmp_path / "adapter", "--allow_pickle")
    assert ok.exit_code == 0, ok.output
    with torch.no_grad():
        want = adapted(ids()).logits[0].numpy()
    np.testing.assert_allclose(engine_logits(OrtExecutor(load_engine_dir(tmp_path / "e"), num_threads=1), ids()), want, atol=2e-4, rtol=0)


def edit_config(adapter, **changes):
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**cfg, **changes}))


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    ckpt = make_checkpoint(d / "ckpt", tie_word_embeddings=False)
    make_adapter(ckpt, d / "good", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    return d, ckpt


def variant(refusals, name, **changes):
    d, _ = refusals
    out = d / name
    if not out.exists():
        shutil.copytree(d / "good", out)
        edit_config(out, **changes)
    return out


def refused(refusals, tmp_path, *flags, ckpt=None) -> str:
    d, base = refusals
    result = cli_build(ckpt or base, tmp_path / "engine", *flags)
    assert result.exit_code != 0, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]  # (stdout's progress lines beside it)
    assert "Traceback" not in result.output and len(errors) == 1, result.output
    assert not (tmp_path / "engine").exists()  # nothing written
    return errors[0]


@pytest.mark.parametrize("key, value, said", [
    ("use_dora", True, "DoRA"),
    ("lora_bias", True, "a bias on lora_B"),
    ("fan_in_fan_out", True, "fan_in_fan_out"),
    ("peft_type", "IA3", "a IA3 adapter"),
    ("lora_alpha", "eight", "lora_alpha is 'eight'"),
    ("init_lora_weights", "pissa_niter_4", "subtracts its initial B·A from the base weights"),
    ("init_lora_weights", "olora", "path_initial_model_for_weight_conversion"),
    ("arrow_config", {"top_k": 2}, "Arrow routing"),
    ("use_rslora", "yes", "use_rslora is 'yes'"),
])
def test_adapters_that_do_not_merge_as_w_plus_ba_are_refused(refusals, tmp_path, key, value, said):
    adapter = variant(refusals, f"{key}-{value}".replace("{", "").replace("}", "").replace(":", "").replace("'", "").replace(" ", ""),
                      **{key: value})
    assert said in refused(refusals, tmp_path, "--lora_dir", adapter)


def test_bad_adapter_folders_and_flags_are_refused(refusals, tmp_path):
    d, ckpt = refusals
    good = d / "good"
    assert "does not exist or is not a directory" in refused(refusals, tmp_path, "--lora_dir", d / "nowhere")
    assert "a whole model, not an adapter" in refused(refusals, tmp_path, "--lora_dir", ckpt)
    assert "given 2 times for 1 --lora_dir" in refused(refusals, tmp_path, "--lora_dir", good, "--lora_scale", 1, "--lora_scale", 2)
    assert "--lora_scale nan is not a finite number" in refused(refusals, tmp_path, "--lora_dir", good, "--lora_scale", "nan")
    empty = d / "no-weights"
    if not empty.exists():
        empty.mkdir()
        shutil.copy(good / "adapter_config.json", empty)
    assert "has no adapter_model.safetensors" in refused(refusals, tmp_path, "--lora_dir", empty)
    inside = tmp_path / "engine" / "adapter"  # the output may not hold an input
    shutil.copytree(good, inside)
    result = cli_build(ckpt, tmp_path / "engine", "--lora_dir", inside, "--force")
    assert result.exit_code != 0 and "is or holds --lora_dir" in result.output, result.output


def test_an_adapter_of_another_model_is_refused(refusals, tmp_path):
    d, ckpt = refusals
    wider = make_checkpoint(tmp_path / "wider", hidden_size=96, tie_word_embeddings=False)
    make_adapter(wider, tmp_path / "wide", r=4, lora_alpha=8, target_modules=["q_proj"])
    out = refused(refusals, tmp_path, "--lora_dir", tmp_path / "wide")
    assert "the update of model.layers.0.self_attn.q_proj.weight is [96, 96], the checkpoint's" in out and "[64, 64]" in out
    phi3 = make_checkpoint(tmp_path / "phi3", "Phi3ForCausalLM")
    make_adapter(phi3, tmp_path / "fused", r=4, lora_alpha=8, target_modules=["qkv_proj"])
    assert "changes model.layers.0.self_attn.qkv_proj, which checkpoint" in refused(refusals, tmp_path, "--lora_dir", tmp_path / "fused")


def test_a_tied_lm_head_or_a_quantized_checkpoint_is_refused(refusals, tmp_path):
    tied = make_checkpoint(tmp_path / "tied", tie_word_embeddings=True)
    make_adapter(tied, tmp_path / "head", r=4, lora_alpha=8, target_modules=["q_proj", "embed_tokens"])
    out = refused(refusals, tmp_path, "--lora_dir", tmp_path / "head", ckpt=tied)
    assert "changes model.embed_tokens" in out and "ties its LM head to its embedding" in out
    make_adapter(tied, tmp_path / "lm-head", r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])  # (a tied model has no lm_head.weight)
    out = refused(refusals, tmp_path, "--lora_dir", tmp_path / "lm-head", ckpt=tied)
    assert "changes lm_head, and checkpoint" in out and "ties its LM head to its embedding" in out
    d, ckpt = refusals
    save_fp8_checkpoint(ckpt, tmp_path / "fp8", "modelopt")
    out = refused(refusals, tmp_path, "--lora_dir", d / "good", ckpt=tmp_path / "fp8")
    assert "holds FP8 (modelopt) weights" in out and "build from the float checkpoint the adapter was trained on" in out


def test_a_damaged_adapter_is_refused(refusals, tmp_path):
    from safetensors.numpy import load_file, save_file

    d, _ = refusals
    bad = tmp_path / "nan"
    shutil.copytree(d / "good", bad)
    tensors = load_file(bad / "adapter_model.safetensors")
    key = sorted(k for k in tensors if "lora_B" in k)[0]
    tensors[key][0, 0] = np.nan
    save_file(tensors, bad / "adapter_model.safetensors")
    assert "LoRA B holds NaN or Inf" in refused(refusals, tmp_path, "--lora_dir", bad)
    del tensors[key]
    save_file(tensors, bad / "adapter_model.safetensors")
    assert "without its B: the adapter file is incomplete" in refused(refusals, tmp_path, "--lora_dir", bad)
    good = load_file(d / "good" / "adapter_model.safetensors")
    for extra, said in [
        ({"base_model.model.lm_head.weight": np.full((96, 64), np.inf, np.float32)}, "lm_head.weight holds NaN or Inf"),
        ({"base_model.model.lm_head.weight": np.zeros((104, 64), np.float32)}, "(the adapter resized the vocabulary: not supported"),
        ({"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector": np.ones(64, np.float32)},
         "a LoRA tensor of a kind specdec does not merge"),
    ]:
        save_file({**good, **extra}, bad / "adapter_model.safetensors")
        assert said in refused(refusals, tmp_path, "--lora_dir", bad)


def test_the_merge_is_what_every_backend_and_precision_reads(tmp_path):
    """The torch backend's engine gives peft's logits; an int4 engine quantizes the merged weights, as an int4 engine of peft's merged
    and saved checkpoint does."""
    from specdec.runtime.backends.torch.executor import TorchExecutor

    ckpt = make_checkpoint(tmp_path / "ckpt", tie_word_embeddings=False)
    adapted = make_adapter(ckpt, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=LINEAR)
    with torch.no_grad():
        want = adapted(ids()).logits[0].numpy()
        adapted.merge_and_unload().save_pretrained(tmp_path / "merged-by-peft")
    build_engine(ckpt, tmp_path / "torch", spec_build(backend="torch"), say=lambda _: None, lora_dirs=[tmp_path / "adapter"])
    np.testing.assert_allclose(engine_logits(TorchExecutor(load_engine_dir(tmp_path / "torch"), "cpu"), ids()), want, atol=2e-4, rtol=0)
    int4 = spec_build(quantization="int4_wo", group_size=32)
    got = engine_logits(build_merged(ckpt, tmp_path / "int4", [tmp_path / "adapter"], build=int4), ids())
    reference = engine_logits(build_merged(tmp_path / "merged-by-peft", tmp_path / "int4-peft", build=int4), ids())
    np.testing.assert_allclose(got, reference, atol=2e-3, rtol=0)
    assert np.abs(got - want).max() > 0.01  # (int4: not the float model's logits, so the comparison above is the one that counts)


def test_the_examples_adapter_builds(tmp_path):
    """examples/train_lora.py (two steps, on a copy of the stdlib's json package) writes an adapter specdec-build merges, and prompts."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    corpus = tmp_path / "corpus"
    shutil.copytree(Path(json.__file__).parent, corpus, ignore=shutil.ignore_patterns("__pycache__"))
    run = subprocess.run([sys.executable, root / "examples" / "train_lora.py", "--corpus", corpus, "--output-dir", tmp_path / "lora",
                          "--max-steps", "2", "--batch", "2", "--window", "64", "--rank", "4", "--prompts-file", tmp_path / "p.jsonl",
                          "--prompts", "3"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "held-out loss after 2 steps" in run.stdout and "wrote 3 held-out prompts" in run.stdout
    prompts = [json.loads(line)["prompt"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(prompts) == 3 and all(prompts)
    target = root / "examples" / "demo-pair" / "target"
    built = cli_build(target, tmp_path / "engine", "--lora_dir", tmp_path / "lora", "--speculative_decoding_mode", "draft_tokens_external")
    assert built.exit_code == 0 and "r 4): 42 layers updated" in built.output, built.output


def test_an_adapter_merges_into_a_float_gguf_file_not_into_q4_0_codes(tmp_path):
    pytest.importorskip("gguf")
    from gguf_files import add_bpe_tokenizer, write_gguf

    ckpt = add_bpe_tokenizer(make_checkpoint(tmp_path / "ckpt", tie_word_embeddings=False, hidden_size=128, intermediate_size=256,
                                             vocab_size=320), 320)
    adapted = make_adapter(ckpt, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "gate_proj", "down_proj"])
    f32 = write_gguf(ckpt, tmp_path / "model-f32.gguf")
    got = engine_logits(build_merged(f32, tmp_path / "e", [tmp_path / "adapter"]), ids())  # llama's q/k rows put back first, then merged
    assert (tmp_path / "e" / "tokenizer.json").is_file()  # the file's own tokenizer, kept through the merge
    with torch.no_grad():
        want = adapted(ids()).logits[0].numpy()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
    q4 = write_gguf(ckpt, tmp_path / "model-q4_0.gguf", linear_type="Q4_0")
    result = cli_build(q4, tmp_path / "q4", "--lora_dir", tmp_path / "adapter")
    assert result.exit_code != 0 and "holds int4 (gguf) weights" in result.output, result.output
    assert not (tmp_path / "q4").exists()


def test_bench_and_eval_do_not_compare_a_lora_engine_with_its_base(tmp_path):
    """The engine records the base checkpoint; HF peers on it would run the base model. Refused (bench --compare, eval --test_hf) or
    skipped with a note (eval's default) unless the merged model is given, with which HF's greedy tokens are the engine's."""
    from checkpoints import add_word_tokenizer

    from specdec.cli.bench import main as bench_main
    from specdec.cli.eval import main as eval_main

    ckpt = add_word_tokenizer(make_checkpoint(tmp_path / "ckpt", tie_word_embeddings=False))
    adapted = make_adapter(ckpt, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=LINEAR)
    with torch.no_grad():
        adapted.merge_and_unload().save_pretrained(tmp_path / "merged")
    build_merged(ckpt, tmp_path / "engine", [tmp_path / "adapter"], build=spec_build(max_batch_size=2))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": ids(s)[0, :8].tolist(), "output_len": 8}) + "\n" for s in (1, 2)))
    run = ("run", "--engine_dir", tmp_path / "engine", "--dataset", data, "--method", "none", "--num_threads", 1, "--step_cost_reps", 2,
           "--compare", "--compare_peers", "hf")
    refused = CliRunner().invoke(bench_main, [str(a) for a in run])
    assert refused.exit_code == 1 and "merged LoRA adapters into" in refused.output and "--target_checkpoint" in refused.output, refused.output
    ok = CliRunner().invoke(bench_main, [str(a) for a in (*run, "--target_checkpoint", tmp_path / "merged", "--output_json", tmp_path / "c.json")])
    assert ok.exit_code == 0, ok.output
    [compared] = json.loads((tmp_path / "c.json").read_text())["compare"]
    assert compared["agreement_with_our_target_only"] == {"tokens": 1.0, "sequences": 1.0}  # HF on peft's merge == our merge
    evals = tmp_path / "eval.jsonl"
    evals.write_text('{"prompt": "w5 w9 w13", "reference": "w7"}\n')
    args = ("--engine_dir", tmp_path / "engine", "--dataset", evals, "--max_output_len", 4, "--num_threads", 1)
    skipped = CliRunner().invoke(eval_main, [str(a) for a in args])
    assert skipped.exit_code == 0 and "skipping HF transformers: the engine merged LoRA adapters" in skipped.output, skipped.output
    insisted = CliRunner().invoke(eval_main, [str(a) for a in (*args, "--test_hf")])
    assert insisted.exit_code == 1 and "--test_hf compares with transformers" in insisted.output, insisted.output


def test_prepare_data_from_a_lora_engine_says_heads_need_the_merged_model(tmp_path):
    from checkpoints import add_word_tokenizer

    from specdec.cli.train import main as train_main

    ckpt = add_word_tokenizer(make_checkpoint(tmp_path / "ckpt", tie_word_embeddings=False))
    make_adapter(ckpt, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj"])
    build_merged(ckpt, tmp_path / "engine", [tmp_path / "adapter"])
    (tmp_path / "prompts.txt").write_text("w5 w9 w13\nw7 w8\n")
    result = CliRunner().invoke(train_main, [str(a) for a in ("prepare-data", "--engine_dir", tmp_path / "engine", "--data_path",
                                                              tmp_path / "prompts.txt", "--output_path", tmp_path / "d.jsonl", "--max_token", 4,
                                                              "-q")])
    assert result.exit_code == 0, result.output
    assert "merged LoRA adapters (extra.lora): these answers are the fine-tune's" in result.output
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 2
