"""What a grammar costs per token, against what a target step costs: structured outputs must stay cheap.

    python benchmarks/bench_grammar.py --engine_dir /tmp/serve-demo/target [--repeats 5]

For a JSON schema, a regular expression and "any JSON object", it decodes a
constrained greedy output and times, per generated token, the grammar's part
of the logits processing (llguidance's mask, unpacked and applied: the
processing chain with the grammar minus the same chain without it), beside a
target step of one token at batch 1 on the same engine. Each figure is the
median over the tokens of the outputs of ``--repeats`` runs, with the 10th and
90th percentiles.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from specdec.formats.engine_format import load_engine_dir
from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.grammar import GrammarCompiler, GrammarSpec
from specdec.runtime.loading import load_engine
from specdec.runtime.logits import LogitsProcessor
from specdec.runtime.request import GenerationConfig
from specdec.runtime.sampling import SamplingConfig

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
SPECS = {"json_schema": GrammarSpec("json_schema", PERSON), "regex": GrammarSpec("regex", r"[a-z]{1,12}(, [a-z]{1,12}){0,6}\."),
         "json_object": GrammarSpec("json_object")}


def pct(xs: list[float]) -> str:
    a = np.array(xs) * 1e6
    return f"{np.median(a):8.1f} us  (p10 {np.percentile(a, 10):.1f}, p90 {np.percentile(a, 90):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine_dir", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max_tokens", type=int, default=48)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import host

    print("machine:", host.describe(host.host_record(bandwidth=False)))
    engine = load_engine(args.engine_dir, num_threads=1)
    tok = Tokenizer(load_engine_dir(args.engine_dir).path)
    eos = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    t0 = time.perf_counter()
    compiler = GrammarCompiler(tok.to_json(), engine.target.vocab_size, eos)
    print(f"llguidance tokenizer: {(time.perf_counter() - t0) * 1e3:.1f} ms once per server (vocabulary {engine.target.vocab_size})")
    prompt = tok.encode("# a person as JSON\n", add_special_tokens=False)
    # a target step: one token, batch 1
    steps = []
    for _ in range(args.repeats):
        cfg = GenerationConfig(max_output_len=args.max_tokens, end_ids=(), method="none", draft_len=0)
        rid = engine.add_request(prompt, cfg)
        engine.step()  # the prefill
        while engine.has_unfinished():
            t = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t)
        del rid
    print(f"{'target step (1 token, batch 1)':32s} {pct(steps)}")
    for name, spec in SPECS.items():
        t = time.perf_counter()
        grammar = compiler.compile(spec)
        compile_ms = (time.perf_counter() - t) * 1e3
        masked, plain, n_tokens = [], [], 0
        for r in range(args.repeats):
            cfg = GenerationConfig(max_output_len=args.max_tokens, end_ids=eos, method="none", draft_len=0, grammar=grammar,
                                   sampling=SamplingConfig(temperature=0.8, random_seed=r))
            rid = engine.add_request(prompt, cfg)
            outs = []
            while engine.has_unfinished():
                outs += [o for o in engine.step() if o.finished]
            ids = outs[0].output_ids
            n_tokens += len(ids)
            # replay the output, timing the chain with and without the grammar at each position
            with_g = LogitsProcessor(cfg.sampling, prompt, grammar.start())
            without = LogitsProcessor(SamplingConfig(temperature=0.8, presence_penalty=1e-9), prompt)  # the same chain, no grammar
            row = np.random.default_rng(0).normal(size=engine.target.vocab_size).astype(np.float32)
            for t_id in ids:
                t = time.perf_counter()
                with_g.logits(row)
                masked.append(time.perf_counter() - t)
                t = time.perf_counter()
                without.logits(row)
                plain.append(time.perf_counter() - t)
                with_g.commit([t_id])
                without.commit([t_id])
            del rid
        cost = [m - p for m, p in zip(masked, plain, strict=False)]
        print(f"{name + ' mask':32s} {pct(cost)}   (compile {compile_ms:.1f} ms, {n_tokens} tokens)")
    print("mask: llguidance's mask for the position, unpacked and applied to the logits (the chain with the grammar minus without it)")


if __name__ == "__main__":
    main()
