"""The model: what golden-tasks talks about, as plain types with no behaviour beyond themselves. A plan and
its bench settings (plan), parameter specs (specs), the rows of a parameter table and of the specs' signature
(rows), what each stage outputs (outputs), verdicts and the records of a run (verdicts, records), the
comparators and the validation policy (compare), errors, content hashing, and where things are in the user's
source (origin).

Imports: nothing of golden_tasks outside this layer.
"""
