"""The ``diloco`` command line: parser, one-line errors, flags and their checks, the commands."""
