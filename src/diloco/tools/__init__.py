"""The tooling around the milestones: command line, runs and studies, plots, grader,
workspace generator and MPI backend. Nothing here is a milestone; a learner never edits it.

Modules
-------
cli, errors, flags      the ``diloco`` command line and its shared flags
commands, study_command ``compare``, ``train``, ``study``
runs, studies, plots    run folders, ablation studies, PNG plots
grading, grade_report, grade_plugin
                        the milestone grader, its output formats, its pytest plugin
regions, workspace      solution regions and leak scan; the learner workspace generator
mpi                     DiLoCo as K real MPI processes (``python -m diloco.tools.mpi``)
"""
