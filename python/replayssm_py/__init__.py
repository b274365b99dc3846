"""Python side of replayssm: what the scripts in scripts/ and the tests share.

Modules follow the data flow text -> tokens -> model -> logits -> KL -> HDF5 -> plots:

    text           Project Gutenberg stripping ("gutenberg-v1") and the FNV-1a text hash, the same
                   steps as src/io/text_source.cpp
    tokenize_text  token folders for `replayssm kl-sweep --tokens-dir` (bytes or a tokenizer.json)
    train          training the bundled byte-level models (needs the `train` extra: torch, transformers)
    goldens        the format goldens (from `formats`) and the tiny transformers goldens
    formats        an independent numpy + ml_dtypes model of the number formats (Philox, RTN, SR,
                   NVFP4, FP8 block-128)
    results        reading kl-sweep result files (HDF5 schema in docs/KL_SWEEP.md), policy names
    tables         the RTN-vs-SR table (paper table 11)
    plot           figures: KL vs length, window sweep (needs matplotlib)
    bench          flash-linear-attention decode timings (needs the `bench` extra, a GPU)
    files          atomic writes (temporary, fsync, rename) for every output
"""
