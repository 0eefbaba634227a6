"""`perfscope tune`: search a stage's declared configurations, shape by shape, against cuBLAS.

    space.py       configurations of a KernelSpec's SearchSpace and the limits that prune them
    compiling.py   NVRTC in a process pool (the cubin cache makes reruns free)
    strategies.py  exhaustive, random and Bayesian (optuna) search
    tasks.py       what travels to a GPU worker and back, as plain JSON-ready values
    worker.py      the process that verifies and times on one GPU (never loads ncu's reader)
    executors.py   one local worker per visible GPU, or Ray tasks with num_gpus=1
    store.py       the SQLite store every result is written to as it arrives
    workflow.py    plan, compile and prune, search, confirm, profile, the document
    profiled.py    the child process that profiles best and worst under ncu and diffs them

This package is kept free of imports at its top so ``perfscope.tune.store`` (what
``bench --config best`` reads) loads nothing heavy.
"""
