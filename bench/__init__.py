"""specdec.bench: measuring engines, beside the runtime rather than in it.

    datasets.py   requests as JSON lines (TensorRT-LLM's prepare_dataset semantics)
    sweep.py      run_sweep: target-only and every drafting method, speedups, the analytic bound
    peers.py      other runtimes on the same checkpoints: transformers, onnxruntime-genai, llama.cpp

specdec-bench and specdec-eval (cli/) are their command-line faces. A serving
host needs none of it: runtime/ keeps only what runs an engine.
"""
