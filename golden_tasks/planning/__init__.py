"""Planning: a Case and its plan (case), reading a project's kernel modules into plans in a process of
their own (discover, library) and data brought from a directory (data).

Imports: model, storage, project, forms.
"""
