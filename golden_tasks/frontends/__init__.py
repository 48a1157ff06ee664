"""Front ends: doit (doit_tasks, with doit_session, doit_checks and doit_reporter), the `golden-tasks`
command line (cli, watch, scaffold) and the pytest plugin (pytest_plugin). Each walks the pipeline's graph;
none is imported by a layer below.

Imports: every layer below.
"""
