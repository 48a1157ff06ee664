"""Reports of a run: the table and the run's files (report), JUnit XML (junit), the HTML page (html_report)
and the comparison of two runs (runs_compare). Nothing here can change a stage's output: its source is
outside the pipeline version (project.toolchain.pipeline_version).

Imports: every layer below.
"""
