"""The tooling around the milestones, by concern. Nothing here is a milestone; a learner never edits it.

Subpackages
-----------
cli        the ``diloco`` command line: parser, flags and their checks, the commands, the MPI command
runs       run folders, atomic files, the run lock and record, checkpoints, resume, the resumable driver
studies    ablations, the paper in miniature, the family studies, statistics, tables, plots, results pages
grading    the milestone grader: waves, the pytest plugin, verdicts, reports, the lessons' mistakes
sandbox    the grader's sandbox: the allow-list root, the worker process, the plain-data wire
workspace  solution regions and the leak scan; the learner workspace generator and its template
"""
