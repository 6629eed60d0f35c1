"""Studies: ablations, the paper in miniature, the family studies, statistics, tables, plots, results pages."""
