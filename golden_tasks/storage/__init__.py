"""The content-addressed store: entries and objects on disk (store: the only module that knows the cache's
layout) and tensors in it (tensors).

Imports: model.
"""
