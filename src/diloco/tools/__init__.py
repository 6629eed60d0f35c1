"""The tooling around the milestones: command line, runs and studies, plots, grader,
workspace generator and MPI backend. Nothing here is a milestone; a learner never edits it.

Modules
-------
cli, errors, flags      the ``diloco`` command line and its shared flags
commands, study_command ``compare``, ``train``, ``study``
runs, studies, plots    run folders, ablation studies, PNG plots
grading, grade_verdicts, grade_report, grade_plugin, lessons
                        the milestone grader, its verdicts and output formats, its pytest
                        plugin, the lessons' common mistakes it prints
regions, workspace      solution regions and leak scan; the learner workspace generator
mpi                     DiLoCo as K real MPI processes (``python -m diloco.tools.mpi``)
"""
