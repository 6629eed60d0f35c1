"""The milestone grader: the wave loop, the pytest plugin, verdicts, reports, the lessons' mistakes."""
