"""The process around a run: the ``diloco`` command's signal handling (``stop_signals``).

Standard library only, imported by the first line of ``diloco/__init__.py``; nothing here is a
milestone, and nothing here imports the tools.
"""
