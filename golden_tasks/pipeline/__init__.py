"""The pipeline: the graph of stages and their keys (graph: the one place that knows the DAG), a case's
summary row (summary), runtime dirs and their replay (runtime, replay), the in-process runner (runner:
golden_tasks.run), the torchrun program of multi-rank cases (launched) and the isolation forkserver's
preload (_forkserver).

Imports: every layer below (model, storage, project, forms, planning, stages).
"""
