"""gpuspeed.decode: a pure-PyTorch Llama engine, real checkpoints (HF safetensors, GGUF) and the decode ladder.

model.py (the decoder and named configs), checkpoints.py (loaders, transformers mapping), cache.py (KV caches),
generate.py (sampling, EOS, generate()), variants.py (V0..V5), kernels/ (V5's GEMV and attention choices),
study.py (measurement, results, plots). Import the submodules; this package imports nothing heavy.
"""
