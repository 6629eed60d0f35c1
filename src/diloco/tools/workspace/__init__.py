"""The learner workspace: solution regions and their leak scan, the workspace generator and its template."""
